"""Broker settings read at start, and the Java forms error remarks quote."""

from __future__ import annotations

import pytest

from idemp.broker.config import ConfigError, load_config
from idemp.broker.metadata import TopicConfig, perm_string


def test_property_filter_is_a_setting_of_its_own() -> None:
    assert load_config(None).enablePropertyFilter is False  # RocketMQ's default
    assert load_config(None, {"enablePropertyFilter": " TRUE "}).enablePropertyFilter is True
    with pytest.raises(ConfigError, match="enablePropertyFilter: 'yes' is not true or false"):
        load_config(None, {"enablePropertyFilter": "yes"})


def test_topic_config_reads_as_java_prints_it() -> None:
    cfg = TopicConfig("T1", readQueueNums=4, writeQueueNums=2, perm=6)
    assert str(cfg) == (
        "TopicConfig [topicName=T1, readQueueNums=4, writeQueueNums=2, perm=RW-, "
        "topicFilterType=SINGLE_TAG, topicSysFlag=0, order=false]"
    )
    assert [perm_string(p) for p in (0, 1, 2, 4, 7)] == ["---", "--X", "-W-", "R--", "RWX"]

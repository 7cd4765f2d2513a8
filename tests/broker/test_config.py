"""Broker settings read at start, and the Java forms error remarks quote."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from idemp.broker.admin_config import config_lines
from idemp.broker.config import BrokerConfig, ConfigError, load_config
from idemp.broker.metadata import GroupTable, TopicConfig, perm_string
from idemp.broker.rocketmq_defaults import BODY_ORDER, NAMESRV_BODY_ORDER, namesrv_settings


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


def test_get_broker_config_lists_rocketmqs_settings_in_its_order_then_idemps_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """mqadmin getBrokerConfig prints a Properties map built from the answer's lines; keys
    sharing a bucket print in the order they came, so RocketMQ's order in the answer
    makes mqadmin print RocketMQ's settings in RocketMQ 4.9.7's order (compared with a
    4.9.7 broker: the same order, idemp's own settings interleaved)."""
    monkeypatch.setenv("ROCKETMQ_HOME", "/opt/rocketmq")
    keys = [line.split("=", 1)[0] for line in config_lines(BrokerConfig()).splitlines()]
    assert keys[: len(BODY_ORDER)] == list(BODY_ORDER)
    assert set(keys[len(BODY_ORDER) :]) == {
        "aclPlainFile",
        "bindAddress",
        "diskSpaceWarningLevelRatio",
        "embeddedNamesrv",
        "enableMixedMessageType",
        "grpcClientIdleTimeMills",
        "grpcServerPort",
        "grpcTransactionCheckInterval",
        "minInvisibleTimeMillsForRecv",
        "popFromRetryProbability",
        "rebalanceLockMaxLiveTime",
        "recallMessageEnable",
        "transactionDataExpireMillis",
    }


def test_get_namesrv_config_lists_the_settings_in_rocketmqs_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ROCKETMQ_HOME", "/opt/rocketmq")
    assert list(namesrv_settings("9876", "kv.json", "ns.properties")) == list(NAMESRV_BODY_ORDER)
    monkeypatch.delenv("ROCKETMQ_HOME")
    assert list(namesrv_settings("9876", "kv.json", "ns.properties")) == [
        k for k in NAMESRV_BODY_ORDER if k != "rocketmqHome"
    ]


def test_a_group_file_field_that_does_not_convert_keeps_its_default(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before requests were read as fastjson reads them, idemp stored what a request gave
    (``"abc"`` for a number, say): such a file still loads, that field at its default,
    said once; a number given as text is read as fastjson reads it."""
    path = tmp_path / "subscriptionGroup.json"
    table = {
        "G1": {"groupName": "G1", "retryMaxTimes": "abc", "consumeEnable": "false"},
        "G2": {"groupName": "G2", "retryMaxTimes": "3"},
    }
    path.write_text(json.dumps({"subscriptionGroupTable": table}))
    groups = GroupTable(path, auto_create=lambda: True).groups
    assert (groups["G1"].retryMaxTimes, groups["G1"].consumeEnable) == (16, False)
    assert groups["G2"].retryMaxTimes == 3
    assert [r.getMessage() for r in caplog.records] == [
        "group 'G1': retryMaxTimes='abc' is no int; its default kept"
    ]

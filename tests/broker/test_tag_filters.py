"""Which messages a pull's tag subscription lets through, as RocketMQ 4.9.7 decides it.

A subscription a heartbeat registered is kept as the client sent it: the pull matches
its codeSet, and every message only when subString is exactly "*" (ConsumerGroupInfo
keeps it, ExpressionMessageFilter reads the codes). One a pull carries is parsed by
FilterAPI.build: pieces between "||", trimmed, empty ones dropped, so " " names no tag
and matches nothing. Run against RocketMQ 4.9.7 with IDEMP_4X_REAL, same answers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from idemp.broker.process import BrokerProcess
from idemp.remoting import (
    RemotingCommand,
    RequestCode,
    ResponseCode,
    decode_messages,
    java_string_hash,
)
from tests.realbroker import broker_of

from .rawclient import RawClient

HERE = Path(__file__)  # which suite: IDEMP_4X_REAL swaps this suite's brokers
TOPIC = "TagFilters"
SENT = ["TagA", "TagB", "TagA", "TagB", None]  # queue offsets 0..4


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with broker_of(tmp_path_factory.mktemp("tags") / "store", None, HERE) as b:
        with RawClient(b.broker_addr) as c:
            assert c.create_topic(TOPIC, 1).code == 0
            for i, tag in enumerate(SENT):
                props = {"TAGS": tag} if tag else {}
                assert c.send_message(TOPIC, f"m{i}".encode(), props, queue_id=0).code == 0
            c.indexed(TOPIC, 0, len(SENT))
        yield b


def _pulled(answer: RemotingCommand) -> tuple[int, list[int]]:
    """The answer's code and the queue offsets of the messages it carries."""
    found = [m.queue_offset for m in decode_messages(answer.body)] if answer.code == 0 else []
    return answer.code, found


@pytest.mark.parametrize(
    ("group", "sub_string", "code_set", "expected"),
    [
        ("GAll", "*", [], (ResponseCode.SUCCESS, [0, 1, 2, 3, 4])),
        ("GTagA", "TagA", None, (ResponseCode.SUCCESS, [0, 2])),
        # the codes decide, not the text
        ("GCodes", "TagA", [java_string_hash("TagB")], (ResponseCode.SUCCESS, [1, 3])),
        ("GNoCodes", "TagA", [], (ResponseCode.PULL_RETRY_IMMEDIATELY, [])),
        # what the Java client sends for subscribe(topic, " ") and "|| ||": no tag
        ("GBlank", " ", None, (ResponseCode.PULL_RETRY_IMMEDIATELY, [])),
        ("GBars", "|| ||", None, (ResponseCode.PULL_RETRY_IMMEDIATELY, [])),
        ("GStar", " * ", None, (ResponseCode.PULL_RETRY_IMMEDIATELY, [])),
    ],
)
def test_a_heartbeat_subscription_filters_by_the_codes_the_client_sent(
    broker: BrokerProcess,
    group: str,
    sub_string: str,
    code_set: list[int] | None,
    expected: tuple[int, list[int]],
) -> None:
    with RawClient(broker.broker_addr) as c:
        beat = c.heartbeat(
            "tag-client", [group], topic=TOPIC, sub_string=sub_string, code_set=code_set
        )
        assert beat.code == 0
        answer = c.pull(TOPIC, 0, 0, group=group, sys_flag=0, suspend_ms=0)
    assert _pulled(answer) == expected


@pytest.mark.parametrize(
    ("subscription", "expression_type", "expected"),
    [
        ("TagA || TagB", None, (ResponseCode.SUCCESS, [0, 1, 2, 3])),
        (" TagA ", None, (ResponseCode.SUCCESS, [0, 2])),
        ("", None, (ResponseCode.SUCCESS, [0, 1, 2, 3, 4])),
        (" ", None, (ResponseCode.PULL_RETRY_IMMEDIATELY, [])),
        (" * ", None, (ResponseCode.PULL_RETRY_IMMEDIATELY, [])),
        ("|| ||", None, (ResponseCode.PULL_RETRY_IMMEDIATELY, [])),
        ("||", None, (ResponseCode.SUBSCRIPTION_PARSE_FAILED, [])),
        # "": not TAG to FilterAPI.build (no codes), a tag type to the filter
        ("TagA", "", (ResponseCode.PULL_RETRY_IMMEDIATELY, [])),
        ("*", "", (ResponseCode.SUCCESS, [0, 1, 2, 3, 4])),
        ("", "", (ResponseCode.SUBSCRIPTION_PARSE_FAILED, [])),
    ],
)
def test_a_pulls_own_subscription_is_parsed_as_filter_api_parses_it(
    broker: BrokerProcess,
    subscription: str,
    expression_type: str | None,
    expected: tuple[int, list[int]],
) -> None:
    with RawClient(broker.broker_addr) as c:
        answer = c.pull(
            TOPIC,
            0,
            0,
            group="GTagsPull",
            subscription=subscription,
            expression_type=expression_type,
            suspend_ms=0,
        )
    assert _pulled(answer) == expected


def test_a_pull_flagged_with_a_subscription_it_does_not_carry_takes_every_message(
    broker: BrokerProcess,
) -> None:
    """FilterAPI.build with a null expression: every message, no heartbeat needed."""
    ext = {
        "consumerGroup": "GTagsNoSub",
        "topic": TOPIC,
        "queueId": 0,
        "queueOffset": 0,
        "maxMsgNums": 32,
        "sysFlag": 4,
        "commitOffset": 0,
        "suspendTimeoutMillis": 0,
        "subVersion": 0,
    }
    with RawClient(broker.broker_addr) as c:
        answer = c.request(RequestCode.PULL_MESSAGE, ext)
    assert _pulled(answer) == (ResponseCode.SUCCESS, [0, 1, 2, 3, 4])

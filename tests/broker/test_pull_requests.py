"""A pull and what decides it, as RocketMQ 4.9.7 has them: its header, its tag subscription,
the broker it suggests next, the retry topic a consumer's heartbeat creates.

The header is a FastCodesHeader: every number in it is parsed, used or not, and one
that does not parse fails the pull with Java's NumberFormatException; a number that is
absent fails only where it is read.

A subscription a heartbeat registered is kept as the client sent it: the pull matches
its codeSet, and every message only when subString is exactly "*" (ConsumerGroupInfo
keeps it, ExpressionMessageFilter reads the codes). One a pull carries is parsed by
FilterAPI.build: pieces between "||", trimmed, empty ones dropped, so " " names no tag
and matches nothing. Run against RocketMQ 4.9.7 with IDEMP_4X_REAL, same answers."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
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


NUMBER_FORMAT = (
    'java.lang.NumberFormatException: For input string: "{}", '
    "java.base/java.lang.NumberFormatException.forInputString(NumberFormatException.java:67)"
)


def _pull_header(**over: object) -> dict[str, object]:
    ext: dict[str, object] = {
        "consumerGroup": "GTagsHeader",
        "topic": TOPIC,
        "queueId": 0,
        "queueOffset": 0,
        "maxMsgNums": 32,
        "sysFlag": 4,
        "commitOffset": 0,
        "suspendTimeoutMillis": 0,
        "subscription": "*",
        "subVersion": 0,
    }
    ext.update(over)
    return {k: v for k, v in ext.items() if v is not None}


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
    header = _pull_header(consumerGroup="GTagsNoSub", subscription=None)
    with RawClient(broker.broker_addr) as c:
        answer = c.request(RequestCode.PULL_MESSAGE, header)
    assert _pulled(answer) == (ResponseCode.SUCCESS, [0, 1, 2, 3, 4])


@pytest.mark.parametrize(
    ("over", "expected"),
    [
        # not read without their flags: absent is fine
        ({"commitOffset": None, "suspendTimeoutMillis": None, "subVersion": None}, None),
        # parsed all the same: what does not parse fails the pull
        ({"subVersion": "v"}, "v"),
        ({"commitOffset": "zz"}, "zz"),
        ({"queueId": "2147483648"}, "2147483648"),
        ({"maxMsgNums": "1.5"}, "1.5"),
        ({"sysFlag": ""}, ""),
    ],
)
def test_every_number_of_a_pulls_header_is_parsed_and_only_what_is_read_must_be_there(
    broker: BrokerProcess, over: dict[str, object], expected: str | None
) -> None:
    with RawClient(broker.broker_addr) as c:
        answer = c.request(RequestCode.PULL_MESSAGE, _pull_header(**over))
    if expected is None:
        assert _pulled(answer) == (ResponseCode.SUCCESS, [0, 1, 2, 3, 4])
    else:
        assert (answer.code, answer.remark) == (
            ResponseCode.SYSTEM_ERROR,
            NUMBER_FORMAT.format(expected),
        )


def test_a_negative_message_count_fails_where_the_store_reads(broker: BrokerProcess) -> None:
    """getMessage sizes its lists by maxMsgNums when the offset is inside the queue
    (ArrayList refuses a negative capacity); 0 still takes one message, and at the
    queue's end nothing is read."""
    with RawClient(broker.broker_addr) as c:
        inside = c.request(RequestCode.PULL_MESSAGE, _pull_header(maxMsgNums=-1))
        none = c.request(RequestCode.PULL_MESSAGE, _pull_header(maxMsgNums=0))
        at_end = c.request(RequestCode.PULL_MESSAGE, _pull_header(maxMsgNums=-5, queueOffset=5))
    assert (inside.code, inside.remark) == (
        ResponseCode.SYSTEM_ERROR,
        "java.lang.IllegalArgumentException: Illegal Capacity: -1, "
        "java.base/java.util.ArrayList.<init>(ArrayList.java:160)",
    )
    assert _pulled(none) == (ResponseCode.SUCCESS, [0])
    assert at_end.code == ResponseCode.PULL_NOT_FOUND


def test_with_slave_reads_a_pull_suggests_the_groups_broker(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """PullMessageProcessor with slaveReadEnable: the group's brokerId (a Java consumer
    then pulls from that slave, when there is one); without it, always the master."""
    broker = make_broker(slaveReadEnable="true")
    with RawClient(broker.broker_addr) as c:
        assert c.create_topic("TSlaveRead", 1).code == 0
        assert c.send_message("TSlaveRead", b"m", queue_id=0).code == 0
        c.indexed("TSlaveRead", 0, 1)
        suggested = {}
        for group, broker_id in (("GSlave1", 1), ("GSlave3", 3), ("GMaster", 0)):
            assert c.create_group(group, brokerId=broker_id).code == 0
            answer = c.pull("TSlaveRead", 0, 0, group=group, suspend_ms=0)
            suggested[group] = (answer.code, answer.ext_fields["suggestWhichBrokerId"])
    assert suggested == {"GSlave1": (0, "1"), "GSlave3": (0, "3"), "GMaster": (0, "0")}


def test_a_unit_mode_consumer_gets_a_retry_topic_with_the_unit_subscription_flag(
    broker: BrokerProcess,
) -> None:
    """ClientManageProcessor.heartBeat creates the group's retry topic with
    TopicSysFlag.buildSysFlag(false, true) for a unit-mode consumer."""
    with RawClient(broker.broker_addr) as c:
        assert c.heartbeat("unit-client", ["GUnit"], topic=TOPIC, unit_mode=True).code == 0
        assert c.heartbeat("plain-client", ["GPlain"], topic=TOPIC).code == 0
        table = json.loads(c.request(RequestCode.GET_ALL_TOPIC_CONFIG, {}).body)
    flags = {
        t: table["topicConfigTable"][t]["topicSysFlag"] for t in ("%RETRY%GUnit", "%RETRY%GPlain")
    }
    assert flags == {"%RETRY%GUnit": 2, "%RETRY%GPlain": 0}

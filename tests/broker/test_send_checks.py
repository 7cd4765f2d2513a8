"""A send's header, properties and batch body checked as RocketMQ 4.9.7's
SendMessageProcessor and store check them, measured side by side with raw requests
(run on RocketMQ itself with IDEMP_4X_REAL): what is stored as it comes, what is refused
and in which words, and which answers carry the broker's region and trace switch.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from idemp.broker.process import BrokerProcess
from idemp.remoting import (
    MessageExt,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    encode_properties,
    parse_offset_msg_id,
)
from tests.realbroker import broker_of

from .rawclient import RawClient, batch_body

HERE = Path(__file__)  # which suite: IDEMP_4X_REAL swaps this suite's brokers

NUMBER_FORMAT = (
    'java.lang.NumberFormatException: For input string: "{}", '
    "java.base/java.lang.NumberFormatException.forInputString(NumberFormatException.java:67)"
)
REGION = {"TRACE_ON": "true", "MSG_REGION": "DefaultRegion"}
ILLEGAL = (
    "the message is illegal, maybe msg body or properties length not matched. "
    "msg body length limit 4194304B, msg properties length limit 32KB."
)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with broker_of(tmp_path_factory.mktemp("sendchecks") / "store", None, HERE) as b:
        yield b


@pytest.fixture
def client(broker: BrokerProcess) -> Iterator[RawClient]:
    with RawClient(broker.broker_addr) as c:
        yield c


def _v2(topic: str, **over: object) -> dict[str, object]:
    ext: dict[str, object] = {
        "a": "PG",
        "b": topic,
        "c": "TBW102",
        "d": 4,
        "e": 0,
        "f": 0,
        "g": int(time.time() * 1000),
        "h": 0,
        "i": "",
        "j": 0,
        "k": "false",
        "m": "true",
    }
    ext.update(over)
    return ext


def _stored(c: RawClient, answer: RemotingCommand) -> list[MessageExt]:
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    return [c.view(parse_offset_msg_id(i)[1]) for i in answer.ext_fields["msgId"].split(",")]


def _next_offset(c: RawClient, topic: str) -> int:
    """The queue offset a plain send to queue 0 gets: how many the queue held before."""
    answer = c.send_message(topic, b"probe")
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    return int(answer.ext_fields["queueOffset"])


def _entry(
    body: bytes = b"x",
    props: bytes = b"a\x01b",
    *,
    total: int | None = None,
    body_len: int | None = None,
    props_len: int | None = None,
) -> bytes:
    """One batch entry, its length fields as given (the real ones by default)."""
    size = 20 + len(body) + 2 + len(props) if total is None else total
    head = struct.pack(">iiiii", size, 0, 0, 0, len(body) if body_len is None else body_len)
    return head + body + struct.pack(">h", len(props) if props_len is None else props_len) + props


def test_refusals_carry_the_region_and_trace_switch_but_thrown_ones_do_not(
    client: RawClient,
) -> None:
    """preSend builds the response with MSG_REGION and TRACE_ON before msgCheck, and
    every refusal after it is that response; an exception's answer is a new one."""
    assert client.create_topic("SC_Region", 1).code == 0
    refusals = [
        client.send_message("SC bad", b"x"),
        client.send_message("SCHEDULE_TOPIC_XXXX", b"x"),
        client.send_message("SC_Region", b"x", queue_id=5),
        client.send_message("SC_Region", b"x" * (4 * 1024 * 1024 + 1)),
        client.request(RequestCode.SEND_BATCH_MESSAGE, _v2("SC_Region", f=4), _entry()),
    ]
    assert [r.code for r in refusals] == [1, 16, 1, 13, 13]
    for refused in refusals:
        assert refused.ext_fields == REGION, refused.remark
    thrown = client.request(RequestCode.SEND_MESSAGE_V2, _v2("SC_Region", m="false", d="x"))
    assert (thrown.code, thrown.remark) == (1, NUMBER_FORMAT.format("x"))
    assert thrown.ext_fields == {}


@pytest.mark.parametrize(
    "field, value", [("d", "abc"), ("e", " 1"), ("e", "2147483648"), ("h", "")]
)
def test_v2_numbers_parse_as_java_parses_them(client: RawClient, field: str, value: str) -> None:
    """SendMessageRequestHeaderV2.decode: Integer.parseInt, whose NumberFormatException
    is the answer (no blanks, 32 bits, an empty string no number)."""
    answer = client.request(RequestCode.SEND_MESSAGE_V2, _v2("SC_V2", m="false", **{field: value}))
    assert (answer.code, answer.remark) == (1, NUMBER_FORMAT.format(value))


def test_v2_reads_its_one_letter_keys_only(client: RawClient) -> None:
    long_names = {
        "producerGroup": "PG",
        "topic": "SC_Long",
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": 4,
        "queueId": 0,
        "sysFlag": 0,
        "bornTimestamp": int(time.time() * 1000),
        "flag": 0,
    }
    for code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
        answer = client.request(code, long_names, b"x")
        assert (answer.code, answer.remark) == (1, "The specified topic is blank.")


def test_v1_takes_what_does_not_parse_as_missing_and_goes_on_where_it_can(
    client: RawClient,
) -> None:
    """SEND_MESSAGE's header decoding catches each field's error and leaves it null:
    an unparsable reconsumeTimes is 0, an unparsable maxReconsumeTimes the group's, and
    the producer group and, for a topic that exists, the default topic are not needed."""
    assert client.create_topic("SC_V1", 1).code == 0
    header = {
        "topic": "SC_V1",
        "queueId": 0,
        "sysFlag": 0,
        "bornTimestamp": int(time.time() * 1000),
        "flag": 0,
        "properties": encode_properties({"UNIQ_KEY": "SC-V1"}),
        "reconsumeTimes": "x",
    }
    (stored,) = _stored(client, client.request(RequestCode.SEND_MESSAGE, header, b"v1"))
    assert (stored.topic, stored.reconsume_times, stored.body) == ("SC_V1", 0, b"v1")
    retry = client.send_message(
        "%RETRY%SC_G", b"r", extra={"reconsumeTimes": 3, "maxReconsumeTimes": "x"}
    )
    (stored,) = _stored(client, retry)
    assert (stored.topic, stored.reconsume_times) == ("%RETRY%SC_G", 3)  # under 16: kept
    refused = client.send_message("SC_V1", b"q", extra={"queueId": " 1"})
    assert refused.code == ResponseCode.SYSTEM_ERROR  # a null queueId: no queue taken
    assert _next_offset(client, "SC_V1") == 1


def test_a_default_queue_count_of_zero_creates_a_topic_no_send_reaches(
    client: RawClient,
) -> None:
    """createTopicInSendMessageMethod takes the smaller count, raising only a negative
    one to 0; a queue asked for is then illegal, and a random one divides by zero."""
    named = client.send_message("SC_Zero", b"x", extra={"defaultTopicQueueNums": 0})
    assert named.code == ResponseCode.SYSTEM_ERROR
    assert (named.remark or "").startswith(
        "request queueId[0] is illegal, TopicConfig [topicName=SC_Zero, readQueueNums=0, "
        "writeQueueNums=0, perm=RW-, topicFilterType=SINGLE_TAG, topicSysFlag=0, order=false]"
    )
    anyone = client.send_message("SC_Zero", b"x", queue_id=-1)
    assert (anyone.code, anyone.remark) == (
        ResponseCode.SYSTEM_ERROR,
        "java.lang.ArithmeticException: / by zero, org.apache.rocketmq.broker.processor"
        ".SendMessageProcessor.randomQueueId(SendMessageProcessor.java:689)",
    )


def test_a_unit_mode_send_marks_the_topics_it_creates(client: RawClient) -> None:
    for topic in ("SC_Unit", "%RETRY%SC_Unit"):
        assert client.send_message(topic, b"u", extra={"unitMode": "true"}).code == 0
    answer = client.request(RequestCode.GET_ALL_TOPIC_CONFIG, {})
    table = json.loads(answer.body)["topicConfigTable"]
    assert (table["SC_Unit"]["topicSysFlag"], table["%RETRY%SC_Unit"]["topicSysFlag"]) == (1, 2)


def test_a_delay_level_that_is_not_a_number_is_refused_and_nothing_stored(
    client: RawClient,
) -> None:
    assert client.create_topic("SC_Delay", 1).code == 0
    for level in ("abc", " 2", "99999999999"):
        answer = client.send_message("SC_Delay", b"d", {"DELAY": level})
        assert (answer.code, answer.remark) == (1, NUMBER_FORMAT.format(level))
    assert _next_offset(client, "SC_Delay") == 0


def test_a_delivery_time_property_is_only_a_property_on_a_remoting_send(
    client: RawClient,
) -> None:
    """RocketMQ 4.9.7 has no timer: TIMER_DELIVER_MS is kept and the message is in its
    topic at once (RocketMQ 5's timer serves the 5.x clients here)."""
    assert client.create_topic("SC_Timer", 1).code == 0
    at = str(int(time.time() * 1000) + 60_000)
    answer = client.send_message("SC_Timer", b"t", {"TIMER_DELIVER_MS": at})
    (stored,) = _stored(client, answer)
    assert (stored.topic, stored.properties["TIMER_DELIVER_MS"]) == ("SC_Timer", at)
    assert answer.ext_fields["queueOffset"] == "0"
    assert client.indexed("SC_Timer", 0, 1) == 1


def test_a_batch_is_stored_as_it_comes_its_entries_delays_and_flags_unread(
    client: RawClient,
) -> None:
    """Only the batch's own sysFlag and DELAY refuse it (CommitLog.asyncPutMessages);
    an entry's DELAY or TRAN_MSG is stored as text, a retry topic takes a batch with no
    group check, and the header's reconsumeTimes is every entry's."""
    assert client.create_topic("SC_Batch", 1).code == 0
    body = batch_body([(b"d", {"DELAY": "2"}), (b"t", {"TRAN_MSG": "true"})])
    stored = _stored(client, client.request(RequestCode.SEND_BATCH_MESSAGE, _v2("SC_Batch"), body))
    assert [(m.topic, m.body) for m in stored] == [("SC_Batch", b"d"), ("SC_Batch", b"t")]
    assert (stored[0].properties["DELAY"], stored[1].properties["TRAN_MSG"]) == ("2", "true")
    retried = client.request(
        RequestCode.SEND_BATCH_MESSAGE, _v2("%RETRY%SC_NoSuchGroup", j=3), batch_body([(b"r", {})])
    )
    (stored_retry,) = _stored(client, retried)
    assert (stored_retry.topic, stored_retry.reconsume_times) == ("%RETRY%SC_NoSuchGroup", 3)
    one = batch_body([(b"x", {})])
    for header in (_v2("SC_Batch", i="DELAY\x012\x02"), _v2("SC_Batch", f=4), _v2("SC_Batch", f=8)):
        answer = client.request(RequestCode.SEND_BATCH_MESSAGE, header, one)
        assert (answer.code, answer.remark) == (ResponseCode.MESSAGE_ILLEGAL, ILLEGAL)
    answer = client.request(
        RequestCode.SEND_BATCH_MESSAGE, _v2("SC_Batch", i="DELAY\x01x\x02"), one
    )
    assert (answer.code, answer.remark) == (1, NUMBER_FORMAT.format("x"))


UNDERFLOW = (
    "java.nio.BufferUnderflowException, java.base/java.nio.Buffer.nextGetIndex(Buffer.java:707)"
)
BODY_ERRORS: list[tuple[str, bytes, str]] = [
    (
        "empty",
        b"",
        "java.lang.NullPointerException: Cannot read the array length because the return "
        'value of "org.apache.rocketmq.common.message.MessageExtBatch.getBody()" is null, '
        "org.apache.rocketmq.store.DefaultMessageStore.checkMessages(DefaultMessageStore.java:391)",
    ),
    (
        "short",
        b"\0\0\0",
        UNDERFLOW,
    ),
    (
        "trailing",
        _entry() + b"\0",
        UNDERFLOW,
    ),
    (
        "body-past-end",
        _entry(body_len=99),
        "java.lang.ArrayIndexOutOfBoundsException, "
        "java.base/java.util.zip.CRC32.update(CRC32.java:77)",
    ),
    (
        "properties-past-end",
        _entry(props_len=100),
        "java.lang.IllegalArgumentException: newPosition > limit: (123 > 26), "
        "java.base/java.nio.Buffer.createPositionException(Buffer.java:341)",
    ),
    (
        "properties-before-start",
        _entry(props_len=-30),
        "java.lang.IllegalArgumentException: newPosition < 0: (-7 < 0), "
        "java.base/java.nio.Buffer.createPositionException(Buffer.java:341)",
    ),
]


@pytest.mark.parametrize(
    "body, remark", [c[1:] for c in BODY_ERRORS], ids=[c[0] for c in BODY_ERRORS]
)
def test_a_batch_body_fails_as_the_stores_encoder_walks_it(
    client: RawClient, body: bytes, remark: str
) -> None:
    answer = client.request(RequestCode.SEND_BATCH_MESSAGE, _v2("SC_BatchBody"), body)
    assert (answer.code, answer.remark, answer.ext_fields) == (1, remark, {})


def test_a_batch_entrys_total_size_is_never_read(client: RawClient) -> None:
    body = _entry(b"a", total=999) + _entry(b"b", total=5)
    stored = _stored(client, client.request(RequestCode.SEND_BATCH_MESSAGE, _v2("SC_Size"), body))
    assert [(m.body, m.properties["a"]) for m in stored] == [(b"a", "b"), (b"b", "b")]


def test_turning_group_auto_creation_off_at_run_time_applies_at_once(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """SubscriptionGroupManager reads the setting at every look-up."""
    broker = make_broker()
    with RawClient(broker.broker_addr) as c:
        assert c.send_message("%RETRY%SC_Before", b"x").code == 0
        assert c.update_broker_config(autoCreateSubscriptionGroup="false").code == 0
        answer = c.send_message("%RETRY%SC_After", b"x")
        assert (answer.code, answer.remark) == (
            ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
            "subscription group not exist, SC_After \n"
            "See http://rocketmq.apache.org/docs/faq/ for further details.",
        )


@pytest.mark.idemp_only(
    "RocketMQ 4.9.7 stores such an entry with its properties length wrapped negative: "
    "a record no one can read back (measured), so idemp refuses the batch instead"
)
def test_a_batch_with_an_entry_whose_stored_properties_overflow_stores_nothing(
    client: RawClient,
) -> None:
    assert client.create_topic("SC_Overflow", 1).code == 0
    body = batch_body([(b"fine", {}), (b"long", {"p": "x" * 32_760})])
    answer = client.request(RequestCode.SEND_BATCH_MESSAGE, _v2("SC_Overflow"), body)
    assert (answer.code, answer.remark) == (ResponseCode.MESSAGE_ILLEGAL, ILLEGAL)
    assert _next_offset(client, "SC_Overflow") == 0  # not the first entry either


@pytest.mark.parametrize(
    "code", [RequestCode.SEND_REPLY_MESSAGE, RequestCode.SEND_REPLY_MESSAGE_V2]
)
def test_a_refused_reply_carries_the_region_and_trace_switch(client: RawClient, code: int) -> None:
    """ReplyMessageProcessor adds both to its response before msgCheck refuses."""
    refused = client.request(code, {})
    assert (refused.code, refused.remark) == (
        ResponseCode.SYSTEM_ERROR,
        "The specified topic is blank.",
    )
    assert {k: refused.ext_fields.get(k) for k in REGION} == REGION

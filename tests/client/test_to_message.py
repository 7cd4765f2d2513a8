"""``to_message``: every field of the runner-facing ``idemp.Message`` comes from the
pulled record's own field (built positionally, so a field out of place must show)."""

from __future__ import annotations

from idemp.client.consumer import to_message
from idemp.client.route import MessageQueue
from idemp.remoting import MessageExt
from idemp.remoting.codes import Prop
from idemp.remoting.msgid import offset_msg_id


def _ext(topic: str, props: dict[str, str]) -> MessageExt:
    return MessageExt(
        topic=topic,
        body=b"payload",
        properties=props,
        flag=7,
        queue_id=3,
        queue_offset=41,
        commit_log_offset=123_456,
        sys_flag=0,
        born_timestamp=1_700_000_000_001,
        born_host=("10.0.0.9", 50_000),
        store_timestamp=1_700_000_000_002,
        store_host=("10.0.0.1", 10_911),
        reconsume_times=2,
    )


def test_every_field_from_its_source() -> None:
    props = {Prop.KEYS: "k1  k2", Prop.TAGS: "TagA", Prop.UNIQ_KEY: "UNIQ-1", "UID": "u"}
    message = to_message(_ext("Orders", props), MessageQueue("Orders", "broker-a", 3), "g1")
    assert (message.topic, message.body) == ("Orders", b"payload")
    assert message.keys == ("k1", "k2")
    assert message.tags == "TagA"
    assert dict(message.properties) == props
    assert message.msg_id == "UNIQ-1"
    assert message.offset_msg_id == offset_msg_id(("10.0.0.1", 10_911), 123_456)
    assert (message.queue_id, message.queue_offset) == (3, 41)
    assert message.broker_name == "broker-a"
    assert message.reconsume_times == 2
    assert message.born_timestamp == 1_700_000_000_001
    assert message.store_timestamp == 1_700_000_000_002
    assert message.consumer_group == "g1"
    assert (message.message_group, message.delivery_attempt) == (None, None)
    assert (message.receipt_handle, message.delivery_timestamp) == (None, None)


def test_a_retried_message_shows_its_real_topic_and_no_uniq_key_falls_back() -> None:
    props = {Prop.RETRY_TOPIC: "Orders"}
    message = to_message(_ext("%RETRY%g1", props), MessageQueue("%RETRY%g1", "b", 0), "g1")
    assert message.topic == "Orders"
    assert message.keys == () and message.tags is None
    assert message.msg_id == message.offset_msg_id == offset_msg_id(("10.0.0.1", 10_911), 123_456)

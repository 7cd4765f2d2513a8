"""Message traces of idemp's producer and runners (``enable_trace``), in the records the
Java client writes: compared field by field with a Java 4.9.7 producer's and push
consumer's traces on RocketMQ 4.9.7 (2026-11-27), and read back here as ``mqadmin
queryMsgTraceById`` finds them: by message id, in the trace topic."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from idemp import App
from idemp.broker.process import BrokerProcess
from idemp.client import (
    ClientSettings,
    ConsumeFrom,
    ConsumerSettings,
    OutMessage,
    Producer,
    ProducerSettings,
    TransactionState,
)
from idemp.message import ConsumeResult, Message
from idemp.remoting import RequestCode, ResponseCode, decode_messages
from idemp.runners import ConcurrentRunner
from tests.broker.rawclient import RawClient
from tests.client.conftest import FAST_DELAYS, wait_for


def traces_of(
    broker: BrokerProcess, msg_id: str, topic: str = "RMQ_SYS_TRACE_TOPIC"
) -> list[list[str]]:
    """Every trace record naming ``msg_id``, found as queryMsgTraceById finds them: the
    trace messages keyed by the id (QUERY_MESSAGE), split into records and fields."""
    with RawClient(broker.broker_addr) as c:
        resp = c.request(
            RequestCode.QUERY_MESSAGE,
            {
                "topic": topic,
                "key": msg_id,
                "maxNum": "64",
                "beginTimestamp": "0",
                "endTimestamp": str(2**62),
            },
        )
    if resp.code != ResponseCode.SUCCESS:
        return []
    records = []
    for message in decode_messages(resp.body):
        for record in message.body.decode().split("\x02"):
            fields = record.split("\x01")
            if msg_id in fields:
                records.append(fields)
    return records


def all_records(broker: BrokerProcess, topic: str = "RMQ_SYS_TRACE_TOPIC") -> list[list[str]]:
    """Every record of every trace message, pulled queue by queue."""
    with RawClient(broker.broker_addr) as c:
        messages = [m for queue in range(8) for m in c.pull_messages(topic, queue)]
    return [r.split("\x01") for m in messages for r in m.body.decode().split("\x02") if r]


def test_a_send_and_its_consumption_are_traced(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    broker = make_broker(messageDelayLevel=FAST_DELAYS)
    client = ClientSettings(namesrv_addr=broker.namesrv_addr, rebalance_interval=1.0)
    producer = Producer(
        settings=ProducerSettings(group="trace-p", enable_trace=True), client=client
    ).start()
    try:
        tagged = producer.send(OutMessage("Traced", b"ok", tags="TagA", keys=["k1", "k2"]))
        plain = producer.send(OutMessage("Traced", b"again"))
    finally:
        producer.shutdown()  # flushes the gathered traces

    lock = threading.Lock()
    seen: list[str] = []

    def listener(message: Message) -> ConsumeResult:
        with lock:
            seen.append(message.msg_id)
            first = seen.count(message.msg_id) == 1
        return (
            ConsumeResult.RECONSUME_LATER
            if message.body == b"again" and first
            else (ConsumeResult.SUCCESS)
        )

    runner = ConcurrentRunner(
        listener,
        settings=ConsumerSettings(
            group="trace-g", consume_from=ConsumeFrom.FIRST_OFFSET, enable_trace=True
        ),
        client=ClientSettings(
            namesrv_addr=broker.namesrv_addr, instance_name="consumer", rebalance_interval=1.0
        ),
    )
    runner.subscribe("Traced")
    runner.start()
    try:
        wait_for(lambda: len(seen) == 3, 30, "two messages and one retry")
    finally:
        runner.shutdown()

    pub, before, after = wait_for(lambda: _kinds(broker, tagged.msg_id), 10, "3 trace records")
    assert pub[0] == "Pub" and pub[2:] == [
        "DefaultRegion",
        "trace-p",
        "Traced",
        tagged.msg_id,
        "TagA",
        "k1 k2",
        broker.broker_addr,
        "2",  # body length
        pub[10],  # cost in ms
        "0",  # a normal message
        tagged.offset_msg_id,
        "true",
    ]
    assert int(pub[10]) >= 0
    request_id = before[4]
    # the region comes from the stored message's MSG_REGION, which a 4.9.7 broker does not
    # store: a Java consumer's SubBefore on RocketMQ 4.9.7 says "null" too
    assert before == ["SubBefore", before[1], "null", "trace-g", request_id,
                      tagged.msg_id, "0", "k1 k2"]  # fmt: skip
    assert after == ["SubAfter", request_id, tagged.msg_id, after[3], "true", "k1 k2", "0",
                     after[7], "trace-g"]  # fmt: skip
    assert int(after[7]) >= int(before[1]) >= int(pub[1])

    records = wait_for(lambda: _complete(broker, plain.msg_id), 10, "the retry's records")
    kinds = [(r[0], r[4] if r[0] == "SubAfter" else r[6]) for r in records]
    # the first delivery failed (context code 4, FAILED), the retry (reconsume 1) succeeded
    assert kinds == [
        ("Pub", "null"),  # no tags
        ("SubBefore", "0"),
        ("SubAfter", "false"),
        ("SubBefore", "1"),
        ("SubAfter", "true"),
    ]
    assert [r[6] for r in records if r[0] == "SubAfter"] == ["4", "0"]
    # the trace producer's own sends are not traced: every Pub is of the two sends above
    pubs = [r for r in all_records(broker) if r[0] == "Pub"]
    assert sorted(r[5] for r in pubs) == sorted([tagged.msg_id, plain.msg_id])


def _kinds(broker: BrokerProcess, msg_id: str) -> list[list[str]] | None:
    records = traces_of(broker, msg_id)
    kinds = sorted(records, key=lambda r: ["Pub", "SubBefore", "SubAfter"].index(r[0]))
    return kinds if [r[0] for r in kinds] == ["Pub", "SubBefore", "SubAfter"] else None


def _complete(broker: BrokerProcess, msg_id: str) -> list[list[str]] | None:
    records = traces_of(broker, msg_id)
    if len(records) != 5:
        return None
    # in time order: the Pub, then each delivery's SubBefore and SubAfter
    when = {
        "Pub": lambda r: int(r[1]),
        "SubBefore": lambda r: int(r[1]),
        "SubAfter": lambda r: int(r[7]),
    }
    return sorted(records, key=lambda r: (when[r[0]](r), r[0] != "SubBefore"))


def test_an_apps_listeners_are_traced_by_its_settings(
    make_broker: Callable[..., BrokerProcess], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    broker = make_broker()
    producer = Producer(broker.namesrv_addr, "app-p").start()
    try:
        sent = producer.send(OutMessage("AppTraced", b"x", keys=["t1"]))
    finally:
        producer.shutdown()
    monkeypatch.setenv("IDEMP_TRACE", "true")
    applied: list[str] = []
    app = App("traced-app", namesrv_addr=broker.namesrv_addr)

    @app.listener(
        "AppTraced",
        group="traced-app",
        strategy=f"sqlite:///{tmp_path / 'dedup.db'}",
        consume_from=ConsumeFrom.FIRST_OFFSET,
    )
    def on_message(message: Message) -> None:
        applied.append(message.keys[0])

    app.start()
    try:
        wait_for(lambda: applied == ["t1"], 30, "t1 applied")
    finally:
        app.stop()  # flushes the traces
    # found once indexed by key, which RocketMQ does a moment after storing them
    records = wait_for(lambda: _two(traces_of(broker, sent.msg_id)), 10, "two records")
    kinds = sorted((r[0], r[3] if r[0] == "SubBefore" else r[-1]) for r in records)
    assert kinds == [("SubAfter", "traced-app"), ("SubBefore", "traced-app")]


def test_transaction_ends_are_traced_on_both_paths(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """EndTransactionTraceHookImpl's record (13 fields, as 4.9.7's TraceDataEncoder writes
    and reads them): the producer's own commit, and its answer to the broker's check of
    a transaction it left unknown (from_check true)."""
    broker = make_broker(transactionCheckInterval=500, transactionTimeOut=500)
    checked: list[str] = []

    def check(msg: object) -> TransactionState:
        checked.append(getattr(msg, "uniq_key", ""))
        return TransactionState.COMMIT

    producer = Producer(
        settings=ProducerSettings(group="trace-tx", enable_trace=True),
        client=ClientSettings(namesrv_addr=broker.namesrv_addr),
        transaction_check=check,
    ).start()
    try:
        producer.send(OutMessage("TracedTx", b"first"))  # creates the topic
        done = producer.send_in_transaction(
            OutMessage("TracedTx", b"now", tags="Pay", keys=["order-1"]),
            lambda m, s: TransactionState.COMMIT,
        )
        later = producer.send_in_transaction(
            OutMessage("TracedTx", b"later"), lambda m, s: TransactionState.UNKNOWN
        )
        wait_for(lambda: later.msg_id in checked, 30, "the broker's check of the unknown one")
    finally:
        producer.shutdown()  # flushes the gathered traces

    def ends(msg_id: str) -> list[list[str]]:
        return [r for r in traces_of(broker, msg_id) if r[0] == "EndTransaction"]

    (own,) = wait_for(lambda: ends(done.msg_id), 10, "the commit's record")
    assert own == ["EndTransaction", own[1], "DefaultRegion", "trace-tx", "TracedTx",
                   done.msg_id, "Pay", "order-1", broker.broker_addr, "2", done.msg_id,
                   "COMMIT_MESSAGE", "false"]  # fmt: skip
    records = wait_for(lambda: _two(ends(later.msg_id)), 10, "two records")
    unknown, answered = sorted(records, key=lambda r: r[12])  # from the check: "true"
    # the producer's own end said UNKNOW; its answer to the check, from the stored half
    # message (no MSG_REGION on it from this broker, as from 4.9.7's), committed it
    assert unknown[11:] == ["UNKNOW", "false"] and unknown[6:8] == ["null", "null"]
    assert answered[2:] == ["DefaultRegion", "trace-tx", "TracedTx", later.msg_id, "null",
                            "null", broker.broker_addr, "2", later.msg_id, "COMMIT_MESSAGE",
                            "true"]  # fmt: skip


def _two(records: list[list[str]]) -> list[list[str]] | None:
    return records if len(records) == 2 else None

"""idemp.client against idemp's broker (a child process): sends of every kind,
consumption with the concurrent runner, offsets, send-back, failure modes."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from idemp.broker.process import BrokerProcess
from idemp.client import (
    ClientSettings,
    ConnectError,
    ConsumeFrom,
    ConsumerSettings,
    MessageModel,
    OutMessage,
    Producer,
    ProducerSettings,
    SendError,
    SendStatus,
    TransactionState,
    queue_index_for_key,
)
from idemp.message import ConsumeResult, Message
from idemp.runners import ConcurrentRunner
from idemp.tools.dlq import dead_letters
from tests.client.conftest import FAST_DELAYS, wait_for

FAST: dict[str, Any] = dict(rebalance_interval=1.0, persist_offset_interval=0.5)


class Sink:
    """A listener that records what it got; thread-safe."""

    def __init__(self, fail: Callable[[Message], bool] | None = None) -> None:
        self.lock = threading.Lock()
        self.got: list[tuple[float, Message]] = []
        self.fail = fail

    def __call__(self, msg: Message) -> ConsumeResult:
        with self.lock:
            self.got.append((time.monotonic(), msg))
        if self.fail is not None and self.fail(msg):
            return ConsumeResult.RECONSUME_LATER
        return ConsumeResult.SUCCESS

    def bodies(self) -> list[bytes]:
        with self.lock:
            return [m.body for _, m in self.got]

    def count(self) -> int:
        with self.lock:
            return len(self.got)

    def has(self, n: int) -> bool:
        return self.count() >= n


def runner(
    broker: BrokerProcess, group: str, topic: str, listener: object, **kw: object
) -> ConcurrentRunner:
    cs = ConsumerSettings(group=group, consume_from=ConsumeFrom.FIRST_OFFSET)
    for k, v in kw.items():
        setattr(cs, k, v)
    r = ConcurrentRunner(
        listener,
        settings=cs,
        client=ClientSettings(namesrv_addr=broker.namesrv_addr, **FAST),
    )
    r.subscribe(topic)
    return r


def consumed(broker: BrokerProcess, group: str, topic: str, count: int) -> Sink:
    """What a runner of ``group`` got from ``topic`` (from its first offset) once it had
    ``count`` messages; stopped then."""
    sink = Sink()
    r = runner(broker, group, topic, sink)
    r.start()
    try:
        wait_for(lambda: sink.count() >= count, 20, f"{count} messages of {topic}")
    finally:
        r.shutdown()
    return sink


@pytest.fixture
def producer(broker: BrokerProcess) -> Iterator[Producer]:
    p = Producer(broker.namesrv_addr, "test-producer").start()
    yield p
    p.shutdown()


def test_send_sync_and_consume(broker: BrokerProcess, producer: Producer) -> None:
    results = [
        producer.send(OutMessage("T", f"{i} body".encode(), tags="a", keys=[f"k{i}"]))
        for i in range(20)
    ]
    assert {r.status for r in results} == {SendStatus.SEND_OK}
    assert all(re.fullmatch(r"[0-9A-F]{32}", r.msg_id) for r in results)
    assert len({r.msg_id for r in results}) == 20
    # round robin over the 4 queues of the auto-created topic
    assert sorted(r.queue.queue_id for r in results) == sorted([0, 1, 2, 3] * 5)
    sink = consumed(broker, "g-sync", "T", 20)
    got = {m.msg_id: m for _, m in sink.got}
    assert set(got) == {x.msg_id for x in results}
    m = got[results[3].msg_id]
    assert (m.body, m.keys, m.tags, m.topic) == (b"3 body", ("k3",), "a", "T")
    assert (m.queue_id, m.queue_offset) == (results[3].queue.queue_id, results[3].queue_offset)


def test_batch_send(broker: BrokerProcess, producer: Producer) -> None:
    res = producer.send_batch(
        [OutMessage("TB", f"{i} b".encode(), keys=[f"k{i}"]) for i in range(5)]
    )
    ids = res.msg_id.split(",")
    assert len(ids) == 5 and len(set(ids)) == 5
    sink = consumed(broker, "g-batch", "TB", 5)
    msgs = sorted((m for _, m in sink.got), key=lambda m: m.queue_offset)
    assert [m.body for m in msgs] == [f"{i} b".encode() for i in range(5)]
    assert [m.msg_id for m in msgs] == ids
    assert {m.queue_id for m in msgs} == {res.queue.queue_id}


def test_oneway_and_async_sends(broker: BrokerProcess, producer: Producer) -> None:
    oneway = [producer.send_oneway(OutMessage("TO", f"o{i}".encode())) for i in range(6)]
    futures = [producer.send_async(OutMessage("TO", f"a{i}".encode())) for i in range(6)]
    results = [f.result(20) for f in futures]
    assert {r.status for r in results} == {SendStatus.SEND_OK}
    sink = consumed(broker, "g-oneway", "TO", 12)
    expected = {i: f"o{n}".encode() for n, i in enumerate(oneway)}
    expected.update({x.msg_id: f"a{n}".encode() for n, x in enumerate(results)})
    assert {m.msg_id: m.body for _, m in sink.got} == expected
    # a bad message is refused before anything is sent, by both
    big = OutMessage("TO", b"x" * (ProducerSettings().max_message_size + 1))
    with pytest.raises(SendError, match="exceeds"):
        producer.send_oneway(big)
    with pytest.raises(SendError, match="exceeds"):
        producer.send_async(big).result(20)


def test_a_message_sent_again_keeps_its_id(broker: BrokerProcess, producer: Producer) -> None:
    """A UNIQ_KEY the message already has is kept (the Java client sets one only when
    absent): a message sent again, a dead letter replayed, keeps the id consumers saw."""
    first = producer.send(OutMessage("TK", b"x"))
    again = producer.send(OutMessage("TK", b"x", properties={"UNIQ_KEY": first.msg_id}))
    assert again.msg_id == first.msg_id and again.offset_msg_id != first.offset_msg_id
    sink = consumed(broker, "g-keep", "TK", 2)
    assert [m.msg_id for _, m in sink.got] == [first.msg_id] * 2


def test_orderly_send_uses_std_hash(broker: BrokerProcess, producer: Producer) -> None:
    for i in range(40):
        key = f"key-{i % 9}"
        res = producer.send_orderly(OutMessage("TO", f"{i} o".encode(), keys=[key]), key)
        assert res.queue.queue_id == queue_index_for_key(key, 4)


def test_delay_level(broker: BrokerProcess, producer: Producer) -> None:
    """Level 2 is 1 s with this broker's messageDelayLevel (all levels 1 s)."""
    sink = Sink()
    r = runner(broker, "g-delay", "TD", sink)
    producer.send(OutMessage("TD", b"warm-up"))
    r.start()
    try:
        wait_for(lambda: sink.count() >= 1, 20, "warm-up message")
        sent = time.monotonic()
        producer.send(OutMessage("TD", b"later", delay_level=2))
        wait_for(lambda: sink.count() >= 2, 20, "the delayed message")
    finally:
        r.shutdown()
    at, m = sink.got[1]
    assert m.body == b"later" and m.property("DELAY") == "2"
    assert at - sent >= 0.9  # delivered only after its delay


def test_transactions_commit_rollback_and_check(make_broker: Callable[..., BrokerProcess]) -> None:
    broker = make_broker(
        messageDelayLevel=FAST_DELAYS, transactionCheckInterval=500, transactionTimeOut=500
    )
    checked: list[str] = []

    def check(msg: object) -> TransactionState:
        checked.append(getattr(msg, "body", b"").decode())
        return TransactionState.COMMIT

    p = Producer(
        broker.namesrv_addr, settings=ProducerSettings(group="tx-group"), transaction_check=check
    ).start()
    sink = Sink()
    r = runner(broker, "g-tx", "TX", sink)
    try:
        p.send(OutMessage("TX", b"plain"))  # creates the topic
        r.start()
        a = p.send_in_transaction(OutMessage("TX", b"commit"), lambda m, s: TransactionState.COMMIT)
        b = p.send_in_transaction(
            OutMessage("TX", b"rollback"), lambda m, s: TransactionState.ROLLBACK
        )
        c = p.send_in_transaction(
            OutMessage("TX", b"unknown"), lambda m, s: TransactionState.UNKNOWN
        )
        assert (a.transaction_state, b.transaction_state, c.transaction_state) == (
            TransactionState.COMMIT,
            TransactionState.ROLLBACK,
            TransactionState.UNKNOWN,
        )
        wait_for(lambda: b"unknown" in sink.bodies(), 30, "the checked transaction to commit")
        # The rollback never shows up: everything sent before and after it did.
        p.send(OutMessage("TX", b"last"))
        wait_for(lambda: b"last" in sink.bodies(), 20, "the last message")
    finally:
        r.shutdown()
        p.shutdown()
    assert sorted(sink.bodies()) == sorted([b"plain", b"commit", b"unknown", b"last"])
    assert "unknown" in checked and "commit" not in checked and "rollback" not in checked


def test_failed_messages_are_sent_back_and_redelivered(
    broker: BrokerProcess, producer: Producer
) -> None:
    sink = Sink(fail=lambda m: m.body == b"bad" and m.reconsume_times < 2)
    r = runner(broker, "g-retry", "TR", sink)
    producer.send(OutMessage("TR", b"good"))
    producer.send(OutMessage("TR", b"bad", keys=["kb"]))
    r.start()
    try:
        wait_for(
            lambda: [m.reconsume_times for _, m in sink.got if m.body == b"bad"] == [0, 1, 2],
            40,
            "the failed message to come back twice",
        )
    finally:
        r.shutdown()
    bad = [m for _, m in sink.got if m.body == b"bad"]
    # A redelivery shows the real topic and keeps the original id and keys.
    assert {m.topic for m in bad} == {"TR"}
    assert {m.keys for m in bad} == {("kb",)}
    assert bad[1].property("RETRY_TOPIC") == "TR"
    assert sink.bodies().count(b"good") == 1


def test_offsets_persist_across_restart(broker: BrokerProcess, producer: Producer) -> None:
    for i in range(10):
        producer.send(OutMessage("TP", f"{i} first".encode()))
    sink = Sink()
    r = runner(broker, "g-off", "TP", sink)
    r.start()
    wait_for(lambda: sink.count() >= 10, 20, "the first 10")
    r.shutdown()  # persists offsets synchronously
    for i in range(10, 15):
        producer.send(OutMessage("TP", f"{i} second".encode()))
    sink2 = Sink()
    r2 = runner(broker, "g-off", "TP", sink2)
    r2.start()
    try:
        wait_for(lambda: sink2.count() >= 5, 20, "the next 5")
        producer.send(OutMessage("TP", b"15 marker"))
        wait_for(lambda: b"15 marker" in sink2.bodies(), 20, "the marker")
    finally:
        r2.shutdown()
    assert sorted(sink2.bodies()) == sorted(
        [f"{i} second".encode() for i in range(10, 15)] + [b"15 marker"]
    )


def test_consume_from_last_offset_skips_history(broker: BrokerProcess, producer: Producer) -> None:
    """LAST_OFFSET on an old group-less queue: the broker answers offset 0 for a young
    queue (RocketMQ does too), so history is only skipped once an offset exists. Here
    the group first commits, then new messages after a restart are all it sees."""
    producer.send(OutMessage("TL", b"old"))
    sink = Sink()
    r = runner(broker, "g-last", "TL", sink, consume_from=ConsumeFrom.LAST_OFFSET)
    r.start()
    try:
        wait_for(lambda: sink.count() >= 1, 20, "the young queue read from 0")
        producer.send(OutMessage("TL", b"new"))
        wait_for(lambda: sink.count() >= 2, 20, "the new message")
    finally:
        r.shutdown()
    assert sink.bodies() == [b"old", b"new"]


def test_tag_subscription(broker: BrokerProcess, producer: Producer) -> None:
    for tag in ["a", "b", "c", "a"]:
        producer.send(OutMessage("TT", tag.encode(), tags=tag))
    producer.send(OutMessage("TT", b"untagged"))
    sink = Sink()
    cs = ConsumerSettings(group="g-tags", consume_from=ConsumeFrom.FIRST_OFFSET)
    r = ConcurrentRunner(sink, settings=cs, client=ClientSettings(broker.namesrv_addr, **FAST))
    r.subscribe("TT", "a || c")
    r.start()
    try:
        wait_for(lambda: sink.count() >= 3, 20, "three tagged messages")
        producer.send(OutMessage("TT", b"end", tags="c"))
        wait_for(lambda: b"end" in sink.bodies(), 20, "the end marker")
    finally:
        r.shutdown()
    assert sorted(sink.bodies()) == [b"a", b"a", b"c", b"end"]


def test_broadcasting_offsets_in_local_file(
    broker: BrokerProcess, producer: Producer, tmp_path: Path
) -> None:
    for i in range(4):
        producer.send(OutMessage("TBC", f"{i}".encode()))
    sinks = [Sink(), Sink()]
    runners = [
        runner(
            broker,
            "g-bc",
            "TBC",
            s,
            message_model=MessageModel.BROADCASTING,
            offset_store_dir=str(tmp_path / f"offsets{i}"),
        )
        for i, s in enumerate(sinks)
    ]
    # Two processes in real life; here two instances need distinct names.
    for i, rr in enumerate(runners):
        rr.client_settings.instance_name = f"bc{i}"
    for rr in runners:
        rr.start()
    try:
        for s in sinks:
            wait_for(partial(s.has, 4), 20, "every message in each consumer")
    finally:
        for rr in runners:
            rr.shutdown()
    for i, s in enumerate(sinks):
        assert sorted(s.bodies()) == [b"0", b"1", b"2", b"3"]
        files = list((tmp_path / f"offsets{i}").glob("*/g-bc/offsets.json"))
        assert len(files) == 1
        import json

        table = json.loads(files[0].read_text())["offsetTable"]
        assert sum(e["offset"] for e in table if e["topic"] == "TBC") == 4


def test_broadcasting_failures_are_retried_here_then_dead_lettered(
    broker: BrokerProcess, producer: Producer, tmp_path: Path
) -> None:
    """RocketMQ's broadcasting client drops a message its listener failed; idemp's tries
    it again in the same instance and, past max reconsume times, sends it to the group's
    DLQ (as the orderly runner does), holding the offset until then."""
    q0 = producer.publish_queues("TBCF")[0]
    for body in (b"flaky", b"poison", b"fine"):
        producer.send(OutMessage("TBCF", body), queue=q0)
    sink = Sink(
        fail=lambda m: m.body == b"poison" or (m.body == b"flaky" and m.reconsume_times < 2)
    )
    r = runner(
        broker,
        "g-bcf",
        "TBCF",
        sink,
        message_model=MessageModel.BROADCASTING,
        offset_store_dir=str(tmp_path / "offsets"),
        max_reconsume_times=2,
        send_back_retry_delay=0.1,
    )
    r.start()
    try:
        wait_for(lambda: r.dlq_count == 1, 20, "the poison message in the DLQ")
        offsets = r.consumer.offsets
        assert offsets is not None
        wait_for(lambda: offsets.read_memory(q0) == 3, 10, "the offset past all three")
    finally:
        r.shutdown()
    tries = sorted((m.body, m.reconsume_times) for _, m in sink.got)
    assert tries == [
        (b"fine", 0),
        (b"flaky", 0),
        (b"flaky", 1),
        (b"flaky", 2),
        (b"poison", 0),
        (b"poison", 1),
        (b"poison", 2),
    ]
    [(_, dead)] = dead_letters(broker.namesrv_addr, "g-bcf")
    assert (dead.body, dead.properties.get("RETRY_TOPIC")) == (b"poison", "TBCF")


def test_async_listener(broker: BrokerProcess, producer: Producer) -> None:
    got: list[bytes] = []

    async def listener(msg: Message) -> None:
        got.append(msg.body)

    for i in range(5):
        producer.send(OutMessage("TA", f"{i}".encode()))
    r = runner(broker, "g-async", "TA", listener)
    r.start()
    try:
        wait_for(lambda: len(got) >= 5, 20, "5 messages")
    finally:
        r.shutdown()
    assert sorted(got) == [b"0", b"1", b"2", b"3", b"4"]


def test_unreachable_nameserver_fails_clearly() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = Producer(
        f"127.0.0.1:{port}",
        settings=ProducerSettings(group="nobody", send_timeout=1.0),
        client=ClientSettings(request_timeout=1.0, connect_timeout=1.0),
    ).start()
    t0 = time.monotonic()
    with pytest.raises(Exception, match="no nameserver reachable|cannot connect"):
        p.send(OutMessage("T", b"x"))
    assert time.monotonic() - t0 < 10
    p.shutdown()
    sink = Sink()
    r = ConcurrentRunner(
        sink,
        group="g-none",
        client=ClientSettings(f"127.0.0.1:{port}", request_timeout=1.0, connect_timeout=1.0),
    )
    r.subscribe("T")
    with pytest.raises(ConnectError, match="no nameserver reachable"):
        r.start(timeout=10)


def test_broker_restart_mid_stream(make_broker: Callable[..., BrokerProcess]) -> None:
    broker = make_broker(messageDelayLevel=FAST_DELAYS)
    p = Producer(broker.namesrv_addr, "restart-producer").start()
    sink = Sink()
    r = runner(broker, "g-restart", "TS", sink, pull_time_delay_when_exception=0.2)
    try:
        for i in range(20):
            p.send(OutMessage("TS", f"{i}".encode()))
        r.start()
        wait_for(lambda: sink.count() >= 20, 20, "the first 20")
        broker.stop()
        broker.start()  # same store, same ports
        deadline = time.monotonic() + 30
        sent = 20
        while sent < 40:
            try:
                p.send(OutMessage("TS", f"{sent}".encode()))
                sent += 1
            except Exception:
                assert time.monotonic() < deadline, "producer did not reconnect"
                time.sleep(0.1)  # bounded by the deadline: the broker is coming back
        wait_for(lambda: len(set(sink.bodies())) >= 40, 30, "all 40 messages after the restart")
    finally:
        r.shutdown()
        p.shutdown()
    assert set(sink.bodies()) == {f"{i}".encode() for i in range(40)}


def test_concurrent_max_span_stops_pulling_past_a_stuck_message(
    broker: BrokerProcess, producer: Producer
) -> None:
    """consumeConcurrentlyMaxSpan, as RocketMQ's ProcessQueue.getMaxSpan: the span is
    newest − oldest of the messages still cached (not yet consumed). With message 0
    stuck and the threads busy, pulling stops once that span passes the limit, although
    the cached count (~60) is far below pull_threshold_for_queue (1000)."""
    for i in range(400):
        producer.send_orderly(OutMessage("TSPAN", str(i).encode()), "one-queue")
    release = threading.Event()
    seen: list[int] = []
    lock = threading.Lock()

    def listener(msg: Message) -> ConsumeResult:
        with lock:
            seen.append(msg.queue_offset)
        if msg.queue_offset == 0 or msg.queue_offset >= 50:
            release.wait(60)  # bounded: the test releases it below
        return ConsumeResult.SUCCESS

    r = runner(
        broker,
        "g-span",
        "TSPAN",
        listener,
        consume_concurrently_max_span=100,
        pull_batch_size=10,
        consume_thread_count=4,
    )
    r.start()
    try:
        wait_for(lambda: len(seen) >= 53, 30, "offset 0 and three more stuck in the listener")
        (pq,) = [q for q in r.consumer.process_queues.values() if q.max_offset >= 0]
        wait_for(lambda: pq.max_span > 100, 30, "the cached span to pass the limit")
        # An observation window: without the span check the runner pulls the remaining
        # ~290 messages into its cache in well under a second here.
        time.sleep(1.0)
        pulled = pq.max_offset
        release.set()
        wait_for(lambda: len(seen) >= 400, 30, "every message after the release")
    finally:
        release.set()
        r.shutdown()
    # Pulls of 10 go on while newest cached − 0 ≤ 100, and stop at the first above it.
    assert 101 <= pulled <= 110
    assert sorted(seen) == list(range(400))


def test_max_span_counts_cached_messages_only() -> None:
    from idemp.client.processqueue import ProcessQueue
    from idemp.remoting import MessageExt

    pq = ProcessQueue()
    assert pq.max_span == 0
    msgs = [MessageExt(topic="T", body=b"x", queue_offset=o) for o in (5, 6, 7, 40)]
    pq.put(msgs)
    assert pq.max_span == 35
    pq.remove(msgs[1:3])
    assert pq.max_span == 35
    pq.remove([msgs[3]])
    assert pq.max_span == 0  # only the oldest left: RocketMQ pulls on, too

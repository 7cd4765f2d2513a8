"""Retries, dead letters, delay levels and transactions with the OFFICIAL client
(rocketmq-client-python 0.5.0rc2, the C++ client inside) against the broker process.

The clients run in this process. Each test starts its own broker, and every client it
starts is shut down in a ``finally`` (a client left running would keep the C++ client
factory, and its nameserver address, alive into the next test).

Callbacks run on the client's threads and record what they see; the test waits for
conditions with deadlines. Each bound says which client or broker period it covers.
Section numbers refer to /work/shared/rocketmq-remoting.md; quirks of the wheel to
/work/shared/ENVIRONMENT.md.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from idemp.broker.process import BrokerProcess
from idemp.remoting import RemotingCommand, RequestCode, ResponseCode, decode_messages
from idemp.remoting.msgid import offset_msg_id, parse_offset_msg_id

from .rawclient import RawClient

rocketmq = pytest.importorskip("rocketmq.client")
RocketMQException = pytest.importorskip("rocketmq.exceptions").RocketMQException
ConsumeStatus = rocketmq.ConsumeStatus
Message = rocketmq.Message
Producer = rocketmq.Producer
PushConsumer = rocketmq.PushConsumer
TransactionMQProducer = rocketmq.TransactionMQProducer
TransactionStatus = rocketmq.TransactionStatus

pytestmark = pytest.mark.official

# The wheel's clustering consumer rebalances at start and then every 10 s; a %RETRY%
# topic that did not exist at its start is only pulled after the next rebalance
# (ENVIRONMENT.md). 10 s + a pull round trip + margin.
REBALANCE_S = 10.0
# A consumer that is already pulling sees a new message within one long-poll wake-up.
DELIVERY_S = 3.0
# Store timestamps are whole milliseconds; allow that granularity (and no more).
CLOCK_GRANULARITY_S = 0.002
NO_ROUTE_ATTEMPTS = 10


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------
def _text(value: Any) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class Seen:
    """One callback invocation, copied out of the C++ message while it is valid."""

    t: float  # time.time() when the callback ran
    keys: str
    body: str
    msg_id: str
    topic: str
    reconsume_times: int
    props: dict[str, str] = field(default_factory=dict)
    store_timestamp: int = 0
    born_timestamp: int = 0


class Recorder:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.items: list[Seen] = []
        self.errors: list[str] = []

    def add(self, item: Seen) -> None:
        with self._cond:
            self.items.append(item)
            self._cond.notify_all()

    def error(self, text: str) -> None:
        with self._cond:
            self.errors.append(text)
            self._cond.notify_all()

    def snapshot(self, keys: str | None = None) -> list[Seen]:
        with self._cond:
            return [s for s in self.items if keys is None or s.keys == keys]

    def wait_for(self, predicate: Callable[[list[Seen]], bool], timeout: float) -> list[Seen]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self.items):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"condition not met within {timeout}s; seen: {self.items}; "
                        f"errors: {self.errors}"
                    )
                self._cond.wait(remaining)
            return list(self.items)


def _seen(msg: Any, props: tuple[str, ...] = ()) -> Seen:
    return Seen(
        t=time.time(),
        keys=_text(msg.keys),
        body=_text(msg.body),
        msg_id=msg.id,
        topic=msg.topic,
        reconsume_times=msg.reconsume_times,
        props={p: _text(msg.get_property(p)) for p in props},
        store_timestamp=msg.store_timestamp,
        born_timestamp=msg.born_timestamp,
    )


@contextmanager
def push_consumer(
    broker: BrokerProcess, group: str, topic: str, recorder: Recorder, status: Any
) -> Iterator[Any]:
    """A clustering PushConsumer that records every message and answers ``status``.
    One message per callback, so a RECONSUME_LATER concerns exactly that message
    (the wheel sends back the rest of a pull batch too, ENVIRONMENT.md)."""

    def on_message(msg: Any) -> Any:
        # A callback that raises is ACKED by the wrapper: catch everything.
        try:
            recorder.add(_seen(msg, ("UNIQ_KEY", "RETRY_TOPIC", "TRAN_MSG")))
            return status
        except BaseException as exc:  # noqa: BLE001
            recorder.error(repr(exc))
            return ConsumeStatus.RECONSUME_LATER

    consumer = PushConsumer(group)
    consumer.set_namesrv_addr(broker.namesrv_addr)
    consumer.set_message_batch_max_size(1)
    consumer.set_thread_count(1)
    consumer.subscribe(topic, on_message)
    consumer.start()
    try:
        yield consumer
    finally:
        consumer.shutdown()


@contextmanager
def started(client: Any, broker: BrokerProcess) -> Iterator[Any]:
    client.set_namesrv_addr(broker.namesrv_addr)
    client.start()
    try:
        yield client
    finally:
        client.shutdown()


def _message(topic: str, keys: str, body: str, delay_level: int = 0) -> Any:
    msg = Message(topic)
    msg.set_keys(keys)
    msg.set_body(body)
    if delay_level:
        msg.set_delay_time_level(delay_level)
    return msg


def _with_route_retry(send: Callable[[], Any]) -> Any:
    """A fresh producer's first send can fail at once with "No route info of this
    topic" while it connects (ENVIRONMENT.md); only that error is retried."""
    for attempt in range(NO_ROUTE_ATTEMPTS):
        try:
            return send()
        except RocketMQException as exc:
            if "No route info" not in str(exc) or attempt == NO_ROUTE_ATTEMPTS - 1:
                raise
            time.sleep(0.2)  # let the client finish connecting to the nameserver
    raise AssertionError("unreachable")


def _timed_send(send: Callable[[], Any]) -> tuple[Any, float, float]:
    """(result, wall time the successful attempt began, wall time of its ack)."""
    starts: list[float] = []

    def attempt() -> Any:
        starts.append(time.time())
        return send()

    result = _with_route_retry(attempt)
    return result, starts[-1], time.time()


def _wait_max_offset(raw: RawClient, topic: str, expected: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        got = raw.max_offset(topic)
        if got == expected:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{topic}: max offset {got}, expected {expected}")
        time.sleep(0.05)  # polling the broker's queue; bounded by the deadline


def _levels(*first: str) -> str:
    """An 18-level messageDelayLevel whose first levels are ``first``, the rest 1s."""
    return " ".join([*first, *["1s"] * (18 - len(first))])


# --------------------------------------------------------------------------------------
# A1: RECONSUME_LATER, retry topic, dead letter queue (§4.6)
# --------------------------------------------------------------------------------------
def test_reconsume_later_retries_with_delays_then_dead_letters(
    make_broker: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    group, topic = "G_RETRY", "TopicRetry"
    store = tmp_path / "store-retry"
    (store / "config").mkdir(parents=True)
    (store / "config" / "subscriptionGroup.json").write_text(
        json.dumps({"subscriptionGroupTable": {group: {"groupName": group, "retryMaxTimes": 2}}})
    )
    # send-back uses level 3 + reconsumeTimes: level 3 = 2 s, level 4 = 3 s
    broker = make_broker(store=store, messageDelayLevel=_levels("1s", "1s", "2s", "3s"))
    raw = RawClient(broker.broker_addr)
    assert raw.create_topic(topic, 1).code == 0  # routable before the consumer starts
    seen = Recorder()
    try:
        with (
            push_consumer(broker, group, topic, seen, ConsumeStatus.RECONSUME_LATER),
            started(Producer("PG_RETRY"), broker) as producer,
        ):
            result = _with_route_retry(
                lambda: producer.send_sync(_message(topic, "K-RETRY", "retry me"))
            )
            # reconsume 0 now; 1 after the next rebalance picks up %RETRY% (the
            # retry topic is created by the consumer's first heartbeat); 2 three
            # seconds (level 4) after 1.
            seen.wait_for(lambda s: len(s) >= 1, DELIVERY_S)
            seen.wait_for(lambda s: len(s) >= 2, REBALANCE_S + DELIVERY_S)
            seen.wait_for(lambda s: len(s) >= 3, 3.0 + DELIVERY_S)
            # the third RECONSUME_LATER (reconsumeTimes 2 >= retryMaxTimes 2) goes to
            # the DLQ, which no consumer reads
            _wait_max_offset(raw, f"%DLQ%{group}", 1, DELIVERY_S)
            # Watch for a redelivery for longer than any configured delay (3 s) plus
            # a pull round trip: none may come.
            time.sleep(4.0)
            deliveries = seen.snapshot()
        assert seen.errors == []
        assert [d.reconsume_times for d in deliveries] == [0, 1, 2]
        assert {(d.keys, d.body, d.msg_id, d.topic) for d in deliveries} == {
            ("K-RETRY", "retry me", result.msg_id, topic)
        }
        assert [d.props["UNIQ_KEY"] for d in deliveries] == [result.msg_id] * 3
        assert [d.props["RETRY_TOPIC"] for d in deliveries] == ["", topic, topic]
        gaps = [b.t - a.t for a, b in zip(deliveries, deliveries[1:])]
        assert gaps[0] >= 2.0 - CLOCK_GRANULARITY_S  # level 3 (and the rebalance)
        assert gaps[1] >= 3.0 - CLOCK_GRANULARITY_S  # level 4
        # broker side: two retry copies, one dead letter carrying the history
        (original,) = raw.pull_messages(topic)
        assert raw.max_offset(f"%RETRY%{group}") == 2
        (dead,) = raw.pull_messages(f"%DLQ%{group}")
        assert dead.body == b"retry me"
        assert dead.reconsume_times == 3
        assert dead.properties["UNIQ_KEY"] == result.msg_id
        assert dead.properties["RETRY_TOPIC"] == topic
        assert dead.properties["ORIGIN_MESSAGE_ID"] == original.offset_msg_id
        assert raw.max_offset(f"%DLQ%{group}") == 1
    finally:
        raw.close()


# --------------------------------------------------------------------------------------
# A2: delay levels are never early (§4.6)
# --------------------------------------------------------------------------------------
def test_delay_levels_are_not_early_and_do_arrive(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    topic = "TopicDelay"
    # level 18 = 2 s: a level above 18 is capped at 18
    broker = make_broker(messageDelayLevel=" ".join(["1s", "2s", "3s", *["1s"] * 14, "2s"]))
    delays = {1: 1.0, 2: 2.0, 3: 3.0, 20: 2.0}
    raw = RawClient(broker.broker_addr)
    assert raw.create_topic(topic, 1).code == 0
    seen = Recorder()
    sends: dict[str, tuple[float, float]] = {}
    try:
        with (
            push_consumer(broker, "G_DELAY", topic, seen, ConsumeStatus.CONSUME_SUCCESS),
            started(Producer("PG_DELAY"), broker) as producer,
        ):
            for level in delays:
                keys = f"K-L{level}"
                msg = _message(topic, keys, f"delayed {level}", delay_level=level)
                _, t_call, t_ack = _timed_send(functools.partial(producer.send_sync, msg))
                sends[keys] = (t_call, t_ack)
            got = seen.wait_for(lambda s: len(s) >= len(delays), max(delays.values()) + 3.0)
            time.sleep(1.0)  # nothing else may arrive (a re-delivery from the schedule)
            assert len(seen.snapshot()) == len(delays)
        assert seen.errors == []
        by_key = {s.keys: s for s in got}
        assert set(by_key) == set(sends)
        for level, delay in delays.items():
            s = by_key[f"K-L{level}"]
            t_call, t_ack = sends[s.keys]
            # The broker stored the message between t_call and t_ack and delivers it
            # at store time + delay or later: measured from the ack, the delay may look
            # shorter only by the ack's own latency (t_ack - t_call) and 1 ms rounding.
            assert s.t - t_ack >= delay - (t_ack - t_call) - CLOCK_GRANULARITY_S, s
            assert s.t - t_call >= delay - CLOCK_GRANULARITY_S, s
            # and exactly, in the broker's own milliseconds: re-stored under the real
            # topic no earlier than born (< stored) + delay
            assert s.store_timestamp - s.born_timestamp >= int(delay * 1000), s
            assert s.t - t_ack < delay + 3.0, s  # and it did arrive, promptly
            assert s.topic == topic and s.reconsume_times == 0
    finally:
        raw.close()


# --------------------------------------------------------------------------------------
# A3: transactions (§2.4.9, §4.8)
# --------------------------------------------------------------------------------------
@dataclass
class TxScript:
    """What the local transaction and the checker answer, per message key."""

    local: dict[str, Any]
    check: dict[str, Any]
    checks: Recorder = field(default_factory=Recorder)
    local_calls: Recorder = field(default_factory=Recorder)

    def local_execute(self, msg: Any, user_args: Any) -> Any:
        try:
            # The local transaction gets the plain message being sent, not a stored
            # one: only topic/keys/body exist (the ext accessors, e.g. .id, crash).
            keys, body = _text(msg.keys), _text(msg.body)
            self.local_calls.add(Seen(time.time(), keys, body, "", msg.topic, 0))
            return self.local[keys]
        except BaseException as exc:  # noqa: BLE001 - a raise would be read as COMMIT
            self.local_calls.error(repr(exc))
            return TransactionStatus.UNKNOWN

    def checker(self, msg: Any) -> Any:
        try:
            self.checks.add(_seen(msg, ("UNIQ_KEY", "TRANSACTION_CHECK_TIMES")))
            return self.check[_text(msg.keys)]
        except BaseException as exc:  # noqa: BLE001
            self.checks.error(repr(exc))
            return TransactionStatus.UNKNOWN


def test_transactions_commit_rollback_and_check_back(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    topic, check_max = "TopicTx", 3
    # check every 1 s any half message older than 1 s; give up after 3 checks
    broker = make_broker(
        transactionCheckInterval=1000, transactionTimeOut=1000, transactionCheckMax=check_max
    )
    script = TxScript(
        local={
            "K-COMMIT": TransactionStatus.COMMIT,
            "K-ROLLBACK": TransactionStatus.ROLLBACK,
            "K-CHECK-COMMIT": TransactionStatus.UNKNOWN,
            "K-CHECK-ROLLBACK": TransactionStatus.UNKNOWN,
            "K-FOREVER": TransactionStatus.UNKNOWN,
        },
        check={
            "K-CHECK-COMMIT": TransactionStatus.COMMIT,
            "K-CHECK-ROLLBACK": TransactionStatus.ROLLBACK,
            "K-FOREVER": TransactionStatus.UNKNOWN,
        },
    )
    raw = RawClient(broker.broker_addr)
    assert raw.create_topic(topic, 1).code == 0
    seen = Recorder()
    ids: dict[str, str] = {}
    try:
        with (
            push_consumer(broker, "G_TX", topic, seen, ConsumeStatus.CONSUME_SUCCESS),
            started(TransactionMQProducer("PG_TX", script.checker), broker) as producer,
        ):
            for keys in script.local:
                msg = _message(topic, keys, f"body of {keys}")
                result = _with_route_retry(
                    functools.partial(
                        producer.send_message_in_transaction, msg, script.local_execute
                    )
                )
                ids[keys] = result.msg_id
            # commits are visible at once; checks start once a half is 1 s old
            seen.wait_for(lambda s: {x.keys for x in s} >= {"K-COMMIT"}, DELIVERY_S)
            seen.wait_for(
                lambda s: {x.keys for x in s} >= {"K-CHECK-COMMIT"}, 1.0 + 2 * 1.0 + DELIVERY_S
            )
            # K-FOREVER: checked 3 times (rounds 1 s apart), then moved aside
            give_up_s = 1.0 + (check_max + 1) * 1.0 + DELIVERY_S
            _wait_max_offset(raw, "TRANS_CHECK_MAX_TIME_TOPIC", 1, give_up_s)
            # two more check rounds and a pull round trip: no further check, and no
            # message that was rolled back or given up on is delivered
            time.sleep(2.5)
            deliveries = seen.snapshot()
            checks = script.checks.snapshot()
        assert script.local_calls.errors == [] and script.checks.errors == []
        assert seen.errors == []
        # local transaction ran once per message, with that message
        assert sorted(c.keys for c in script.local_calls.snapshot()) == sorted(script.local)
        # delivered: the two commits, once each, with the producer's ids
        assert sorted((d.keys, d.body, d.msg_id) for d in deliveries) == [
            ("K-CHECK-COMMIT", "body of K-CHECK-COMMIT", ids["K-CHECK-COMMIT"]),
            ("K-COMMIT", "body of K-COMMIT", ids["K-COMMIT"]),
        ]
        assert raw.max_offset(topic) == 2
        # checker: never asked about messages already committed or rolled back; one
        # check each for the two it resolved (a check round is 1 s, the answer comes
        # back in a loopback round trip); exactly transactionCheckMax for K-FOREVER
        per_key: dict[str, list[Seen]] = {}
        for c in checks:
            per_key.setdefault(c.keys, []).append(c)
        assert {k: len(v) for k, v in per_key.items()} == {
            "K-CHECK-COMMIT": 1,
            "K-CHECK-ROLLBACK": 1,
            "K-FOREVER": check_max,
        }
        for keys, calls in per_key.items():
            for call in calls:
                assert (call.topic, call.body, call.msg_id) == (topic, f"body of {keys}", ids[keys])
                assert call.props["UNIQ_KEY"] == ids[keys]
        assert [c.props["TRANSACTION_CHECK_TIMES"] for c in per_key["K-FOREVER"]] == [
            "1",
            "2",
            "3",
        ]
        (given_up,) = raw.pull_messages("TRANS_CHECK_MAX_TIME_TOPIC")
        assert given_up.properties["UNIQ_KEY"] == ids["K-FOREVER"]
        assert given_up.properties["TRANSACTION_CHECK_TIMES"] == str(check_max)
        assert given_up.body == b"body of K-FOREVER"
    finally:
        raw.close()


def _end_sent(
    producer: RawClient, group: str, sent: RemotingCommand, kind: int = 8
) -> RemotingCommand:
    """The producer's own END_TRANSACTION (8 commit, 12 rollback) for the half whose send
    answered ``sent``, as after its local transaction (not from a check)."""
    return producer.request(
        RequestCode.END_TRANSACTION,
        {
            "producerGroup": group,
            "tranStateTableOffset": sent.ext_fields["queueOffset"],
            "commitLogOffset": parse_offset_msg_id(sent.ext_fields["msgId"])[1],
            "commitOrRollback": kind,
            "msgId": sent.ext_fields["msgId"],
            "fromTransactionCheck": "false",
        },
    )


def _commit_checked(producer: RawClient, group: str, check: RemotingCommand) -> RemotingCommand:
    """The producer's commit (8) in answer to CHECK_TRANSACTION_STATE ``check``: it names
    the half the check named."""
    return producer.request(
        RequestCode.END_TRANSACTION,
        {
            "producerGroup": group,
            "tranStateTableOffset": check.ext_fields["tranStateTableOffset"],
            "commitLogOffset": check.ext_fields["commitLogOffset"],
            "commitOrRollback": 8,
            "msgId": check.ext_fields["msgId"],
            "fromTransactionCheck": "true",
        },
    )


def test_a_half_given_up_is_resumed_checked_again_and_committed(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """RESUME_CHECK_HALF_MESSAGE (DefaultMQAdminExt.resumeCheckHalfMessage): the copy in
    TRANS_CHECK_MAX_TIME_TOPIC goes back to the half topic with its check count at 0, its
    producer is asked again and can commit it. Answers as RocketMQ 4.9.7's, measured side
    by side with these raw requests (2026-11-27), and passing against it (IDEMP_4X_REAL)."""
    topic, group = "TopicResume", "PG_RESUME"
    broker = make_broker(transactionCheckInterval=200, transactionTimeOut=0, transactionCheckMax=1)
    with RawClient(broker.broker_addr) as raw, RawClient(broker.broker_addr) as producer:
        assert raw.create_topic(topic, 1).code == 0
        uniq = "7F00000100002A9F00000000000000A1"
        props = {"TRAN_MSG": "true", "PGROUP": group, "KEYS": "K-RESUME", "UNIQ_KEY": uniq}
        assert raw.send_message(topic, b"half", props, group=group, sys_flag=4).code == 0
        assert raw.send_message(topic, b"plain").code == 0
        # no producer online: checked once, then given up (a check round is 0.2 s)
        _wait_max_offset(raw, "TRANS_CHECK_MAX_TIME_TOPIC", 1, 10.0)
        (given_up,) = raw.pull_messages("TRANS_CHECK_MAX_TIME_TOPIC")
        # from now on a half is asked about every round until it is ended, so the commit
        # below cannot lose a race with a second give-up
        assert raw.update_broker_config(transactionCheckMax=1000).code == 0
        assert producer.heartbeat("127.0.0.1@resume", producer_groups=[group]).code == 0
        halves = raw.max_offset("RMQ_SYS_TRANS_HALF_TOPIC")
        answers = [
            raw.request(RequestCode.RESUME_CHECK_HALF_MESSAGE, {"msgId": msg_id})
            for msg_id in ("ABC", offset_msg_id(given_up.store_host, given_up.commit_log_offset))
        ]
        check = producer.wait_pushed(lambda c: c.code == RequestCode.CHECK_TRANSACTION_STATE, 10.0)
        # the copy put back, then (each check round puts the half back again) the copy
        # that was asked about
        assert raw.indexed("RMQ_SYS_TRANS_HALF_TOPIC", 0, halves + 2) >= halves + 2
        resumed, *_ = raw.pull_messages("RMQ_SYS_TRANS_HALF_TOPIC", 0, halves)
        (asked,) = decode_messages(check.body)
        end = _commit_checked(producer, group, check)
        # and a half rolled back by its producer at once: RocketMQ's rollback answer keeps
        # the response's default remark (EndTransactionProcessor.checkPrepareMessage)
        other = raw.send_message(topic, b"undone", props, group=group, sys_flag=4)
        rollback = _end_sent(producer, group, other, 12)
        delivered = [m.body for m in raw.pull_messages(topic)]
    assert (rollback.code, rollback.remark) == (ResponseCode.SUCCESS, "not set any response code")
    assert given_up.properties["TRANSACTION_CHECK_TIMES"] == "1"
    assert [(a.code, a.remark) for a in answers] == [
        (
            ResponseCode.SYSTEM_ERROR,
            "Exception was thrown when putting message back to RMQ_SYS_TRANS_HALF_TOPIC.",
        ),
        (ResponseCode.SUCCESS, None),
    ]
    assert (resumed.properties["UNIQ_KEY"], resumed.body) == (uniq, b"half")
    assert resumed.properties["TRANSACTION_CHECK_TIMES"] == "0"
    assert (asked.topic, asked.body, asked.properties["KEYS"]) == (topic, b"half", "K-RESUME")
    assert asked.properties["TRANSACTION_CHECK_TIMES"] == "1"  # counted from 0 again
    assert check.ext_fields["msgId"] == given_up.properties["UNIQ_KEY"] == uniq
    assert (end.code, end.remark) == (ResponseCode.SUCCESS, None)
    assert delivered == [b"plain", b"half"]


def test_each_check_asks_about_a_copy_put_back_with_its_count_and_a_commit_keeps_it(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """TransactionalMessageServiceImpl.check puts each half it asks about back into the
    half topic with TRANSACTION_CHECK_TIMES raised and asks about that copy (its offsets;
    WAIT false in what is sent); the producer's commit names the copy, so the committed
    message carries the count. An answer to the first ask, given after the second, commits
    it. Seen with the C++ client on RocketMQ 4.9.7."""
    topic, group = "TopicCheckCopy", "PG_COPY"
    broker = make_broker(transactionCheckInterval=300, transactionTimeOut=0)
    with RawClient(broker.broker_addr) as raw, RawClient(broker.broker_addr) as producer:
        assert raw.create_topic(topic, 1).code == 0
        assert producer.heartbeat("127.0.0.1@copy", producer_groups=[group]).code == 0
        uniq = "7F00000100002A9F00000000000000C1"
        props = {"TRAN_MSG": "true", "PGROUP": group, "KEYS": "K-COPY", "UNIQ_KEY": uniq}
        half = raw.send_message(topic, b"asked twice", props, group=group, sys_flag=4)
        assert half.code == 0
        _, half_phy = parse_offset_msg_id(half.ext_fields["msgId"])

        def asked() -> Any:
            return producer.wait_pushed(
                lambda c: c.code == RequestCode.CHECK_TRANSACTION_STATE, 10.0
            )

        first, second = asked(), asked()
        assert raw.indexed("RMQ_SYS_TRANS_HALF_TOPIC", 0, 3) >= 3
        stored = raw.pull_messages("RMQ_SYS_TRANS_HALF_TOPIC", 0, 0)
        end = _commit_checked(producer, group, first)
        assert end.code == ResponseCode.SUCCESS
        assert raw.indexed(topic, 0, 1) == 1
        delivered = raw.pull_messages(topic)
    copies = [m for m in stored if m.properties.get("UNIQ_KEY") == uniq]
    assert [m.properties.get("TRANSACTION_CHECK_TIMES") for m in copies[:3]] == [None, "1", "2"]
    assert copies[0].commit_log_offset == half_phy
    for check, copy in zip((first, second), copies[1:3]):
        (message,) = decode_messages(check.body)
        assert check.ext_fields["tranStateTableOffset"] == str(copy.queue_offset)
        assert check.ext_fields["commitLogOffset"] == str(copy.commit_log_offset)
        assert (message.topic, message.queue_offset) == (topic, copy.queue_offset)
        assert message.properties["WAIT"] == "false"
        assert (
            message.properties["TRANSACTION_CHECK_TIMES"]
            == copy.properties["TRANSACTION_CHECK_TIMES"]
        )
    (committed,) = delivered
    assert committed.body == b"asked twice"
    assert committed.properties["TRANSACTION_CHECK_TIMES"] == "1"


@pytest.mark.idemp_only
def test_resume_refuses_a_record_that_never_was_a_half(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """Where idemp departs from RocketMQ 4.9.7 on purpose: RocketMQ copies whatever record
    the id points at, a plain message too, into the half topic, where no producer group
    can ever be asked about it. idemp refuses it and says why; nothing is copied."""
    broker = make_broker()
    with RawClient(broker.broker_addr) as raw:
        plain = raw.send_message("TopicResumePlain", b"plain")
        halves = raw.max_offset("RMQ_SYS_TRANS_HALF_TOPIC")
        answer = raw.request(
            RequestCode.RESUME_CHECK_HALF_MESSAGE, {"msgId": plain.ext_fields["msgId"]}
        )
        assert raw.max_offset("RMQ_SYS_TRANS_HALF_TOPIC") == halves
    assert (answer.code, answer.remark) == (
        ResponseCode.SYSTEM_ERROR,
        f"message {plain.ext_fields['msgId']} is not a transaction half message "
        "(it has no REAL_TOPIC); nothing was put back",
    )


def test_committed_message_is_stored_once_with_its_half_offset(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """The committed copy points at its half message (preparedTransactionOffset) and
    carries the commit type; the half itself never reaches the consumer's queue. The op
    record ("d", the half's queue offset) follows the committed copy in the commit log;
    as in RocketMQ 4.9.7, its topic is never a topic a client can pull."""
    topic = "TopicTxStore"
    broker = make_broker()
    raw = RawClient(broker.broker_addr)
    assert raw.create_topic(topic, 1).code == 0
    script = TxScript(local={"K-C": TransactionStatus.COMMIT}, check={})
    try:
        with started(TransactionMQProducer("PG_TX2", script.checker), broker) as producer:
            result = _with_route_retry(
                lambda: producer.send_message_in_transaction(
                    _message(topic, "K-C", "c"), script.local_execute
                )
            )
            _wait_max_offset(raw, topic, 1, DELIVERY_S)
        (msg,) = raw.pull_messages(topic)
        half = raw.view(msg.prepared_transaction_offset)
        op = raw.view(msg.commit_log_offset + msg.store_size)
        assert half.topic == "RMQ_SYS_TRANS_HALF_TOPIC"
        assert msg.properties["UNIQ_KEY"] == half.properties["UNIQ_KEY"] == result.msg_id
        assert msg.sys_flag & 0xC == 0x8  # TRANSACTION_COMMIT
        assert half.sys_flag & 0xC == 0  # stored as not transactional (parseHalfMessageInner)
        assert half.properties["REAL_TOPIC"] == topic
        assert op.topic == "RMQ_SYS_TRANS_OP_HALF_TOPIC"
        assert op.body == str(half.queue_offset).encode()
        # a new Message(topic, "d", body)'s properties: WAIT true first, then the tag
        assert list(op.properties.items()) == [("WAIT", "true"), ("TAGS", "d")]
        assert raw.pull("RMQ_SYS_TRANS_OP_HALF_TOPIC", 0, 0, suspend_ms=0).code == (
            ResponseCode.TOPIC_NOT_EXIST
        )
        assert decode_messages(raw.pull(topic, 0, 0).body)[0].body == b"c"
    finally:
        raw.close()


def test_check_rounds_read_as_cid_rmq_sys_trans_and_keep_its_offsets(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """TransactionalMessageServiceImpl.check reads the half and op topics as the group
    CID_RMQ_SYS_TRANS: its consume offsets say how far the rounds went (past the halves
    put back and the ops read), its reads are a group's gets (statsAll lists it under the
    half topic), and a half put back gets no op. Seen side by side with RocketMQ 4.9.7;
    idemp wrote an op for each half put back, and kept no offsets nor counts."""
    topic, group, cid = "TopicCheckOffsets", "PG_OFFSETS", "CID_RMQ_SYS_TRANS"
    half_topic, op_topic = "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC"
    broker = make_broker(transactionCheckInterval=1000, transactionTimeOut=1000)
    with RawClient(broker.broker_addr) as raw:
        assert raw.create_topic(topic, 1).code == 0

        def half(body: bytes, uniq: str) -> RemotingCommand:
            props = {"TRAN_MSG": "true", "PGROUP": group, "UNIQ_KEY": uniq}
            sent = raw.send_message(topic, body, props, group=group, sys_flag=4)
            assert sent.code == ResponseCode.SUCCESS
            return sent

        def offset(of: str) -> tuple[int, str | None]:
            r = raw.request(
                RequestCode.QUERY_CONSUMER_OFFSET,
                {"consumerGroup": cid, "topic": of, "queueId": 0},
            )
            return r.code, r.ext_fields.get("offset")

        half(b"asked", "7F00000100002A9F00000000000000D1")  # no producer online: put back
        done = half(b"done", "7F00000100002A9F00000000000000D2")
        end = _end_sent(raw, group, done)
        assert end.code == ResponseCode.SUCCESS
        _wait_max_offset(raw, half_topic, 4, 15.0)  # two rounds put the first back twice
        # each round ends by committing its offset: past all but the copy it put back
        deadline = time.monotonic() + 10
        while offset(half_topic) != (ResponseCode.SUCCESS, str(raw.max_offset(half_topic) - 1)):
            assert time.monotonic() < deadline, (offset(half_topic), raw.max_offset(half_topic))
            time.sleep(0.05)  # a round in progress; bounded by the deadline
        assert offset(op_topic) == (ResponseCode.SUCCESS, "1")
        assert raw.max_offset(op_topic) == 1  # the commit's op; none for a half put back
        by_who = raw.request(RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": half_topic})
        assert json.loads(by_who.body) == {"groupList": [cid]}
        for read in (half_topic, op_topic):
            view = raw.request(
                RequestCode.VIEW_BROKER_STATS_DATA,
                {"statsName": "GROUP_GET_NUMS", "statsKey": f"{read}@{cid}"},
            )
            assert view.code == ResponseCode.SUCCESS, (read, view.remark)


@pytest.mark.idemp_only(
    "departs on purpose: RocketMQ stores a commit naming a half it put back, then asks "
    "about the copy again and stores the message a second time if the answer is commit"
)
def test_a_commit_naming_a_half_put_back_before_a_restart_resolves_its_copy(
    make_broker: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    """A producer whose local transaction outlasts transactionTimeOut commits the half it
    sent, after a check round has put that half back as a copy (same UNIQ_KEY). Across a
    restart the commit still stores the message once and resolves the copy: it is never
    asked about again."""
    topic, group = "TopicCommitOld", "PG_COMMIT_OLD"
    half_topic = "RMQ_SYS_TRANS_HALF_TOPIC"
    store = tmp_path / "restarted"
    broker = make_broker(store=store, transactionCheckInterval=300, transactionTimeOut=0)
    with RawClient(broker.broker_addr) as raw:
        assert raw.create_topic(topic, 1).code == 0
        props = {"TRAN_MSG": "true", "PGROUP": group, "UNIQ_KEY": "7F00000100002A9F000000E1"}
        sent = raw.send_message(topic, b"slow", props, group=group, sys_flag=4)
        assert sent.code == ResponseCode.SUCCESS
        deadline = time.monotonic() + 10
        while raw.max_offset(half_topic) < 2:  # a round put it back
            assert time.monotonic() < deadline, "the half was never put back"
            time.sleep(0.05)  # polling the half topic; bounded by the deadline
    broker.stop()
    broker = make_broker(store=store, transactionCheckInterval=300, transactionTimeOut=0)
    with RawClient(broker.broker_addr) as raw:
        assert _end_sent(raw, group, sent).code == ResponseCode.SUCCESS
        assert [m.body for m in raw.pull_messages(topic)] == [b"slow"]
        # the same answer again stores nothing more
        assert _end_sent(raw, group, sent).code == ResponseCode.SUCCESS
        put_back = raw.max_offset(half_topic)
        time.sleep(1.5)  # five check rounds, which must not put the copy back again
        assert raw.max_offset(half_topic) == put_back
        assert raw.max_offset(topic) == 1


def test_a_half_inside_its_immunity_is_put_back_each_round_and_asked_about_after(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """CHECK_IMMUNITY_TIME_IN_SECONDS: until the half is that old, each round puts it
    back with TRAN_PREPARED_QUEUE_OFFSET (the offset it was first stored at) and its
    check count raised (needDiscard raises it before the immunity is looked at), and
    asks nothing; then the producer is asked about the latest copy. Seen side by side
    with RocketMQ 4.9.7."""
    topic, group, immunity_s = "TopicImmune", "PG_IMMUNE", 3
    broker = make_broker(transactionCheckInterval=500, transactionTimeOut=0)
    with RawClient(broker.broker_addr) as raw, RawClient(broker.broker_addr) as producer:
        assert raw.create_topic(topic, 1).code == 0
        assert producer.heartbeat("127.0.0.1@immune", producer_groups=[group]).code == 0
        uniq = "7F00000100002A9F000000000000F1"
        props = {
            "TRAN_MSG": "true",
            "PGROUP": group,
            "UNIQ_KEY": uniq,
            "CHECK_IMMUNITY_TIME_IN_SECONDS": str(immunity_s),
        }
        sent_at = time.monotonic()
        half = raw.send_message(topic, b"immune", props, group=group, sys_flag=4)
        assert half.code == ResponseCode.SUCCESS
        check = producer.wait_pushed(
            lambda c: c.code == RequestCode.CHECK_TRANSACTION_STATE, immunity_s + 10.0
        )
        asked_after = time.monotonic() - sent_at
        stored = raw.pull_messages("RMQ_SYS_TRANS_HALF_TOPIC", 0, 0)
    copies = [m for m in stored if m.properties.get("UNIQ_KEY") == uniq]
    assert asked_after >= immunity_s - 0.1  # the broker's clock against ours: 100 ms
    # the half, then one copy per round: the first ones inside the immunity
    assert len(copies) >= 1 + 4
    assert copies[0].properties.get("TRAN_PREPARED_QUEUE_OFFSET") is None
    for n, copy in enumerate(copies[1:], start=1):
        assert copy.properties["TRANSACTION_CHECK_TIMES"] == str(n)
        assert copy.properties["TRAN_PREPARED_QUEUE_OFFSET"] == half.ext_fields["queueOffset"]
    # the copy asked about (a later round may have put it back again since)
    asked = [c for c in copies if str(c.queue_offset) == check.ext_fields["tranStateTableOffset"]]
    assert len(asked) == 1 and asked[0] is not copies[0]


def test_the_half_topic_is_a_topic_from_the_first_check_round(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """RocketMQ 4.9.7 does not create RMQ_SYS_TRANS_HALF_TOPIC at start: its check
    service creates it in its first round (transactionCheckInterval after start), with
    halves or without. Before that a half is stored in it all the same, but the topic
    has no config, no route, and a pull is TOPIC_NOT_EXIST; the op topic never has one.
    Seen side by side with these requests (2026-11-28)."""
    # The round's clock starts with the broker, so the time is taken before it starts;
    # 10 s leaves room for a JVM's boot (RocketMQ) before the early requests.
    interval_s = 10.0
    started_at = time.monotonic()
    broker = make_broker(transactionCheckInterval=int(interval_s * 1000))
    half_topic, op_topic = "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC"
    with RawClient(broker.broker_addr) as raw, RawClient(broker.namesrv_addr) as ns:
        assert raw.create_topic("TopicTxFirst", 1).code == 0
        props = {"TRAN_MSG": "true", "PGROUP": "PG_FIRST", "UNIQ_KEY": "7F000001000000000000000A"}
        sent = raw.send_message("TopicTxFirst", b"h", props, group="PG_FIRST", sys_flag=4)
        assert sent.code == 0
        end = _end_sent(raw, "PG_FIRST", sent)
        assert end.code == ResponseCode.SUCCESS
        early = raw.topic_names()
        early_pull = raw.pull(half_topic, 0, 0, suspend_ms=0).code
        early_route = ns.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": half_topic}).code
        assert time.monotonic() - started_at < interval_s  # all of it before the first round
        deadline = started_at + interval_s + 10.0  # the round, on a busy machine
        while half_topic not in raw.topic_names():
            assert time.monotonic() < deadline, "no half topic after the first check round"
            time.sleep(0.1)  # polling the broker's table; bounded by the deadline
        late = raw.topic_names()
        late_pull = raw.pull(half_topic, 0, 0, suspend_ms=0)
        late_route = ns.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": half_topic}).code
        op_route = ns.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": op_topic}).code
    assert half_topic not in early and op_topic not in early
    assert early_pull == early_route == ResponseCode.TOPIC_NOT_EXIST
    assert op_topic not in late
    assert late_route == ResponseCode.SUCCESS
    assert op_route == ResponseCode.TOPIC_NOT_EXIST
    assert late_pull.code == ResponseCode.SUCCESS
    assert [m.body for m in decode_messages(late_pull.body)] == [b"h"]

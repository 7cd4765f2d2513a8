"""The OrderlyRunner's guarantees with real processes: ``idemp consume --orderly``
children join, leave (SIGTERM) and die (SIGKILL) while ``idemp produce`` sends
messages orderly by sharding key. Everything is judged from the consumers' records
(one JSON line per message, written when the listener returns)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from idemp.broker.process import BrokerProcess
from tests.client.conftest import FAST_DELAYS, ConsumeProcess, run_produce, wait_for

BATCH = 4


def orderly_args(broker: BrokerProcess, topic: str, group: str, *extra: str) -> list[str]:
    return [
        "--namesrv", broker.namesrv_addr, "--topic", topic, "--group", group,
        "--orderly", "--from", "first", "--batch-size", str(BATCH), "--threads", "4",
        "--rebalance-interval", "0.5", "--lock-renew-interval", "0.3", "--lock-expiry", "1.5",
        "--persist-interval", "1", "--pull-retry-delay", "0.2", "--commit-each-batch",
        *extra,
    ]  # fmt: skip


def overlaps(records: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Pairs of records of one queue from different processes whose listener runs
    overlapped in time."""
    by_queue: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_queue[r["queue"]].append(r)
    bad = []
    for recs in by_queue.values():
        recs.sort(key=lambda r: r["start"])
        latest_end: dict[int, float] = {}
        for r in recs:
            for pid, end in latest_end.items():
                if pid != r["pid"] and end > r["start"]:
                    bad.append((r, {"pid": pid, "end": end}))
            latest_end[r["pid"]] = max(latest_end.get(r["pid"], 0.0), r["end"])
    return bad


def order_violations(records: list[dict[str, Any]]) -> list[str]:
    """Per key, first deliveries must come in index order (a redelivery may repeat an
    index, never introduce one ahead of its predecessor)."""
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_key[r["keys"][0]].append(r)
    bad = []
    for key, recs in by_key.items():
        recs.sort(key=lambda r: r["start"])
        seen: set[int] = set()
        last = -1
        for r in recs:
            if r["index"] in seen:
                continue
            if r["index"] < last:
                bad.append(f"{key}: {r['index']} first delivered after {last}")
            seen.add(r["index"])
            last = max(last, r["index"])
    return bad


@pytest.mark.slow
def test_order_and_exclusivity_through_join_leave_and_kill(
    make_broker: Callable[..., BrokerProcess], consumers: Callable[..., ConsumeProcess]
) -> None:
    """Four phases of 300 messages (16 keys, 8 queues), each sent once the consumers of
    that phase hold their queues, so every step is driven by state, not by timing."""
    broker = make_broker(messageDelayLevel=FAST_DELAYS, rebalanceLockMaxLiveTime=3000)
    topic, group, phase = "OT", "og", 300
    total = 4 * phase
    sent = [0]

    def produce() -> None:
        summary = run_produce(
            "--namesrv", broker.namesrv_addr, "--topic", topic, "--count", str(sent[0] + phase),
            "--sharding-key-count", "16", "--queue-nums", "8", "--skip", str(sent[0]),
        )  # fmt: skip
        assert summary["sent"] == phase
        sent[0] += phase

    def held(p: ConsumeProcess) -> set[int]:
        events = [e for e in p.events("queues") if e["topic"] == topic]
        return set(events[-1]["queues"]) if events else set()

    def start(name: str) -> ConsumeProcess:
        p = consumers(name, *orderly_args(broker, topic, group, "--sleep-ms", "40"))
        p.wait_started()
        return p

    def phase_records(p: ConsumeProcess, k: int) -> int:
        return sum(1 for r in p.records() if k * phase <= r["index"] < (k + 1) * phase)

    produce()  # phase 0 (creates the topic)
    a = start("a")
    wait_for(lambda: len(held(a)) == 8, 30, "a to hold all 8 queues")
    wait_for(lambda: phase_records(a, 0) >= 30, 30, "a to consume")
    b = start("b")
    wait_for(lambda: len(held(b)) == 4 and len(held(a)) == 4, 30, "a and b to split the queues")
    produce()  # phase 1
    wait_for(lambda: phase_records(b, 1) >= 30, 30, "b to consume its queues")
    c = start("c")
    wait_for(lambda: held(a) | held(b) | held(c) == set(range(8)) and len(held(c)) >= 2, 30,
             "c to take its share")  # fmt: skip
    produce()  # phase 2
    wait_for(lambda: phase_records(c, 2) >= 10, 30, "c to consume its queues")
    assert b.terminate() == 0  # leaves cleanly: finishes its batch, commits, unlocks
    assert b.events("stopped")
    wait_for(lambda: held(a) | held(c) == set(range(8)) and len(held(a)) == 4, 30,
             "a and c to take over b's queues")  # fmt: skip
    produce()  # phase 3: a backlog, 40 ms per message
    wait_for(lambda: phase_records(a, 3) >= 8, 30, "a to be busy with the backlog")
    a.kill()  # almost surely in the middle of a batch (4 messages of 40 ms)
    d = start("d")

    def consumed() -> set[int]:
        return {r["index"] for p in (a, b, c, d) for r in p.records() if r["ok"]}

    wait_for(lambda: consumed() == set(range(total)), 60, "every message to be consumed")
    assert c.terminate() == 0 and d.terminate() == 0
    records = [r for p in (a, b, c, d) for r in p.records()]
    assert {r["pid"] for r in records} >= {a.pid, b.pid, c.pid}
    assert order_violations(records) == []
    assert overlaps(records) == []
    # Duplicates: only messages the killed process finished but had not committed, at
    # most one batch per queue it held, each re-consumed by another process.
    count: dict[int, int] = defaultdict(int)
    for r in records:
        count[r["index"]] += 1
    dups = {i for i, n in count.items() if n > 1}
    a_done = {r["index"]: r for r in a.records()}
    assert dups <= set(a_done), f"duplicates not from the killed process: {dups - set(a_done)}"
    per_queue: dict[int, int] = defaultdict(int)
    for i in dups:
        assert count[i] == 2
        per_queue[a_done[i]["queue"]] += 1
    assert all(n <= BATCH for n in per_queue.values()), per_queue
    assert len(dups) <= BATCH * 8  # 8 queues


@pytest.mark.slow
def test_slow_listener_keeps_its_lock_by_renewal(
    make_broker: Callable[..., BrokerProcess], consumers: Callable[..., ConsumeProcess]
) -> None:
    """Listener time 5 s > the broker's lock expiry 3 s: renewal every 0.5 s keeps
    the lock, so a consumer joining meanwhile waits for the queue instead of taking it.

    The margins are wide on purpose: the lock is lost only if the holder gets no CPU
    for 2.5 s (client expiry) — which a 2-core machine running other suites can do to
    sub-second margins — and the assertion would then blame the protocol for the load.
    """
    broker = make_broker(messageDelayLevel=FAST_DELAYS, rebalanceLockMaxLiveTime=3000)
    topic, group = "SL", "slow"
    summary = run_produce(
        "--namesrv", broker.namesrv_addr, "--topic", topic, "--count", "4", "--queue-nums", "2"
    )  # fmt: skip
    assert summary["queues"] == {"0": 2, "1": 2}
    base = [
        "--namesrv", broker.namesrv_addr, "--topic", topic, "--group", group, "--orderly",
        "--from", "first", "--rebalance-interval", "0.5", "--lock-renew-interval", "0.5",
        "--lock-expiry", "2.5", "--pull-retry-delay", "0.2",
    ]  # fmt: skip
    a = consumers("a", *base, "--sleep-ms", "5000")
    a.wait_started()
    wait_for(lambda: len(a.records()) >= 1, 30, "a to finish its first slow message")
    b = consumers("b", *base)
    b.wait_started()

    def all_done() -> bool:
        return len({r["index"] for p in (a, b) for r in p.records()}) == 4

    wait_for(all_done, 60, "all 4 messages")
    assert a.terminate() == 0 and b.terminate() == 0
    records = a.records() + b.records()
    assert overlaps(records) == []
    assert sorted(r["index"] for r in records) == list(range(4))  # no duplicates

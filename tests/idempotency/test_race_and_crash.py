"""Concurrency and crashes across real processes.

Race: 4 processes × 8 threads deliver the same 1,000 keys at once; every business effect
happens exactly once (counted in the business table, which has no unique key).
Crash: a consumer SIGKILLed between its claim and its commit; after the deadline another
consumer takes the key over; exactly one effect.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from idemp import Message, Outcome, idempotent
from tests.idempotency.effects import Effects
from tests.idempotency.specs import build
from tests.idempotency.workers import NS

ROOT = Path(__file__).resolve().parents[2]
PROCESSES, THREADS, KEYS = 4, 8, 1000


def _spawn(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.idempotency.workers", *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _readline(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().strip()


#: What the 4 × 8 deliveries of each key end as, besides its one effect: claim strategies
#: absorb the others as duplicates; the optimistic version drops them as stale; under a
#: row lock or a distributed lock the handler runs and finds the effect already there.
OTHERS = {
    "pg": "DUPLICATE",
    "sqlite_tx": "DUPLICATE",
    "redis": "DUPLICATE",
    "pg_optimistic": "DROPPED",
    "pg_pessimistic": "PROCESSED",
    "redisson": "PROCESSED",
}


def run_race(
    spec: dict[str, Any],
    pg_url: str,
    processes: int = PROCESSES,
    threads: int = THREADS,
    keys: int = KEYS,
    batch: int = 1,
) -> tuple[dict[str, int], dict[str, int]]:
    """``processes`` × ``threads`` deliver the same ``keys`` at once (``spec``'s strategy,
    built in each worker process) → (effects per key in the business table, outcome
    totals over every delivery). Asserts every worker finished without error."""
    effects = Effects(spec, pg_url)  # creates the business table up front
    build(spec).close()  # and the dedup table, so the workers do not race to create it
    procs = [
        _spawn(["race", json.dumps(spec), pg_url, str(threads), str(keys), str(p), str(batch)])
        for p in range(processes)
    ]
    try:
        assert [_readline(p) for p in procs] == ["ready"] * processes
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        reports = [json.loads(_readline(p)) for p in procs]
        for p in procs:
            assert p.wait(60) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    assert [r["errors"] for r in reports] == [[]] * processes
    counts = effects.counts()
    effects.close()
    totals: dict[str, int] = {}
    for r in reports:
        for outcome, n in r["counts"].items():
            totals[outcome] = totals.get(outcome, 0) + n
    return counts, totals


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(OTHERS))
def test_race_every_effect_exactly_once(kind: str, make_spec: Any, postgres_server: Any):
    spec = make_spec(kind, lock_timeout_s=2.0)
    counts, totals = run_race(spec, postgres_server.url)

    assert len(counts) == KEYS
    assert set(counts.values()) == {1}
    acked = PROCESSES * THREADS * KEYS
    others = OTHERS[kind]
    expected = (
        {"PROCESSED": KEYS, others: acked - KEYS} if others != "PROCESSED" else {"PROCESSED": acked}
    )
    # Only "reconsume later" answers may come on top (the lock or claim was busy).
    assert {k: v for k, v in totals.items() if k != "IN_PROGRESS"} == expected


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["pg", "pg_tx", "sqlite_tx", "redis"])
def test_race_on_the_batch_path(kind: str, make_spec: Any, postgres_server: Any):
    """The same race through ``consume_batch`` (batches of 16, each thread's keys in its
    own order): batches of different processes claim overlapping keys at once."""
    spec = make_spec(kind, lock_timeout_s=2.0)
    keys = 400
    counts, totals = run_race(spec, postgres_server.url, keys=keys, batch=16)

    assert len(counts) == keys
    assert set(counts.values()) == {1}
    acked = PROCESSES * THREADS * keys
    assert {k: v for k, v in totals.items() if k != "IN_PROGRESS"} == {
        "PROCESSED": keys,
        "DUPLICATE": acked - keys,
    }


@pytest.mark.parametrize("kind", ["redis", "pg", "sqlite", "pg_tx", "sqlite_tx"])
def test_sigkill_between_claim_and_commit(kind: str, make_spec: Any, postgres_server: Any):
    deadline = 1.0
    spec = make_spec(kind, deadline_s=deadline, lock_timeout_s=0.5)
    effects = Effects(spec, postgres_server.url)
    strategy = build(spec)
    child = _spawn(["crash", json.dumps(spec), postgres_server.url, "k-crash"])
    try:
        assert _readline(child) == "claimed"
        child.send_signal(signal.SIGKILL)
        assert child.wait(10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()

    @idempotent(key="keys", strategy=strategy, namespace=NS, pass_context=True)
    def handle(message: Message, ctx: Any) -> None:
        effects.apply(message, ctx)

    def deliver() -> Any:
        return handle(Message("Orders", b"{}", keys=("k-crash",), msg_id="crash-2"))

    if kind.endswith("_tx"):
        # The dead connection's transaction is rolled back: claim and effect are gone.
        # PostgreSQL notices the closed socket at once; allow it a bounded moment.
        end = time.monotonic() + 10
        result = deliver()
        while result.outcome is Outcome.IN_PROGRESS and time.monotonic() < end:
            time.sleep(0.1)  # polling the server's cleanup of the killed backend
            result = deliver()
        assert (result.outcome, result.takeover) == (Outcome.PROCESSED, False)
    else:
        assert deliver().outcome is Outcome.IN_PROGRESS  # within the deadline: not ours
        time.sleep(deadline + 0.3)  # the deadline is time itself (0.3 s margin)
        result = deliver()
        assert (result.outcome, result.takeover) == (Outcome.PROCESSED, True)
    assert deliver().outcome is Outcome.DUPLICATE
    assert effects.counts() == {"k-crash": 1}
    strategy.close()
    effects.close()

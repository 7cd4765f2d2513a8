"""The chaos suite, short: ``chaos.run`` with 1,200 messages and one of every fault, on
one broker and on a cluster of two.

Real processes throughout: idemp's broker (SYNC_FLUSH), PostgreSQL, Redis, three
consumer processes and one of RocketMQ 5's official client (POP over gRPC). Faults fire
at seeded points of the consumption progress: 3 consumers SIGKILLed (and replaced), a
consumer added and removed, the broker SIGKILLed and restarted, Redis (empty) and
PostgreSQL restarted.

Why the verdict cannot depend on timing: the faults are placed by progress (effects
applied), not by the clock, and all must have fired before the run may complete; the run
completes only when every business message has an effect, and the verdict is read from
the effects table after every consumer has stopped, so nothing applied later is missed.
Every wait is bounded (worker start 120 s, a send retried 180 s, the run 420 s); reaching
a bound is reported in ``figures.notes`` and fails with that reason, never silently.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.run import Figures, run

pytestmark = pytest.mark.timeout(900)


def _short_run(tmp_path: Path, brokers: int) -> tuple[Figures, list[str]]:
    """1,200 messages (seed 11), every fault once; on a cluster, each broker killed once."""
    lines: list[str] = []
    figures = run(
        1_200,
        seed=11,
        kills=3,
        broker_restarts=brokers,
        redis_restarts=1,
        postgres_restarts=1,
        timeout_s=420.0,
        workdir=tmp_path,
        rate=60.0,
        say=lines.append,
        brokers=brokers,
    )
    print("\n".join(lines))
    print(figures.line())
    assert figures.notes == []
    assert figures.completed
    assert figures.faults_pending == 0
    assert (figures.kills, figures.broker_restarts, figures.redis_restarts) == (3, brokers, 1)
    assert (figures.postgres_restarts, figures.added, figures.removed) == (1, 1, 1)
    # 360 payments, 120 payments for the RocketMQ 5 consumer, 9 streams x 40, 60 rides x 6
    assert figures.messages == 1_200
    assert figures.counters["pay5.processed"] > 0  # the 5.x PushConsumer took its part
    assert figures.effects == figures.messages
    assert figures.doubled == 0
    assert figures.lost == 0
    assert figures.unexpected == 0
    assert figures.order_violations == 0
    # The reconciliation job, over the broker's history, the dedup records, the effects
    # and the offsets, agrees: every planned key, none doubled, lost or stuck.
    r = figures.reconciled
    assert figures.reconcile_exit == 0, figures.notes
    assert r is not None
    assert r["keys"] == figures.messages
    assert (r["doubled"], r["lost"], r["stuck"], r["effect_missing"]) == (0, 0, 0, 0)
    assert r["pending"] == 0  # every consumer stopped cleanly after the last effect
    assert r["dead_lettered"] == 0
    return figures, lines


def test_short_chaos_run_keeps_exactly_once_and_order(tmp_path: Path) -> None:
    _short_run(tmp_path, brokers=1)


def test_short_chaos_run_on_two_brokers_survives_each_ones_death(tmp_path: Path) -> None:
    """The same run on a cluster: ``idemp namesrv`` and two brokers registering with it;
    each broker SIGKILLed once while the others work on (its queues leave the routes as
    its connection closes, and come back with it). The reconciliation reads both stores'
    exports and each broker's offsets, named."""
    _, lines = _short_run(tmp_path, brokers=2)
    assert [line.split("] ")[1] for line in lines if "SIGKILLed and restarted" in line] == [
        "broker-a SIGKILLed and restarted",
        "broker-b SIGKILLed and restarted",
    ]

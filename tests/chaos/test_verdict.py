"""The chaos verdict counts what it claims to count: doubled effects, lost messages and
per-key order violations, read from a planted effects table (SQLite)."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from chaos.app import EFFECTS, METADATA
from chaos.run import Figures, verdict
from chaos.scenario import PAY_TOPIC, RIDES_TOPIC, SEQ_TOPIC, Plan, Send, make_plan


def test_plan_is_seeded() -> None:
    kw = dict(kills=10, broker_restarts=3, redis_restarts=1, postgres_restarts=1)
    a, b = make_plan(1200, seed=3, **kw), make_plan(1200, seed=3, **kw)
    assert (a.lanes, a.faults) == (b.lanes, b.faults)
    assert a.messages == 1200
    assert [f.kind for f in a.faults].count("kill_consumer") == 10
    kinds = [f.kind for f in a.faults]
    assert kinds.index("add_consumer") < kinds.index("remove_consumer")
    c = make_plan(1200, seed=4, **kw)
    assert c.faults != a.faults


def test_verdict_finds_doubles_losses_and_order_violations(tmp_path: Path) -> None:
    plan = Plan(seed=0)
    plan.pay = [Send(PAY_TOPIC, f"pay-{i}", b"{}", None) for i in range(3)]
    plan.seq = [Send(SEQ_TOPIC, f"s#{n}", b"{}", "s") for n in range(4)]
    plan.rides = [Send(RIDES_TOPIC, f"r->{n}", b"{}", None) for n in range(3)]
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'e.db'}")
    METADATA.create_all(engine)
    rows = [
        (PAY_TOPIC, "pay-0", "pay-0", 0, False),
        (PAY_TOPIC, "pay-1", "pay-1", 0, False),
        (PAY_TOPIC, "pay-1", "pay-1", 0, False),  # doubled
        # pay-2 lost
        (SEQ_TOPIC, "s#0", "s", 0, False),
        (SEQ_TOPIC, "s#2", "s", 2, True),  # applied ahead of s#1: a violation
        (SEQ_TOPIC, "s#1", "s", 1, False),  # behind: a violation
        (SEQ_TOPIC, "s#3", "s", 3, False),
        (RIDES_TOPIC, "r->0", "r", 0, False),
        (RIDES_TOPIC, "r->1", "r", 1, False),
        (RIDES_TOPIC, "r->2", "r", 2, False),
        (RIDES_TOPIC, "r->9", "r", 9, False),  # never sent; also out of order
    ]
    with engine.begin() as conn:
        for i, (topic, key, entity, n, gap) in enumerate(rows, 1):
            conn.execute(
                EFFECTS.insert().values(
                    id=i, topic=topic, key=key, entity=entity, n=n, gap=gap, pid=1, msg_id=f"m{i}"
                )
            )
    figures = Figures(seed=0, messages=plan.messages)
    verdict(engine, plan, figures)
    assert (figures.effects, figures.doubled, figures.lost, figures.unexpected) == (11, 1, 1, 1)
    assert figures.order_violations == 3
    assert not figures.ok

"""Decorated listeners on the official RocketMQ 5 client (idemp.adapters.rocketmq5),
end to end against idemp's gRPC endpoint: producer duplicates and lost acks (forced
redeliveries) leave every effect exactly once; FIFO keeps each message group's order."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from idemp.adapters import rocketmq5
from tests.broker.rawclient import RawClient

from .conftest import Client5, Endpoint5, v5_python

CHILD = Path(__file__).with_name("idemp5.py")


def _run(spec: dict[str, Any], log: Path, script: Path = CHILD) -> dict[str, Any]:
    """Run a child script of this folder in .cache/v5-venv; its last line, as JSON."""
    with open(log, "a", encoding="utf-8") as err:
        done = subprocess.run(
            [str(v5_python()), str(script), json.dumps(spec)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            timeout=spec["within"] + 60,
            env={"HOME": str(log.parent), "PATH": "/usr/bin:/bin"},
        )
    assert done.returncode == 0, f"exit {done.returncode}; log: {log}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def _effects(db: Path) -> list[tuple[str, str, int]]:
    engine = sa.create_engine(f"sqlite:///{db}")
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT id, grp, seq FROM effects ORDER BY n")).all()
    engine.dispose()
    return [tuple(r) for r in rows]


def _simple_spec(
    broker5: Endpoint5,
    admin: RawClient,
    sender: Client5,
    names: Callable[[str], str],
    tmp_path: Path,
    ids: list[str],
) -> dict[str, Any]:
    """A new topic holding one message per id (``{"id": ...}``), and the child's spec to
    consume it with the SimpleConsumer loop (the test adds what it checks)."""
    topic, group = names("T"), names("G")
    assert admin.create_topic(topic, 4).code == 0
    sender.ok("producer", name="p", topics=[topic])
    sender.ok(
        "send", name="p", messages=[{"topic": topic, "body": json.dumps({"id": i})} for i in ids]
    )
    return {
        "mode": "simple",
        "endpoint": broker5.grpc_addr,
        "topic": topic,
        "group": group,
        "db": str(tmp_path / "effects.db"),
        "invisible": broker5.invisible_s,
    }


def test_simple_consumer_loop_each_effect_once(
    broker5: Endpoint5,
    admin: RawClient,
    client5: Callable[[], Client5],
    names: Callable[[str], str],
    tmp_path: Path,
) -> None:
    ids = [f"o-{i}" for i in range(10)] + ["o-3", "o-7"]  # two producer retries
    spec = _simple_spec(broker5, admin, client5(), names, tmp_path, ids)
    spec.update(keys=10, lose_first=["o-1", "o-5"], within=90)
    result = _run(spec, tmp_path / "idemp5-simple.log")
    assert result["again"] == ["o-1", "o-5"]
    effects = _effects(tmp_path / "effects.db")
    assert sorted(e[0] for e in effects) == sorted(f"o-{i}" for i in range(10))
    assert result["stats"]["processed"] == 10
    assert result["stats"]["duplicates"] == 4  # two producer retries, two lost acks
    # the loop's own count: every delivery the listener acked was acked at the broker (the
    # acks of a batch go out together), the two thrown-away results were not
    counts = result["counts"]
    assert (counts["acked"], counts["later"], counts["errors"]) == (12, 2, 0), counts


def test_simple_consumer_loop_brings_a_message_back_when_the_listener_says(
    broker5: Endpoint5,
    admin: RawClient,
    client5: Callable[[], Client5],
    names: Callable[[str], str],
    tmp_path: Path,
) -> None:
    """``ReconsumeLater(after=1)``: the loop makes the message invisible for a second
    instead of what is left of its minute, so it is back well before the minute ends."""
    spec = _simple_spec(broker5, admin, client5(), names, tmp_path, ["o-0", "o-1", "o-2"])
    spec.update(keys=3, lose_first=["o-1"], later_after=1, invisible=60, within=45)
    result = _run(spec, tmp_path / "idemp5-later.log")
    assert result["again"] == ["o-1"]
    assert result["gaps"]["o-1"] < 60
    assert result["counts"]["later"] == 1
    assert sorted(e[0] for e in _effects(tmp_path / "effects.db")) == ["o-0", "o-1", "o-2"]


def test_push_consumer_fifo_order_and_each_effect_once(
    broker5: Endpoint5,
    admin: RawClient,
    client5: Callable[[], Client5],
    names: Callable[[str], str],
    tmp_path: Path,
) -> None:
    topic, group = names("F"), names("GF")
    assert admin.create_topic(topic, 4, attributes="+message.type=FIFO").code == 0
    assert admin.create_group(group, consumeMessageOrderly=True).code == 0
    sender = client5()
    sender.ok("producer", name="p", topics=[topic])
    groups = ["rider-a", "rider-b", "rider-c"]
    messages = [
        {"topic": topic, "body": json.dumps({"id": f"{g}/{s}", "seq": s}), "message_group": g}
        for s in range(4)
        for g in groups
    ]
    messages.append(dict(messages[4]))  # a producer retry of rider-b/1
    sender.ok("send", name="p", messages=messages)
    spec = {
        "mode": "push",
        "endpoint": broker5.grpc_addr,
        "topic": topic,
        "group": group,
        "db": str(tmp_path / "effects.db"),
        "keys": 12,
        "lose_first": ["rider-a/1", "rider-c/2"],
        "within": 90,
    }
    result = _run(spec, tmp_path / "idemp5-push.log")
    assert result["again"] == ["rider-a/1", "rider-c/2"]
    effects = _effects(tmp_path / "effects.db")
    for g in groups:
        assert [seq for _, grp, seq in effects if grp == g] == [0, 1, 2, 3]
    assert len(effects) == 12
    assert result["stats"]["processed"] == 12
    assert result["stats"]["duplicates"] == 3


def test_a_message_back_while_its_first_handler_runs_is_in_progress(
    broker5: Endpoint5,
    admin: RawClient,
    client5: Callable[[], Client5],
    names: Callable[[str], str],
    tmp_path: Path,
) -> None:
    topic, group = names("T"), names("G")
    assert admin.create_topic(topic, 1).code == 0
    sender = client5()
    sender.ok("producer", name="p", topics=[topic])
    sender.ok("send", name="p", messages=[{"topic": topic, "body": json.dumps({"id": "slow-1"})}])
    spec = {
        "endpoint": broker5.grpc_addr,
        "topic": topic,
        "group": group,
        "db": str(tmp_path / "effects.db"),
        "invisible": broker5.invisible_s,
        # longer than the invisible time and the revive lag: RocketMQ hands a message out
        # again 12–25 s after 10 s of invisibility, idemp within half a second of it
        "slow_s": 28 if broker5.real else 3 * broker5.invisible_s,
        "within": 90,
    }
    result = _run(spec, tmp_path / "slow5.log", CHILD.with_name("slow5.py"))
    stats = result["stats"]
    # the handler ran once; the delivery that came back meanwhile was "in progress"
    assert len(result["runs"]) == 1, result
    assert stats["processed"] == 1 and stats["in_progress"] >= 1, stats
    assert stats["duplicates"] == 1, stats
    assert _effects_ids(tmp_path / "effects.db") == ["slow-1"]


def _effects_ids(db: Path) -> list[str]:
    engine = sa.create_engine(f"sqlite:///{db}")
    with engine.connect() as conn:
        ids = [r[0] for r in conn.execute(sa.text("SELECT id FROM effects"))]
    engine.dispose()
    return ids


def test_guarded_fifo_a_held_transition_holds_back_only_its_ride(
    broker5: Endpoint5,
    admin: RawClient,
    client5: Callable[[], Client5],
    names: Callable[[str], str],
    tmp_path: Path,
) -> None:
    from idemp.broker.v5.service import consistent_hash
    from idemp.remoting.javahash import java_string_hash as java_hash

    topic, group = names("F"), names("GF")
    assert admin.create_topic(topic, 4, attributes="+message.type=FIFO").code == 0
    # three tries in all (the client's local retries), then the DLQ, then the ride goes on
    assert admin.create_group(group, consumeMessageOrderly=True, retryMaxTimes=2).code == 0
    r1, r2 = "ride-1", "ride-3"  # the proxy hashes them to different queues
    assert consistent_hash(java_hash(r1), 4) != consistent_hash(java_hash(r2), 4)
    steps = {
        # ride-1's producer sent driver_departed before driver_assigned: it is held
        r1: ["created", "driver_departed", "driver_assigned"],
        r2: ["created", "driver_assigned", "driver_departed"],
    }
    sender = client5()
    sender.ok("producer", name="p", topics=[topic])
    sender.ok(
        "send",
        name="p",
        messages=[
            {"topic": topic, "body": json.dumps({"ride": r, "state": s}), "message_group": r}
            for r, states in steps.items()
            for s in states
        ],
    )
    spec = {
        "endpoint": broker5.grpc_addr,
        "topic": topic,
        "group": group,
        "db": str(tmp_path / "rides.db"),
        "expect": 5,
        "within": 90,
    }
    result = _run(spec, tmp_path / "guard5.log", CHILD.with_name("guard5.py"))
    applied = result["applied"]
    order = {r: [a["state"] for a in applied if a["ride"] == r] for r in steps}
    assert order == {r1: ["created", "driver_assigned"], r2: steps[r2]}
    # ride-2 finished while ride-1 was held back
    last_r2 = max(a["at"] for a in applied if a["ride"] == r2)
    r1_assigned = next(
        a["at"] for a in applied if a["ride"] == r1 and a["state"] == "driver_assigned"
    )
    assert last_r2 < r1_assigned
    assert result["stats"]["held"] == 3  # the three tries of ride-1's driver_departed
    # the held transition went where an operator sees it: %DLQ%<group>
    with RawClient(broker5.broker_addr) as remoting:
        dlq = remoting.pull_messages(f"%DLQ%{group}", 0)
    assert [json.loads(m.body) for m in dlq] == [{"ride": r1, "state": "driver_departed"}]


def test_the_loop_waits_for_the_servers_settings_before_its_first_receive() -> None:
    """RocketMQ 5 fails a receive that comes before the client's settings arrived (see
    test_bad_input); the SimpleConsumer's startup does not wait for them, so the loop
    does, on the client's own event (a stand-in client: when the settings arrive is the
    point, and no server lets a test choose it)."""

    class Consumer:
        def __init__(self) -> None:
            self._init_settings_event = threading.Event()
            self.settled: list[bool] = []  # per receive: had the settings arrived?

        def receive(self, max_messages: int, invisible_duration: int) -> list[Any]:
            self.settled.append(self._init_settings_event.is_set())
            return []

    consumer = Consumer()
    arrive = threading.Timer(0.3, consumer._init_settings_event.set)
    arrive.start()
    counts = rocketmq5.consume(consumer, lambda m: None, group="G", rounds=2)
    arrive.join()
    assert consumer.settled == [True, True]
    assert counts == {"acked": 0, "later": 0, "receives": 2, "errors": 0}

"""The chaos run: ``python -m chaos [--messages N] [--seed S]`` (``make chaos``).

idemp's broker (SYNC_FLUSH), PostgreSQL and Redis start on free loopback ports; three
consumer processes (``chaos.worker``) consume three topics with three strategies
(``chaos.scenario``) while one producer thread per topic sends the plan, producer
duplicates included. As consumption progresses, the seeded faults fire in order:
consumers SIGKILLed (and a replacement started), a consumer added and later removed
(rebalance), the broker SIGKILLed and restarted on the same store and ports, Redis and
PostgreSQL restarted. When every business message has taken effect (or the time bound
is reached), the consumers stop and the verdict is read from the business tables:
doubled effects, lost messages, per-key order violations. Then the broker stops and the
Spark reconciliation job reads what the run left (``chaos.reconcile``): a second verdict
that must agree. One line of figures; exit 0 only when all are 0 and every planned
fault fired.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from chaos.app import EFFECTS, create_schema
from chaos.scenario import (
    ADD,
    BROKER,
    KILL,
    PAY5_TOPIC,
    PAY_TOPIC,
    POSTGRES,
    REDIS,
    REMOVE,
    RIDES_TOPIC,
    SEQ_TOPIC,
    Fault,
    Plan,
    Send,
    make_plan,
)
from idemp.broker.process import die_with_parent, kill_process, stop_process
from idemp.tools.admin import update_topic

ROOT = Path(__file__).resolve().parents[1]
WORKER_START_S = 120.0  # a worker imports SQLAlchemy, redis, the client: slow on a busy box
SEND_GIVE_UP_S = 180.0  # a send retried for this long means the broker is not coming back
POLL_S = 0.2  # progress polling period (a bound, not a synchronisation)
V5_SLOT = 10  # the RocketMQ 5 consumer's slot (killed and replaced like the others)
V5_PYTHON = ROOT / ".cache" / "v5-venv" / "bin" / "python"  # make v5-venv
BROKER_PROPERTIES = {
    "flushDiskType": "SYNC_FLUSH",
    "messageDelayLevel": " ".join(["1s"] * 18),  # a reconsumed message is back after 1 s
    "rebalanceLockMaxLiveTime": "3000",  # queue locks of a killed consumer expire in 3 s
    "flushConsumerOffsetInterval": "500",
}


class Worker:
    """One consumer process."""

    def __init__(self, slot: int, cmd: list[str], stats: Path, log: Path) -> None:
        self.slot, self.cmd, self.stats, self.log_path = slot, cmd, stats, log
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> Worker:
        with open(self.log_path, "a", encoding="utf-8") as log:
            self.proc = subprocess.Popen(
                self.cmd,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                preexec_fn=die_with_parent(signal.SIGKILL),
            )
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            line = ""
            if sel.select(timeout=WORKER_START_S):
                line = self.proc.stdout.readline()
        if not line.startswith("worker started"):
            self.kill()
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(
                f"consumer {self.slot} did not start in {WORKER_START_S:.0f} s:\n{tail}"
            )
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else -1

    def kill(self) -> None:
        if self.proc is None:
            return
        kill_process(self.proc)
        self._close()

    def stop(self, timeout: float = 90.0) -> int:
        """SIGTERM: the runners finish their batches and persist offsets."""
        if self.proc is None:
            return 0
        code = stop_process(self.proc, timeout)
        self._close()
        return code

    def _close(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()


@dataclass
class Figures:
    seed: int
    messages: int
    duplicates_sent: int = 0
    resends: int = 0  # sends retried after an error (may have been stored: more duplicates)
    absorbed: int = 0  # deliveries that found their effect already applied
    kills: int = 0
    broker_restarts: int = 0
    redis_restarts: int = 0
    postgres_restarts: int = 0
    added: int = 0
    removed: int = 0
    effects: int = 0
    doubled: int = 0
    lost: int = 0
    unexpected: int = 0
    order_violations: int = 0
    faults_pending: int = 0
    completed: bool = False
    wall_s: float = 0.0
    counters: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # The reconciliation job's verdict over the same run (None: not run).
    reconciled: dict[str, int] | None = None
    reconcile_exit: int | None = None

    @property
    def ok(self) -> bool:
        return (
            self.completed
            and self.doubled == 0
            and self.lost == 0
            and self.unexpected == 0
            and self.order_violations == 0
            and self.faults_pending == 0
            and self.reconciliation_agrees
        )

    @property
    def reconciliation_agrees(self) -> bool:
        """The report finds every planned key, none doubled, lost or stuck, and exits 0
        (``True`` when the run was told not to reconcile)."""
        if self.reconcile_exit is None:
            return True
        r = self.reconciled or {}
        return (
            self.reconcile_exit == 0
            and r.get("keys") == self.messages
            and r.get("doubled", -1) == 0
            and r.get("lost", -1) == 0
            and r.get("stuck", -1) == 0
            and r.get("effect_missing", -1) == 0
        )

    def line(self) -> str:
        return (
            f"chaos {'OK' if self.ok else 'FAILED'}: messages {self.messages} "
            f"(+{self.duplicates_sent} producer duplicates, {self.resends} resends), "
            f"duplicates delivered and absorbed >= {self.absorbed}, kills {self.kills}, "
            f"restarts broker {self.broker_restarts} redis {self.redis_restarts} "
            f"postgres {self.postgres_restarts}, consumers added {self.added} removed "
            f"{self.removed}, effects {self.effects}, doubled {self.doubled}, lost {self.lost}, "
            f"unexpected {self.unexpected}, order violations {self.order_violations}, "
            f"{self._reconciled_part()}wall {self.wall_s:.1f}s (seed {self.seed})"
        )

    def _reconciled_part(self) -> str:
        if self.reconcile_exit is None:
            return ""
        r = self.reconciled or {}
        return (
            f"reconciliation (exit {self.reconcile_exit}): keys {r.get('keys')}, doubled "
            f"{r.get('doubled')}, lost {r.get('lost')}, stuck {r.get('stuck')}, "
            f"duplicate_absorbed {r.get('duplicate_absorbed')}, record_missing "
            f"{r.get('record_missing')}, "
        )


class Producers:
    """One thread per topic lane, each send retried until the broker takes it."""

    def __init__(self, namesrv: str, plan: Plan, rate: float) -> None:
        from idemp.client import ClientSettings, OutMessage, Producer

        self._out = OutMessage
        self.producer = Producer(
            namesrv, "chaos-producer", client=ClientSettings(namesrv_addr=namesrv)
        ).start()
        self.plan = plan
        self.rate = rate  # messages/s over all lanes: consumption keeps pace, so the
        # faults (placed by consumption progress) land among messages in flight
        self.sent = 0
        self.resends = 0
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._lane, args=(lane,), name=f"chaos-send-{i}", daemon=True)
            for i, lane in enumerate(plan.lanes)
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    @property
    def done(self) -> bool:
        return not any(t.is_alive() for t in self.threads)

    def _lane(self, lane: list[Send]) -> None:
        total = sum(len(lane) for lane in self.plan.lanes)
        period = total / (self.rate * len(lane))  # lanes of every length end together
        t0 = time.monotonic()
        try:
            for i, s in enumerate(lane):
                ahead = t0 + i * period - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)  # pacing, not synchronisation
                self._send(s)
        except BaseException as exc:  # reported by the run's main loop
            self.errors.append(exc)

    def _send(self, s: Send) -> None:
        give_up = time.monotonic() + SEND_GIVE_UP_S
        while True:
            msg = self._out(s.topic, s.body, keys=[s.key])
            try:
                if s.sharding is not None:
                    self.producer.send_orderly(msg, s.sharding)
                else:
                    self.producer.send(msg)
                break
            except Exception as exc:
                if time.monotonic() > give_up:
                    raise RuntimeError(
                        f"send of {s.key} failed for {SEND_GIVE_UP_S:.0f} s: {exc}"
                    ) from exc
                with self._lock:
                    self.resends += 1
                time.sleep(0.2)  # the broker is restarting; bounded by give_up
        with self._lock:
            self.sent += 1

    def shutdown(self) -> None:
        self.producer.shutdown()


def _expected_keys(plan: Plan) -> dict[str, set[str]]:
    out: dict[str, set[str]] = collections.defaultdict(set)
    for lane in plan.lanes:
        for s in lane:
            out[s.topic].add(s.key)
    return out


def verdict(engine: sa.Engine, plan: Plan, figures: Figures) -> None:
    """Doubled, lost and order violations, from the effects table."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(
                EFFECTS.c.topic, EFFECTS.c.key, EFFECTS.c.entity, EFFECTS.c.n, EFFECTS.c.gap
            ).order_by(EFFECTS.c.id)
        ).all()
    figures.effects = len(rows)
    applied: collections.Counter[tuple[str, str]] = collections.Counter(
        (r.topic, r.key) for r in rows
    )
    figures.doubled = sum(c - 1 for c in applied.values() if c > 1)
    expected = {(t, k) for t, keys in _expected_keys(plan).items() for k in keys}
    figures.lost = len(expected - set(applied))
    figures.unexpected = len(set(applied) - expected)
    last: dict[tuple[str, str], int] = {}
    violations = 0
    for r in rows:
        if r.topic not in (SEQ_TOPIC, RIDES_TOPIC):
            continue
        ident = (r.topic, r.entity)
        prev = last.get(ident, -1)
        if r.gap or r.n != prev + 1:
            violations += 1
        last[ident] = max(prev, r.n)
    figures.order_violations = violations


def _counters(stats_dir: Path) -> tuple[dict[str, int], int]:
    """Summed idemp counters of every consumer incarnation, and the absorbed deliveries."""
    total: collections.Counter[str] = collections.Counter()
    for path in stats_dir.glob("*.json"):
        data = json.loads(path.read_text())
        for name, counts in data.items():
            for event, value in counts.items():
                total[f"{name}.{event}"] += int(value)
    absorbed = sum(
        v
        for k, v in total.items()
        if k.endswith((".duplicates", ".guard_drops", "_cursor.repeats"))
    )
    return dict(sorted((k, v) for k, v in total.items() if v)), absorbed


def run(
    messages: int,
    *,
    seed: int,
    kills: int,
    broker_restarts: int,
    redis_restarts: int,
    postgres_restarts: int,
    timeout_s: float,
    workdir: Path,
    rate: float,
    say: Callable[[str], None] = print,
    reconcile: bool = True,
    brokers: int = 1,
) -> Figures:
    from idemp.broker.process import BrokerProcess, NamesrvProcess
    from tests.servers import PostgresServer, RedisServer

    started = time.monotonic()
    plan = make_plan(
        messages,
        seed=seed,
        kills=kills,
        broker_restarts=broker_restarts,
        redis_restarts=redis_restarts,
        postgres_restarts=postgres_restarts,
    )
    figures = Figures(seed, plan.messages, duplicates_sent=plan.duplicates)
    say(
        f"chaos: {plan.messages} messages (+{plan.duplicates} producer duplicates) over "
        f"{PAY_TOPIC}/{SEQ_TOPIC}/{RIDES_TOPIC}/{PAY5_TOPIC} (RocketMQ 5 client); faults: "
        + ", ".join(f"{f.kind}@{f.at:.2f}" for f in plan.faults)
    )
    stats_dir = workdir / "stats"
    stats_dir.mkdir(parents=True, exist_ok=True)
    redis = RedisServer(workdir=workdir / "redis")
    (workdir / "redis").mkdir(exist_ok=True)
    pg = PostgresServer()
    # One broker with its nameserver in one process; or a cluster: ``idemp namesrv`` and
    # brokers registering with it, one of them killed at each broker fault.
    namesrv = NamesrvProcess(workdir / "namesrv") if brokers > 1 else None
    cluster = [
        BrokerProcess(workdir / "broker-store", properties=dict(BROKER_PROPERTIES))
        if namesrv is None
        else BrokerProcess(
            workdir / f"broker-store-{name}",
            properties={
                **BROKER_PROPERTIES,
                "embeddedNamesrv": "false",
                "brokerName": name,
                # topics where they were created, on every broker, as a cluster runs
                "autoCreateTopicEnable": "false",
            },
        )
        for name in [f"broker-{chr(ord('a') + i)}" for i in range(brokers)]
    ]
    # the RocketMQ 5 consumer's access point: its route and assignments name every
    # broker's endpoint, so it receives from all of them through this one
    broker = cluster[0]
    workers: dict[int, Worker] = {}
    producers: Producers | None = None
    incarnation = [0]
    try:
        redis.start()
        pg.start()
        if namesrv is not None:
            namesrv.start()
            for b in cluster:
                b.properties["namesrvAddr"] = namesrv.namesrv_addr
        for b in cluster:
            b.start()
        namesrv_addr = namesrv.namesrv_addr if namesrv is not None else broker.namesrv_addr
        create_schema(pg.url)
        engine = sa.create_engine(pg.url, pool_pre_ping=True)

        def spawn(slot: int) -> Worker:
            incarnation[0] += 1
            n = incarnation[0]
            if slot == V5_SLOT:
                cmd = [str(V5_PYTHON), "-m", "chaos.worker5", "--endpoint", broker.grpc_addr]
                cmd += ["--pg", pg.url, "--stats", str(stats_dir / f"{n}.json")]
                w = Worker(slot, cmd, stats_dir / f"{n}.json", workdir / f"worker-{n}.log")
                workers[slot] = w.start()
                return w
            cmd = [
                sys.executable,
                "-m",
                "chaos.worker",
                "--namesrv",
                namesrv_addr,
                "--pg",
                pg.url,
                "--redis",
                redis.url,
                "--stats",
                str(stats_dir / f"{n}.json"),
            ]
            w = Worker(slot, cmd, stats_dir / f"{n}.json", workdir / f"worker-{n}.log").start()
            workers[slot] = w
            return w

        # RocketMQ 5 clients need the topic before they subscribe (no auto-creation);
        # in a cluster every topic is on every broker
        created = (
            (PAY5_TOPIC,) if len(cluster) == 1 else (PAY_TOPIC, SEQ_TOPIC, RIDES_TOPIC, PAY5_TOPIC)
        )
        for b in cluster:
            for topic in created:
                update_topic(b.broker_addr, topic, 4)
        for slot in (0, 1, 2, V5_SLOT):
            spawn(slot)
        say(
            f"  {len(cluster)} broker(s), PostgreSQL, Redis and 3 consumers + 1 RocketMQ 5 "
            f"consumer up in {time.monotonic() - started:.1f}s"
        )
        producers = Producers(namesrv_addr, plan, rate)
        producers.start()

        def fire(f: Fault, applied: int) -> None:
            if f.kind == KILL:
                slot = sorted(workers)[f.target % len(workers)]
                victim = workers[slot]
                victim.kill()
                figures.kills += 1
                w = spawn(slot)
                say(f"  [{applied}] SIGKILL consumer {victim.pid}; replacement {w.pid}")
            elif f.kind == BROKER:
                down = cluster[figures.broker_restarts % len(cluster)]
                down.kill()
                down.start()
                figures.broker_restarts += 1
                name = down.properties.get("brokerName", "broker")
                say(f"  [{applied}] {name} SIGKILLed and restarted")
            elif f.kind == REDIS:
                redis.restart()
                figures.redis_restarts += 1
                say(f"  [{applied}] Redis restarted (empty: no persistence)")
            elif f.kind == POSTGRES:
                pg.restart()
                figures.postgres_restarts += 1
                say(f"  [{applied}] PostgreSQL restarted")
            elif f.kind == ADD:
                w = spawn(3)
                figures.added += 1
                say(f"  [{applied}] consumer {w.pid} added (rebalance)")
            elif f.kind == REMOVE:
                w = workers.pop(3)
                w.stop()
                figures.removed += 1
                say(f"  [{applied}] consumer {w.pid} removed (rebalance)")

        count_q = sa.select(sa.func.count()).select_from(EFFECTS)
        distinct_q = sa.select(sa.func.count(sa.distinct(EFFECTS.c.key))).select_from(EFFECTS)

        def count(q: Any) -> int | None:
            try:
                with engine.connect() as conn:
                    return int(conn.execute(q).scalar_one())
            except sa.exc.DBAPIError:
                return None  # PostgreSQL is restarting

        pending = collections.deque(plan.faults)
        deadline = started + timeout_s
        applied = 0
        while True:
            if producers.errors:
                raise producers.errors[0]
            n = count(count_q)
            if n is not None:
                applied = n
                while pending and applied >= pending[0].at * plan.messages:
                    fire(pending.popleft(), applied)
                if not pending and producers.done and applied >= plan.messages:
                    if count(distinct_q) == plan.messages:
                        figures.completed = True
                        break
            if time.monotonic() > deadline:
                figures.notes.append(
                    f"time bound {timeout_s:.0f}s reached with {applied}/{plan.messages} effects,"
                    f" {producers.sent} sends done, faults pending: {[f.kind for f in pending]}"
                )
                break
            time.sleep(POLL_S)  # polling the effects table; bounded by the deadline
        figures.faults_pending = len(pending)
        say(
            f"  all effects applied after {time.monotonic() - started:.1f}s; stopping consumers"
            if figures.completed
            else f"  {figures.notes[-1]}"
        )
        for w in list(workers.values()):
            w.stop()
        workers.clear()
        figures.resends = producers.resends
        verdict(engine, plan, figures)
        engine.dispose()
        figures.counters, figures.absorbed = _counters(stats_dir)
        if reconcile and figures.completed:
            from chaos.reconcile import reconcile as run_reconciliation

            for b in cluster:
                b.stop()  # the export reads the store's commit log
            t0 = time.monotonic()
            stores = {b.properties.get("brokerName"): b.store for b in cluster}
            rec = run_reconciliation(workdir, stores, pg.url, redis.url)
            figures.reconcile_exit, figures.reconciled = rec.exit_code, rec.counts
            if rec.error:
                figures.notes.append(f"reconciliation: {rec.error}")
            say(
                f"  reconciled in {time.monotonic() - t0:.1f}s (Spark start included): {rec.report}"
            )
    finally:
        for w in workers.values():
            w.kill()
        if producers is not None:
            producers.shutdown()
        for b in cluster:
            b.stop()
        if namesrv is not None:
            namesrv.stop()
        redis.close()
        pg.close()
    figures.wall_s = time.monotonic() - started
    return figures


FULL = {
    "messages": 100_000,
    "kills": 12,
    "broker_restarts": 3,
    "redis_restarts": 2,
    "postgres_restarts": 2,
}
FULL_RATE = 200.0


def exit_on_sigterm() -> None:
    """A SIGTERM (``kill``, a CI timeout) unwinds like Ctrl-C, so the servers and
    processes the run started are stopped by its ``finally`` blocks, not orphaned."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def main(argv: list[str] | None = None) -> int:
    exit_on_sigterm()
    p = argparse.ArgumentParser(prog="python -m chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=FULL["messages"])
    p.add_argument("--seed", type=int, default=7, help="replays the same plan and faults")
    p.add_argument("--kills", type=int, default=FULL["kills"])
    p.add_argument("--broker-restarts", type=int, default=FULL["broker_restarts"])
    p.add_argument(
        "--brokers",
        type=int,
        default=1,
        help="brokers: 1 with its own nameserver, or more under idemp namesrv",
    )
    p.add_argument("--redis-restarts", type=int, default=FULL["redis_restarts"])
    p.add_argument("--postgres-restarts", type=int, default=FULL["postgres_restarts"])
    p.add_argument(
        "--rate", type=float, default=FULL_RATE, help="send rate, messages/s (default %(default)s)"
    )
    p.add_argument("--timeout", type=float, default=3600.0, help="bound on the whole run (s)")
    p.add_argument(
        "--no-reconcile",
        action="store_true",
        help="skip the Spark reconciliation of the run's data",
    )
    p.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="keep logs and stores here (default: a temporary dir, kept on failure)",
    )
    args = p.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="idemp-chaos-"))
    figures = run(
        args.messages,
        seed=args.seed,
        kills=args.kills,
        broker_restarts=args.broker_restarts,
        redis_restarts=args.redis_restarts,
        postgres_restarts=args.postgres_restarts,
        timeout_s=args.timeout,
        rate=args.rate,
        workdir=workdir,
        say=lambda s: print(s, flush=True),
        reconcile=not args.no_reconcile,
        brokers=args.brokers,
    )
    print("  counters: " + ", ".join(f"{k} {v}" for k, v in figures.counters.items()))
    for note in figures.notes:
        print(f"  note: {note}")
    print(figures.line(), flush=True)
    if figures.ok and args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    elif not figures.ok:
        print(f"  logs kept in {workdir}")
    return 0 if figures.ok else 1

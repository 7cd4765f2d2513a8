"""``idemp demo``: the main job on embedded defaults.

1. idemp's broker on a temporary store (or ``--namesrv`` for a real RocketMQ);
2. a consumer *process* starts on both topics; ride-hailing order events are sent
   with faults injected (producer retries, out-of-order sends, a poison message);
3. that process is SIGKILLed while it consumes; this process takes over its queues and
   sees the redeliveries of what the dead one had consumed but not yet acknowledged;
4. everything is checked in the effects table (each transition applied once, every
   order's transitions in the machine's order), then the broker's history is exported
   and reconciled with Spark (summary on the terminal, HTML report on disk).

Exit 0 only when exactly-once effects and per-order state order hold.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from idemp.demo.progress import Bar
from idemp.demo.scenario import POISON_ORDER, STATES, Plan, make_plan

SPARK_MASTER = "local[2]"
SPARK_PARTITIONS = 2  # the demo's ~70,000 history rows: more partitions only add tasks
SEND_BATCH = 32  # messages per send request (both topics)
MAX_RECONSUME = 16  # ConsumerSettings default: the poison's 17th failure goes to %DLQ%
POISON_QUIET_S = 3.0  # > the 1 s retry delay: no poison copy is still in flight
BROKER_LOCK_MS = 3000  # embedded broker's queue-lock expiry (RocketMQ: 60 s)


def add_arguments(p: argparse.ArgumentParser) -> None:
    # The full run: 10,000 orders, ~140 s here at load 4-7 (docs/performance.md,
    # "Demo"); a heavily loaded machine stretches it (190 s at load 6-9).
    p.add_argument(
        "--orders",
        type=int,
        default=10_000,
        help=f"ride-hailing orders (x {len(STATES)} states each); default %(default)s",
    )
    p.add_argument("--seed", type=int, default=7, help="fault injection seed")
    p.add_argument(
        "--retry-rate",
        type=float,
        default=0.02,
        help="share of events the producer sends twice (new msgId)",
    )
    p.add_argument(
        "--shuffle-rate",
        type=float,
        default=0.05,
        help="share of dispatch orders whose events are sent out of order",
    )
    p.add_argument(
        "--kill-at",
        type=float,
        default=0.3,
        help="SIGKILL the first consumer process after this share of effects",
    )
    p.add_argument(
        "--report-dir",
        default="idemp-demo-report",
        help="where the reconciliation writes report.html and summary.json",
    )
    # A bound for a hung run, not a target: 10,000 orders took 186 s to consume at load
    # ~20 on this 2-core machine.
    p.add_argument(
        "--timeout", type=float, default=600.0, help="give up consuming after this many seconds"
    )
    b = p.add_argument_group("backends (default: embedded broker and SQLite)")
    b.add_argument(
        "--db-url",
        default=None,
        help="SQLAlchemy URL for order states, effects and (unless --dedup-url) the "
        "unique-key table, e.g. postgresql+psycopg://user@host/db",
    )
    b.add_argument(
        "--dedup-url",
        default=None,
        help="dedup store: redis://host:6379/0 (Redis flag) or a SQLAlchemy URL",
    )
    b.add_argument(
        "--namesrv",
        default=None,
        help="a real RocketMQ nameserver HOST:PORT instead of the embedded broker "
        "(no history export, so no reconciliation; its queue locks expire "
        "after 60 s, so the takeover after the kill is slower)",
    )
    b.add_argument("--no-reconcile", action="store_true", help="skip the Spark step")


@dataclass
class Tally:
    """What this process's listeners saw, per delivery."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    outcomes: Counter[str] = field(default_factory=Counter)
    msg_ids: list[str] = field(default_factory=list)
    poison_last_reconsume: int = -1
    poison_last_seen: float = 0.0  # time.monotonic() of its latest delivery here


def _say(text: str = "") -> None:
    print(text, flush=True)


class SparkBoot:
    """The local Spark session, started in a thread once every message is sent: the JVM's
    start (~10 s on a quiet machine, 40–70 s loaded) overlaps the consumers, and the
    reconciliation's ``getOrCreate`` finds the session ready. (Started with the demo, its
    CPU-hungry start slowed the send phase several-fold on this 2-core machine.)"""

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self.seconds = 0.0
        self._thread = threading.Thread(target=self._boot, name="demo-spark-boot", daemon=True)

    def start(self) -> None:
        if self._thread.ident is None:
            self._thread.start()

    def _boot(self) -> None:
        from idemp.reconcile.session import get_session

        t0 = time.monotonic()
        try:
            get_session(SPARK_MASTER, SPARK_PARTITIONS)
        except BaseException as exc:  # the reconciliation retries and reports it
            self.error = exc
        self.seconds = time.monotonic() - t0

    def wait(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()


def run_demo(args: argparse.Namespace) -> int:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="idemp-demo-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            return _run(args, tmp, started)
        finally:
            _say(f"demo wall time {time.monotonic() - started:.1f}s")


def _run(args: argparse.Namespace, tmp: Path, started: float) -> int:
    from idemp.broker.process import BrokerProcess
    from idemp.demo.app import Names

    plan = make_plan(
        args.orders, seed=args.seed, retry_rate=args.retry_rate, shuffle_rate=args.shuffle_rate
    )
    shared = args.namesrv is not None or args.db_url is not None or args.dedup_url is not None
    names = Names(secrets.token_hex(3) if shared else "")
    db_url = args.db_url or f"sqlite:///{tmp / 'demo.db'}"
    _say(
        f"idemp demo: {plan.orders} ride-hailing orders x {len(STATES)} states "
        f"= {plan.expected_effects} transitions"
    )
    _say(
        f"  store: {_redact(db_url)}; dedup: "
        f"{_redact(args.dedup_url) if args.dedup_url else 'unique-key table (transactional)'}"
    )
    broker: BrokerProcess | None = None
    boot: SparkBoot | None = None
    if args.namesrv is None and not args.no_reconcile:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        boot = SparkBoot()
    if args.namesrv:
        namesrv = args.namesrv
        _say(f"  RocketMQ nameserver: {namesrv} (topics/groups suffixed {names.suffix})")
        lock_expiry = 30.0
    else:
        broker = BrokerProcess(
            tmp / "store",
            properties={
                "messageDelayLevel": " ".join(["1s"] * 18),  # retries come back after 1 s
                "rebalanceLockMaxLiveTime": str(BROKER_LOCK_MS),
                "flushConsumerOffsetInterval": "500",
            },
        )
        broker.start()
        namesrv = broker.namesrv_addr
        lock_expiry = BROKER_LOCK_MS / 1000 * 0.6
        _say(f"  {broker.ready_line}")
        _say(
            f"  (demo settings: delay levels 1 s, queue locks expire after "
            f"{BROKER_LOCK_MS} ms at the broker instead of 60 s)"
        )
    try:
        ok = _exchange(args, plan, names, namesrv, db_url, tmp, lock_expiry, boot)
        if broker is not None:
            broker.stop()
    except BaseException:
        if broker is not None:
            broker.kill()
        raise
    verdict = ok.check(plan)
    reconciled = True
    if broker is not None and boot is not None:
        reconciled = _reconcile(args, plan, names, db_url, broker.store, tmp, boot)
    elif args.namesrv:
        _say("reconciliation skipped: a real cluster's history is not exported by the demo")
    good = verdict and reconciled
    _say(
        f"demo {'OK' if good else 'FAILED'}: exactly-once effects and per-order state order "
        f"{'hold' if good else 'do NOT hold'}"
    )
    return 0 if good else 1


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url.split("@")[-1]


# -- produce, kill, consume ---------------------------------------------------------------


class Outcome:
    """The effects table read back, and the counters, after consumption."""

    def __init__(
        self,
        rows: list[tuple[int, str, str, str, int, str]],
        tally: Tally,
        child_pid: int,
        killed_at: int,
        stats: dict[str, int],
        per_listener: dict[str, dict[str, int]],
    ) -> None:
        self.rows, self.tally, self.child_pid = rows, tally, child_pid
        self.killed_at, self.stats, self.per_listener = killed_at, stats, per_listener

    def check(self, plan: Plan) -> bool:
        per_key = Counter(r[1] for r in self.rows)
        expected_keys = {f"order-{i}->{s}" for i in range(plan.orders) for s in STATES}
        doubled = sum(1 for n in per_key.values() if n > 1)
        lost = len(expected_keys - set(per_key))
        unexpected = len(set(per_key) - expected_keys)
        sequences: dict[str, list[str]] = {}
        for _seq, _key, order, state, _pid, _msg in sorted(self.rows):
            sequences.setdefault(order, []).append(state)
        violations = sum(1 for s in sequences.values() if s != list(STATES)[: len(s)])
        by_child = sum(1 for r in self.rows if r[4] == self.child_pid)
        child_msgs = {r[5] for r in self.rows if r[4] == self.child_pid}
        replays = sum(1 for m in self.tally.msg_ids if m in child_msgs)
        s = self.stats
        _say("")
        _say("faults injected -> what absorbed them")
        _say(f"  producer retries (same key, new msgId): {plan.producer_retries} extra sends")
        _say(
            f"  out-of-order sends: {plan.shuffled_orders} dispatch orders sent shuffled -> "
            f"guard applied {s['reordered']} early deliveries after their predecessor in "
            f"the same batch, held {s['held']} (reconsume later), all in order"
        )
        _say(
            f"  consumer process {self.child_pid} SIGKILLed after {self.killed_at} effects "
            f"(it applied {by_child}); {replays} of its messages were redelivered here "
            f"and absorbed as duplicates"
        )
        _say(
            f"  poison message: failed on every delivery up to reconsume_times "
            f"{self.tally.poison_last_reconsume} (claim released each time), then %DLQ%"
        )
        _say("  this process: " + ", ".join(f"{k} {v}" for k, v in s.items() if v))
        for name, c in self.per_listener.items():
            _say(f"    {name}: " + ", ".join(f"{k} {v}" for k, v in c.items() if v))
        _say("")
        _say("effects table")
        _say(
            f"  effects {len(self.rows)} (expected {plan.expected_effects}), doubled {doubled}, "
            f"lost {lost}, unexpected {unexpected}, order violations {violations}"
        )
        self.figures = {
            "effects": len(self.rows),
            "doubled": doubled,
            "lost": lost,
            "violations": violations,
        }
        return (
            len(self.rows) == plan.expected_effects
            and doubled == lost == unexpected == 0
            and violations == 0
            and all(len(v) == len(STATES) for v in sequences.values())
        )


def _exchange(
    args: argparse.Namespace,
    plan: Plan,
    names: Any,
    namesrv: str,
    db_url: str,
    tmp: Path,
    lock_expiry: float,
    boot: SparkBoot | None,
) -> Outcome:
    import sqlalchemy as sa

    from idemp.demo.app import Consumers, effects_table

    istats = importlib.import_module("idemp.stats")  # the module, not idemp.stats()
    istats.reset()
    table = effects_table(names.effects_table)
    engine = sa.create_engine(db_url)
    table.metadata.create_all(engine, checkfirst=True)
    count_q = sa.select(sa.func.count()).select_from(table)
    top_q = sa.select(sa.func.coalesce(sa.func.max(table.c.seq), 0))

    def effects(at_least: int = plan.expected_effects) -> int:
        """The effects so far, polled every 0.2 s beside the consumers: the highest
        ``seq`` first (an index lookup; ``count(*)`` reads the whole table, ~3 % of the
        consuming process's CPU at 60,000 rows), counted exactly once it reaches
        ``at_least`` (a sequence may skip numbers: ``seq`` bounds the count above)."""
        with engine.connect() as conn:
            top = int(conn.execute(top_q).scalar_one())
            if top < at_least:
                return top
            return int(conn.execute(count_q).scalar_one())

    env = dict(os.environ)
    cmd = [
        sys.executable,
        "-m",
        "idemp.demo.worker",
        "--namesrv",
        namesrv,
        "--db-url",
        db_url,
        "--suffix",
        names.suffix,
        "--lock-expiry",
        str(lock_expiry),
    ]
    if args.dedup_url:
        cmd += ["--dedup-url", args.dedup_url]
    log = open(tmp / "worker.log", "w", encoding="utf-8")
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    log.close()
    try:
        assert child.stdout is not None
        line = child.stdout.readline()  # bounded: the worker starts its runners with 30 s timeouts
        if not line.startswith("worker started"):
            tail = (tmp / "worker.log").read_text()[-2000:]
            raise RuntimeError(f"the consumer process did not start:\n{tail}")
        _say(f"  consumer process {child.pid} started (concurrent + orderly runners)")
        kill_after = max(1, int(plan.expected_effects * args.kill_at))
        killed_at = [-1]
        killed_after = [0.0]

        def killer() -> None:  # poll the effects table; SIGKILL the worker mid-run
            deadline = time.monotonic() + args.timeout
            while time.monotonic() < deadline and child.poll() is None:
                n = effects(kill_after)
                if n >= kill_after:
                    os.kill(child.pid, signal.SIGKILL)
                    killed_at[0] = n
                    killed_after[0] = time.monotonic() - first_send
                    return
                time.sleep(0.2)  # a query per poll: where exactly it stops is reported

        watcher = threading.Thread(target=killer, name="demo-killer", daemon=True)
        watcher.start()
        first_send = time.monotonic()
        _produce(plan, names, namesrv)
        _say(f"  sent {plan.messages} messages in {time.monotonic() - first_send:.1f}s")
        if boot is not None:
            boot.start()
        watcher.join(args.timeout)
        if killed_at[0] < 0:
            os.kill(child.pid, signal.SIGKILL)
            killed_at[0] = effects()
            killed_after[0] = time.monotonic() - first_send
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()
    _say(
        f"  consumer process {child.pid} SIGKILLed after {killed_at[0]} effects "
        f"({killed_after[0]:.1f}s after the first send); this process takes over"
    )

    tally = Tally()
    consumers = Consumers(namesrv, db_url, args.dedup_url, names, lock_expiry_s=lock_expiry)
    for runner in (consumers.dispatch, consumers.trips):
        runner.listener = _observe(runner.listener, tally)
    t0 = time.monotonic()
    c0 = time.process_time()
    consumers.start()
    bar = Bar("consume", plan.expected_effects)
    deadline = time.monotonic() + args.timeout
    applied_in = -1.0  # when the last effect was seen, apart from the poison's wait
    try:
        while time.monotonic() < deadline:
            n = effects()
            bar.update(n)
            if applied_in < 0 and n >= plan.expected_effects:
                applied_in = time.monotonic() - t0
            with tally.lock:  # dead-lettered, and no other copy still retrying (a
                # redelivery after the kill starts a second retry chain of its own)
                poison_done = (
                    tally.poison_last_reconsume >= MAX_RECONSUME
                    and time.monotonic() - tally.poison_last_seen > POISON_QUIET_S
                )
            if n >= plan.expected_effects and poison_done:
                break
            time.sleep(0.2)  # polling the table, bounded by --timeout
        bar.close()
    finally:
        consumers.shutdown()
    took = time.monotonic() - t0
    if applied_in >= 0:
        _say(
            f"  every effect applied {applied_in:.1f}s after the takeover, "
            f"{t0 + applied_in - first_send:.1f}s after the first send"
        )
    _say(
        f"  consumed the rest in {took:.1f}s after the takeover "
        f"(CPU time of this process {time.process_time() - c0:.1f}s)"
        + (
            f"; its last {took - applied_in:.1f}s waited out the poison's retries to %DLQ%"
            if applied_in >= 0 and took - applied_in > 1.0
            else ""
        )
    )
    with engine.connect() as conn:
        rows = [
            tuple(r)
            for r in conn.execute(
                sa.select(
                    table.c.seq,
                    table.c.event_key,
                    table.c.order_id,
                    table.c.state,
                    table.c.pid,
                    table.c.msg_id,
                ).where(table.c.order_id != POISON_ORDER)
            )
        ]
    engine.dispose()
    per = {name: istats.stats(name) for name in ("dispatch", "trips")}
    return Outcome(rows, tally, child.pid, killed_at[0], istats.stats(), per)


def _observe(listener: Callable[[Any], Any], tally: Tally) -> Callable[[Any], Any]:
    def record(message: Any, result: Any) -> None:
        with tally.lock:
            tally.msg_ids.append(message.msg_id)
            outcome = getattr(getattr(result, "outcome", None), "value", "?")
            tally.outcomes[outcome] += 1
            if message.key and message.key.startswith(POISON_ORDER):
                tally.poison_last_reconsume = max(
                    tally.poison_last_reconsume, message.reconsume_times
                )
                tally.poison_last_seen = time.monotonic()

    def observed(message: Any) -> Any:
        result = listener(message)
        record(message, result)
        return result

    def observed_batch(messages: Any, **options: Any) -> Any:
        # keeps the runner's batch path (one transaction per batch) through this wrapper
        results = listener.consume_batch(messages, **options)  # type: ignore[attr-defined]
        for message, result in zip(messages, results):
            record(message, result)
        return results

    if hasattr(listener, "consume_batch"):
        observed.consume_batch = observed_batch  # type: ignore[attr-defined]
    return observed


def _produce(plan: Plan, names: Any, namesrv: str) -> None:
    """Both topics in batches of ``SEND_BATCH``: the dispatch events round robin over
    the queues, each trip's events to its sharding key's queue, in order (what
    ``send_orderly`` does one message at a time: 30,000 round trips at 10,000 orders)."""
    from idemp.client import OutMessage, Producer
    from idemp.client.sharding import queue_index_for_key
    from idemp.remoting.codes import Prop

    bar = Bar("send", plan.messages)
    sent = [0]
    lock = threading.Lock()
    errors: list[BaseException] = []

    def bump(n: int) -> None:
        with lock:
            sent[0] += n
            bar.update(sent[0])

    producer = Producer(namesrv, "ride-events-producer").start()

    def send_dispatch() -> None:  # batches in send order, round robin over the queues
        for i in range(0, len(plan.dispatch), SEND_BATCH):
            chunk = [
                OutMessage(names.dispatch_topic, e.body(), tags=e.state, keys=[e.key])
                for e in plan.dispatch[i : i + SEND_BATCH]
            ]
            _retrying(lambda: producer.send_batch(chunk))  # noqa: B023 - called now
            bump(len(chunk))

    def send_trips() -> None:  # per queue in plan order: each order's events in order
        queues = _retrying(lambda: producer.publish_queues(names.trips_topic))
        per_queue: list[list[OutMessage]] = [[] for _ in queues]
        for e in plan.trips:
            per_queue[queue_index_for_key(e.order, len(queues))].append(
                OutMessage(
                    names.trips_topic,
                    e.body(),
                    tags=e.state,
                    keys=[e.key],
                    properties={Prop.SHARDING_KEY: e.order},
                )
            )
        for start in range(0, max(map(len, per_queue)), SEND_BATCH):  # queues fill evenly
            for mq, msgs in zip(queues, per_queue):
                chunk = msgs[start : start + SEND_BATCH]
                if chunk:
                    _retrying(lambda: producer.send_batch(chunk, mq))  # noqa: B023
                    bump(len(chunk))

    def guard(fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as exc:  # reported below, in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=guard, args=(f,)) for f in (send_dispatch, send_trips)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        bar.close()
        producer.shutdown()
    if errors:
        raise errors[0]


def _retrying(send: Callable[[], Any]) -> Any:
    """A fresh topic's first sends may race its route creation: retry a few times."""
    for attempt in range(5):
        try:
            return send()
        except Exception:
            if attempt == 4:
                raise
            time.sleep(0.2 * (attempt + 1))  # bounded back-off: ≤ 2 s in all
    return None


# -- reconciliation -----------------------------------------------------------------------


def _reconcile(
    args: argparse.Namespace,
    plan: Plan,
    names: Any,
    db_url: str,
    store: Path,
    tmp: Path,
    boot: SparkBoot,
) -> bool:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import sqlalchemy as sa

    from idemp.broker.export import export
    from idemp.demo.app import effects_table
    from idemp.reconcile.cli import main as reconcile
    from idemp.reconcile.loaders import export_redis, export_sql_table

    _say("")
    _say("reconciliation (PySpark, local mode)")
    history = tmp / "history.parquet"
    rows = export(store, history)
    if args.dedup_url and args.dedup_url.startswith(("redis://", "rediss://", "unix://")):
        records = tmp / "flags.parquet"
        export_redis(args.dedup_url, "idemp:*", records)
    else:
        records = tmp / "records.parquet"
        export_sql_table(args.dedup_url or db_url, "idemp_dedup", records)
    table = effects_table(names.effects_table)
    engine = sa.create_engine(db_url)
    effects_args: list[str] = []
    with engine.connect() as conn:
        for topic, group in (
            (names.dispatch_topic, names.dispatch_group),
            (names.trips_topic, names.trips_group),
        ):
            keys = [
                r[0]
                for r in conn.execute(sa.select(table.c.event_key).where(table.c.topic == topic))
            ]
            path = tmp / f"effects-{group}.parquet"
            pq.write_table(pa.table({"event_key": pa.array(keys, pa.string())}), path)
            effects_args += ["--effects", f"{path}:event_key:{group}/{topic}"]
    engine.dispose()
    _say(f"  exported {rows} history rows, the dedup records and the effects")
    t0 = time.monotonic()
    boot.start()  # no-op unless the exchange ended before its send phase did
    if boot.wait(180):  # bounded: a JVM that never comes up is retried by the job below
        _say(
            f"  Spark session started in the background in {boot.seconds:.1f}s "
            f"(waited {time.monotonic() - t0:.1f}s for it here)"
            + (f"; it failed: {boot.error}" if boot.error else "")
        )
    out = Path(args.report_dir).resolve()
    argv = [
        "--history",
        str(history),
        "--records",
        str(records),
        "--offsets",
        str(store / "config" / "consumerOffset.json"),
        "--subscription",
        f"{names.dispatch_topic}@{names.dispatch_group}",
        "--subscription",
        f"{names.trips_topic}@{names.trips_group}",
        "--out",
        str(out),
        "--shuffle-partitions",
        str(SPARK_PARTITIONS),
        "--master",
        SPARK_MASTER,
        *effects_args,
    ]
    if not sys.stderr.isatty():
        argv.append("--no-progress")
    t0 = time.monotonic()
    code = reconcile(argv)
    _say(f"  reconciled in {time.monotonic() - t0:.1f}s")
    summary_path = out / "summary.json"
    if not summary_path.exists():
        _say(f"  reconciliation failed (exit {code}); see {out}")
        return False
    summary = json.loads(summary_path.read_text())
    c = summary["counts"]
    expected_keys = plan.expected_effects + plan.poison
    good = (
        code == 0
        and c["keys"] == expected_keys
        and c["dead_lettered"] == plan.poison
        and c["doubled"] == 0
        and c["lost"] == 0
    )
    _say(
        f"  keys {c['keys']} (expected {expected_keys}), messages {c['messages']} "
        f"(sent {plan.messages}), doubled {c['doubled']}, lost {c['lost']}, "
        f"dead-lettered {c['dead_lettered']}, exit {code}"
    )
    _say(f"  HTML report: {out / 'report.html'}")
    return good

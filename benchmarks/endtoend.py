"""End-to-end benchmark: a decorated listener on a runner against its store, the way a
user runs it, beside its ceiling and the anchor users would otherwise pick.

    python -m benchmarks endtoend [--count 100000] [--rows NAME,...]

One idemp broker holds ``--count`` messages (2 % sent twice: same business key in the
``UID`` property, new msgId), on 4 queues. Every row consumes all of them in a group of
its own, in a child process of its own (so its CPU is its own): idemp's ConcurrentRunner,
4 threads, batches of ``--batch``, a listener whose effect is one INSERT into a business
table. Rows:

* ``ceiling-sqlite`` / ``ceiling-pg``: the same runner, an undecorated listener doing
  the same INSERT (no dedup at all: the duplicates are inserted too);
* idemp: ``RedisFlag``, ``UniqueKeyTable`` on SQLite and PostgreSQL (autocommit and
  transactional), ``OptimisticVersion``, ``PessimisticRowLock``, ``RedissonLock``, and
  ``@guarded`` (transactional unique-key table + state table) on SQLite and PostgreSQL;
  effects in the strategy's database (Redis rows: PostgreSQL);
* ``official+powertools`` and ``official+powertools-sqlite``: the official client's
  concurrent PushConsumer (4 threads) with AWS Powertools' ``idempotent_function`` on the
  same Redis, the same INSERT into PostgreSQL, or into SQLite: each idemp row is set
  against the anchor whose effect goes to the same database as its own.

Reported per row: msg/s from the first delivery to the last, CPU per message of the
consumer process (for idemp's rows also split: the client's loop thread and the
listener's threads, from ``/proc``) and of the store's server (PostgreSQL: the
postmaster and its backends; Redis: ``INFO cpu``; SQLite is inside the consumer), the
ratio to the ceiling of the same effect database, and whether every key's effect
exists exactly once.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TOPIC = "BenchE2E"
DUP_EVERY = 50  # 2 %: every 50th message is sent twice
ROWS = [
    "ceiling-sqlite",
    "ceiling-pg",
    "redis_flag",
    "unique_key-sqlite",
    "unique_key-sqlite-tx",
    "unique_key-pg",
    "unique_key-pg-tx",
    "optimistic-pg",
    "pessimistic-pg",
    "redisson",
    "guarded-sqlite",
    "guarded-pg",
    "official+powertools",
    "official+powertools-sqlite",
]
ANCHOR = "official+powertools"


def _effects_db(row: str) -> str:
    return "sqlite" if "sqlite" in row else "pg"


def _keys(count: int) -> int:
    """Distinct business keys among ``count`` messages (see ``_fill``)."""
    return count - count // DUP_EVERY


# -- the child: one row --------------------------------------------------------------
class _Tally:
    def __init__(self, count: int) -> None:
        self.count, self.n = count, 0
        self.first = self.last = 0.0
        self.cpu_first = self.cpu_last = 0.0
        self.lock = threading.Lock()
        self.done = threading.Event()

    def seen(self, n: int = 1) -> None:
        now, cpu = time.monotonic(), time.process_time()
        with self.lock:
            if self.n == 0:
                self.first, self.cpu_first = now, cpu
            self.n += n
            self.last, self.cpu_last = now, cpu
            if self.n >= self.count:
                self.done.set()


def _effects_table(name: str) -> Any:
    import sqlalchemy as sa

    return sa.Table(
        name,
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("k", sa.String(64), nullable=False, index=True),
    )


def _listener(row: str, urls: dict[str, str], tally: _Tally) -> tuple[Any, Any, Any, list[Any]]:
    """The row's listener (forwarding consume_batch when it has one), the effects' engine
    and table, and the strategies and stores to close."""
    import sqlalchemy as sa

    from idemp import Context, Message, guarded, idempotent
    from idemp.guards import RIDE_HAILING_ORDER, SqlStateStore
    from idemp.strategies import (
        OptimisticVersion,
        PessimisticRowLock,
        RedisFlag,
        RedissonLock,
        UniqueKeyTable,
    )
    from idemp.strategies._sql import make_engine

    db = urls[_effects_db(row)]
    if db.startswith("sqlite:///"):  # a database file per row
        db = db.replace("bench.db", f"bench-{row}.db")
    suffix = uuid.uuid4().hex[:8]
    table = _effects_table(f"fx_{suffix}")
    # the effects' engine as idemp makes its own (SQLite: WAL, synchronous=NORMAL, a
    # busy timeout), so that every row, ceiling included, pays the same per INSERT
    engine = make_engine(db, 5.0, 8)
    table.metadata.create_all(engine)
    insert = table.insert()
    closing: list[Any] = []

    def own(message: Message) -> None:  # the effect on its own connection
        with engine.begin() as conn:
            conn.execute(insert, {"k": message.properties["UID"]})

    def joined(message: Message, ctx: Context) -> None:  # in the strategy's transaction
        ctx.connection.execute(insert, {"k": message.properties["UID"]})

    # built once, as the INSERT is: built per message it cost ~100 µs more (SQLite)
    exists = sa.select(table.c.id).where(table.c.k == sa.bindparam("uid"))

    def once(conn: Any, message: Message) -> None:  # check-then-act, under a lock
        uid = message.properties["UID"]
        if conn.execute(exists, {"uid": uid}).first() is None:
            conn.execute(insert, {"k": uid})

    key = "property:UID"
    group = f"bench-{row}"
    strategy: Any = None
    fn: Any
    if row.startswith("ceiling"):
        fn = own
    elif row == "redis_flag":
        strategy = RedisFlag(urls["redis"], prefix=suffix)
        fn = idempotent(key=key, strategy=strategy, group=group)(own)
    elif row.startswith("unique_key"):
        tx = row.endswith("-tx")
        strategy = UniqueKeyTable(db, table=f"dedup_{suffix}", transactional=tx)
        fn = idempotent(key=key, strategy=strategy, group=group)(joined if tx else own)
    elif row == "optimistic-pg":
        strategy = OptimisticVersion(db, table=f"ver_{suffix}", expected_version=lambda m: 0)

        def versioned(message: Message, ctx: Context) -> None:
            # the version moves with the effect: a retry built against 0 is then stale
            ctx.handle.insert()
            joined(message, ctx)

        fn = idempotent(key=key, strategy=strategy, group=group)(versioned)
    elif row == "pessimistic-pg":
        strategy = PessimisticRowLock(db, table=f"lock_{suffix}")

        def locked(message: Message, ctx: Context) -> None:
            once(ctx.connection, message)

        fn = idempotent(key=key, strategy=strategy, group=group)(locked)
    elif row == "redisson":
        strategy = RedissonLock(urls["redis"], prefix=suffix)

        def under_lock(message: Message) -> None:
            with engine.begin() as conn:
                once(conn, message)

        fn = idempotent(key=key, strategy=strategy, group=group)(under_lock)
    elif row.startswith("guarded"):
        strategy = UniqueKeyTable(db, table=f"dedup_{suffix}", transactional=True)
        states = SqlStateStore(db, table=f"state_{suffix}")
        closing.append(states)
        fn = guarded(
            RIDE_HAILING_ORDER,
            entity=key,
            target=lambda m: "created",  # each key an order, created once
            store=states,
            strategy=strategy,
            key=key,
            group=group,
            pass_context=True,
        )(joined)
    else:
        raise SystemExit(f"unknown row {row!r}")
    if strategy is not None:
        closing.append(strategy)

    def counted(message: Message) -> Any:
        result = fn(message)
        tally.seen()
        return result

    batch = getattr(fn, "consume_batch", None)
    if batch is not None:

        def counted_batch(messages: Any, **options: Any) -> Any:
            results = batch(messages, **options)
            tally.seen(len(results))
            return results

        counted.consume_batch = counted_batch  # type: ignore[attr-defined]
    return counted, engine, table, closing


def _effects_ok(engine: Any, table: Any, keys: int, ceiling: bool) -> str:
    import sqlalchemy as sa

    with engine.connect() as conn:
        total = conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()
        distinct = conn.execute(
            sa.select(sa.func.count(sa.distinct(table.c.k))).select_from(table)
        ).scalar_one()
    if ceiling:
        return "n/a (no dedup)" if distinct == keys else f"LOST: {distinct} of {keys} keys"
    if distinct == keys and total == keys:
        return "exactly once"
    return f"WRONG: {total} effects for {distinct} of {keys} keys"


def _thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's threads so far, by role: the client's loop thread,
    the listener's threads, the rest (``/proc/self/task``; threads by their names)."""
    tick = os.sysconf("SC_CLK_TCK")
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = {"loop": 0.0, "listener": 0.0, "other": 0.0}
    for tid in os.listdir("/proc/self/task"):
        try:
            text = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        fields = text[text.rindex(")") + 2 :].split()
        name = names.get(int(tid), "")
        role = (
            "loop"
            if name.startswith("idemp-client")
            else "listener"
            if name.startswith("idemp-consume")
            else "other"
        )
        out[role] += (int(fields[11]) + int(fields[12])) / tick
    return out


def _child_idemp(row: str, namesrv: str, count: int, batch: int, urls: dict[str, str]) -> int:
    from idemp.client import ClientSettings, ConsumeFrom, ConsumerSettings
    from idemp.runners import ConcurrentRunner

    tally = _Tally(count)
    listener, engine, table, closing = _listener(row, urls, tally)
    settings = ConsumerSettings(
        group=f"bench-{row}",
        consume_from=ConsumeFrom.FIRST_OFFSET,
        consume_thread_count=4,
        consume_batch_size=batch,
    )
    runner = ConcurrentRunner(listener, settings=settings, client=ClientSettings(namesrv))
    runner.subscribe(TOPIC)
    runner.start()
    before = _thread_cpu()  # consuming starts after this: the split is the run's own
    ok = tally.done.wait(1800)
    after = _thread_cpu()
    runner.shutdown()
    verdict = _effects_ok(engine, table, _keys(count), row.startswith("ceiling"))
    for thing in closing:
        thing.close()
    engine.dispose()
    _report(tally, ok, verdict, {k: after[k] - before[k] for k in after})
    return 0


def _report(tally: _Tally, ok: bool, verdict: str, threads: dict[str, float] | None = None) -> None:
    print(
        json.dumps(
            {
                "count": tally.n,
                "seconds": tally.last - tally.first,
                "cpu": tally.cpu_last - tally.cpu_first,
                "ok": ok,
                "effects": verdict,
                "threads": threads,
            }
        ),
        flush=True,
    )


def _child_official(row: str, namesrv: str, count: int, urls: dict[str, str]) -> int:
    import warnings

    import redis
    from aws_lambda_powertools.utilities.idempotency import (
        IdempotencyConfig,
        idempotent_function,
    )
    from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
        RedisCachePersistenceLayer,
    )
    from rocketmq.client import ConsumeStatus, PushConsumer

    warnings.filterwarnings("ignore", message="Couldn't determine the remaining time")
    tally = _Tally(count)
    from idemp.strategies._sql import make_engine

    table = _effects_table(f"fx_{uuid.uuid4().hex[:8]}")
    db = urls[_effects_db(row)]
    if db.startswith("sqlite:///"):
        db = db.replace("bench.db", f"bench-{row}.db")
    engine = make_engine(db, 5.0, 8)  # as the idemp rows' effects engine
    table.metadata.create_all(engine)
    insert = table.insert()
    client = redis.Redis.from_url(urls["redis"])
    layer = RedisCachePersistenceLayer(client=client)  # type: ignore[arg-type]  # Powertools' protocol types ex as float, redis-py as int
    config = IdempotencyConfig(event_key_jmespath="key", expires_after_seconds=604_800)

    @idempotent_function(
        data_keyword_argument="order",
        persistence_store=layer,
        config=config,
        key_prefix=uuid.uuid4().hex[:8],
    )
    def apply(order: dict[str, str]) -> dict[str, str]:
        with engine.begin() as conn:
            conn.execute(insert, {"k": order["key"]})
        return {}

    def callback(msg: Any) -> Any:
        try:
            apply(order={"key": msg.get_property("UID").decode()})
        except Exception:  # e.g. a concurrent duplicate in progress: redelivered
            return ConsumeStatus.RECONSUME_LATER
        tally.seen()
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(f"bench-{row.replace('+', '-')}")
    consumer.set_namesrv_addr(namesrv)
    consumer.set_thread_count(4)
    consumer.subscribe(TOPIC, callback)
    consumer.start()
    ok = tally.done.wait(1800)
    consumer.shutdown()
    verdict = _effects_ok(engine, table, _keys(count), False)
    engine.dispose()
    _report(tally, ok, verdict)
    return 0


# -- the parent ----------------------------------------------------------------------
def _pg_cpu(pid: int) -> float:
    """CPU seconds of the postmaster, its reaped children and its live backends."""
    tick = os.sysconf("SC_CLK_TCK")

    def stat(p: int) -> list[str]:
        text = Path(f"/proc/{p}/stat").read_text()
        return text[text.rindex(")") + 2 :].split()

    fields = stat(pid)
    total = sum(int(fields[i]) for i in (11, 12, 13, 14))
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            f = stat(int(entry.name))
        except OSError:
            continue
        if int(f[1]) == pid:
            total += int(f[11]) + int(f[12])
    return total / tick


def _redis_cpu(url: str) -> float:
    import redis

    info = redis.Redis.from_url(url).info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _run_row(
    row: str, namesrv: str, count: int, batch: int, urls: dict[str, str], home: str
) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.endtoend", "--child", row, namesrv, str(count)]
    cmd += [str(batch), json.dumps(urls)]
    res = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=3600,
        env={**os.environ, "HOME": home},
        cwd=ROOT,
    )
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if res.returncode != 0 or not lines:
        raise RuntimeError(f"{row} failed ({res.returncode}): {res.stderr[-3000:]}")
    return dict(json.loads(lines[-1]))


def _fill(namesrv: str, count: int) -> None:
    """Message ``j`` carries key ``k<j>``, except every 50th, a producer retry of the
    message before it (same UID and body, new msgId)."""
    from idemp.client import OutMessage, Producer

    with Producer(namesrv, "bench-e2e-producer") as producer:
        pending: list[OutMessage] = []
        key = ""
        for j in range(count):
            if j % DUP_EVERY != DUP_EVERY - 1:
                key = f"k{j}"
            body = json.dumps({"uid": key}).encode()
            pending.append(OutMessage(TOPIC, body, properties={"UID": key}))
            if len(pending) == 64:
                producer.send_batch(pending)
                pending = []
        if pending:
            producer.send_batch(pending)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--child":
        row, namesrv, count, batch, urls_json = (
            argv[1],
            argv[2],
            int(argv[3]),
            int(argv[4]),
            argv[5],
        )
        if row.startswith(ANCHOR):
            return _child_official(row, namesrv, count, json.loads(urls_json))
        return _child_idemp(row, namesrv, count, batch, json.loads(urls_json))
    ap = argparse.ArgumentParser(prog="python -m benchmarks endtoend", description=__doc__)
    ap.add_argument("--count", type=int, default=100_000, help="messages (2 %% duplicates)")
    ap.add_argument("--batch", type=int, default=32, help="idemp's consume_batch_size")
    ap.add_argument("--rows", default=",".join(ROWS), help="which rows, comma separated")
    args = ap.parse_args(argv)
    rows = [r for r in args.rows.split(",") if r]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        ap.error(f"unknown rows {unknown}; choose from {', '.join(ROWS)}")
    from idemp.broker.process import BrokerProcess
    from tests.servers import PostgresServer, RedisServer

    with tempfile.TemporaryDirectory(prefix="idemp-bench-e2e-") as tmp:
        broker = BrokerProcess(Path(tmp) / "store").start()
        pg = PostgresServer()
        redis_server = RedisServer()
        pg.start()
        redis_server.start()
        urls = {
            "sqlite": f"sqlite:///{Path(tmp) / 'bench.db'}",
            "pg": pg.url,
            "redis": redis_server.url,
        }
        try:
            began = time.monotonic()
            _fill(broker.namesrv_addr, args.count)
            print(
                f"sent {args.count} messages ({_keys(args.count)} keys) in "
                f"{time.monotonic() - began:.1f} s",
                flush=True,
            )
            results: dict[str, dict[str, Any]] = {}
            for row in rows:
                pg_before = _pg_cpu(pg.pid or 0)
                redis_before = _redis_cpu(urls["redis"])
                got = _run_row(row, broker.namesrv_addr, args.count, args.batch, urls, tmp)
                got["store_cpu"] = {
                    "pg": _pg_cpu(pg.pid or 0) - pg_before,
                    "redis": _redis_cpu(urls["redis"]) - redis_before,
                }
                results[row] = got
                print(f"{row}: {_line(got, args.count)}", flush=True)
        finally:
            redis_server.close()
            pg.close()
            broker.stop()
    _table(results, args.count, args.batch)
    return 0


def _line(got: dict[str, Any], count: int) -> str:
    rate = got["count"] / max(got["seconds"], 1e-6)
    return f"{rate:,.0f} msg/s, {got['cpu'] / max(got['count'], 1) * 1e6:.0f} µs CPU/msg"


def _table(results: dict[str, dict[str, Any]], count: int, batch: int) -> None:
    print(
        f"\n{count} messages (2 % duplicates), idemp ConcurrentRunner 4 threads, batch "
        f"{batch}, idemp's broker, load average {os.getloadavg()[0]:.1f}"
    )
    head = (
        f"{'row':<28}{'msg/s':>9}{'CPU µs/msg':>12}{'loop':>6}{'listener':>10}"
        f"{'store µs/msg':>14}{'× ceiling':>11}{'× anchor':>10}  effects"
    )
    print(head)
    for row, got in results.items():
        rate = got["count"] / max(got["seconds"], 1e-6)
        n = max(got["count"], 1)
        store = got["store_cpu"]["pg"] + got["store_cpu"]["redis"]
        ceiling = results.get(f"ceiling-{_effects_db(row)}")
        vs_ceiling = ""
        if ceiling is not None and not row.startswith("ceiling"):
            vs_ceiling = f"{rate / (ceiling['count'] / max(ceiling['seconds'], 1e-6)):.2f}"
        anchor = results.get(ANCHOR + ("-sqlite" if _effects_db(row) == "sqlite" else ""))
        vs_anchor = ""
        if anchor is not None and not row.startswith(ANCHOR):
            vs_anchor = f"{rate / (anchor['count'] / max(anchor['seconds'], 1e-6)):.1f}"
        threads = got.get("threads") or {}
        loop = f"{threads['loop'] / n * 1e6:.0f}" if threads else ""
        listener = f"{threads['listener'] / n * 1e6:.0f}" if threads else ""
        print(
            f"{row:<28}{rate:>9,.0f}{got['cpu'] / n * 1e6:>12.0f}{loop:>6}{listener:>10}"
            f"{store / n * 1e6:>14.0f}{vs_ceiling:>11}{vs_anchor:>10}  {got['effects']}"
        )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

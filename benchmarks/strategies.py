"""Strategy benchmark: per-message cost of idemp's decorator against the raw store
operations it needs, same server, same process, one run.

    python -m benchmarks strategies [--n 5000]
    python -m benchmarks strategies --table-rows 1M,10M [--n 2000]

Every path runs in interleaved rounds (``interleaved``), median round reported.
Redis: ``RedisFlag`` (new key, duplicate, pipelined batch of 32) vs ``SET NX PX`` then
``SET XX EX`` with redis-py, and AWS Powertools' ``idempotent_function`` with its Redis
persistence layer on the same server (when ``aws-lambda-powertools`` is installed).
``RedissonLock`` per message against python-redis-lock's ``Lock`` (acquire + release).
PostgreSQL: ``UniqueKeyTable`` vs a bare INSERT then UPDATE (autocommit). SQLite: a
runner's batch of 32 in one transaction, ``UniqueKeyTable(transactional=True)`` and
``@guarded`` with the handler's INSERT, vs the same INSERTs without deduplication. Servers
are started on free loopback ports (``tests/servers.py``).
"""

from __future__ import annotations

import argparse
import hashlib
import random
import statistics
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import redis
import sqlalchemy as sa

from idemp import Message, idempotent
from idemp.strategies import Job, RedisFlag, UniqueKeyTable

Path = Callable[[int, int], None]  # (first message index, count)


def interleaved(paths: dict[str, Path], n: int, rounds: int) -> dict[str, float]:
    """µs per message of each path: every path runs ``n / rounds`` messages per round,
    round after round, and each path's median round is kept. On a shared machine a load
    spike then falls on every path alike instead of on whichever ran during it, so the
    ratios between paths hold better than the absolute figures. A path runs on messages
    ``[r * per, (r + 1) * per)`` in round ``r``; a later path of the same round may use the
    same messages (e.g. duplicates of the keys just processed)."""
    per = n // rounds
    samples: dict[str, list[float]] = {name: [] for name in paths}
    for r in range(rounds):
        for name, fn in paths.items():
            start = time.perf_counter()
            fn(r * per, per)
            samples[name].append((time.perf_counter() - start) / per * 1e6)
    return {name: statistics.median(v) for name, v in samples.items()}


def bench_redis(url: str, n: int, rounds: int = 10) -> dict[str, float]:
    client = redis.Redis.from_url(url)
    run = uuid.uuid4().hex[:6]
    strategy = RedisFlag(client)
    msgs = [Message("T", b"{}", keys=(f"k{i}",), msg_id=str(i)) for i in range(n)]

    @idempotent(key="keys", strategy=strategy, namespace=f"bench-{run}")
    def handle(message: Message) -> None:
        return None

    @idempotent.batch(key="keys", strategy=strategy, namespace=f"bench-batch-{run}")
    def handle_batch(messages: list[Message]) -> None:
        return None

    def raw(first: int, count: int) -> None:
        for i in range(first, first + count):
            k = f"raw:{run}:{i}"
            client.set(k, b"1", nx=True, px=60_000)
            client.set(k, b"2", xx=True, ex=604_800)

    def raw_batches(first: int, count: int) -> None:
        for i in range(first, first + count, 32):
            end = min(i + 32, first + count)
            pipe = client.pipeline(transaction=False)
            for j in range(i, end):
                pipe.set(f"rawb:{run}:{j}", b"1", nx=True, px=60_000)
            pipe.execute()
            pipe = client.pipeline(transaction=False)
            for j in range(i, end):
                pipe.set(f"rawb:{run}:{j}", b"2", xx=True, ex=604_800)
            pipe.execute()

    def new(first: int, count: int) -> None:
        for m in msgs[first : first + count]:
            handle(m)

    def batches(first: int, count: int) -> None:
        for i in range(first, first + count, 32):
            handle_batch(msgs[i : min(i + 32, first + count)])

    paths: dict[str, Path] = {
        "raw_two_commands_us": raw,
        "raw_batch32_us": raw_batches,
        "idemp_new_key_us": new,
        "idemp_duplicate_us": new,  # the keys the previous path just processed
        "idemp_batch32_new_us": batches,
    }
    paths.update(powertools_paths(client, n, run))
    paths.update(lock_paths(client, n, run))
    raw(n, 200)  # warm up connections and scripts
    handle(Message("T", b"{}", keys=("warm",), msg_id="w"))
    handle_batch([Message("T", b"{}", keys=("warm",), msg_id="w")])
    out = interleaved(paths, n, rounds)
    strategy.close()
    client.close()
    return out


def powertools_paths(client: redis.Redis, n: int, run: str) -> dict[str, Path]:
    """Powertools' idempotency utility (standalone ``idempotent_function``, Redis layer)."""
    try:
        from aws_lambda_powertools.utilities.idempotency import (
            IdempotencyConfig,
            idempotent_function,
        )
        from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
            RedisCachePersistenceLayer,
        )
    except ImportError:
        return {}
    import warnings

    # Outside Lambda it warns once per call that it cannot read the remaining time.
    warnings.filterwarnings("ignore", message="Couldn't determine the remaining time")
    layer = RedisCachePersistenceLayer(client=client)  # type: ignore[arg-type]  # Powertools' protocol types ex as float, redis-py as int
    config = IdempotencyConfig(event_key_jmespath="key", expires_after_seconds=604_800)

    @idempotent_function(
        data_keyword_argument="order", persistence_store=layer, config=config, key_prefix=run
    )
    def handle(order: dict[str, str]) -> dict[str, str]:
        return {}

    orders = [{"key": f"pt{i}"} for i in range(n)]

    def new(first: int, count: int) -> None:
        for order in orders[first : first + count]:
            handle(order=order)

    handle(order={"key": "warm"})
    return {"powertools_new_key_us": new, "powertools_duplicate_us": new}


def lock_paths(client: redis.Redis, n: int, run: str) -> dict[str, Path]:
    """A lock per message, uncontended: ``RedissonLock`` under ``@idempotent`` (lock
    script, handler, fencing check and unlock script; one shared watchdog thread) against
    python-redis-lock's ``Lock`` acquire + release, without and with its auto-renewal (a
    renewal thread per acquisition), on the same server."""
    import redis_lock

    from idemp.strategies import RedissonLock

    strategy = RedissonLock(client, prefix=f"bench-lock-{run}")
    msgs = [Message("T", b"{}", keys=(f"l{i}",), msg_id=str(i)) for i in range(n)]

    @idempotent(key="keys", strategy=strategy, namespace=f"bench-lock-{run}")
    def handle(message: Message) -> None:
        return None

    def redisson(first: int, count: int) -> None:
        for m in msgs[first : first + count]:
            handle(m)

    def python_redis_lock(renew: bool) -> Path:
        def path(first: int, count: int) -> None:
            for i in range(first, first + count):
                lock = redis_lock.Lock(
                    client, f"prl-{run}-{renew}:{i}", expire=30, auto_renewal=renew
                )
                lock.acquire()
                lock.release()

        return path

    handle(Message("T", b"{}", keys=("warm",), msg_id="w"))
    return {
        "redisson_lock_us": redisson,
        "redis_lock_us": python_redis_lock(False),
        "redis_lock_renewal_us": python_redis_lock(True),
    }


def bench_postgres(url: str, n: int, rounds: int = 10) -> dict[str, float]:
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    run = uuid.uuid4().hex[:6]
    strategy = UniqueKeyTable(url, table=f"bench_{run}")
    raw_table = sa.Table(
        f"bench_raw_{run}",
        sa.MetaData(),
        sa.Column("namespace", sa.String(255), primary_key=True),
        sa.Column("business_key", sa.String(255), primary_key=True),
        sa.Column("status", sa.String(16)),
    )
    raw_table.metadata.create_all(engine)
    ins = sa.insert(raw_table)
    upd = (
        sa.update(raw_table)
        .where(raw_table.c.namespace == sa.bindparam("ns"))
        .where(raw_table.c.business_key == sa.bindparam("k"))
        .values(status="CONSUMED")
    )
    msgs = [Message("T", b"{}", keys=(f"k{i}",), msg_id=str(i)) for i in range(n)]

    @idempotent(key="keys", strategy=strategy, namespace="bench")
    def handle(message: Message) -> None:
        return None

    conn = engine.connect()

    def raw(first: int, count: int) -> None:
        for i in range(first, first + count):
            conn.execute(ins, {"namespace": "b", "business_key": f"k{i}", "status": "C"})
            conn.execute(upd, {"ns": "b", "k": f"k{i}"})

    def new(first: int, count: int) -> None:
        for m in msgs[first : first + count]:
            handle(m)

    handle(Message("T", b"{}", keys=("warm",), msg_id="w"))
    out = interleaved(
        {"raw_insert_update_us": raw, "idemp_new_key_us": new, "idemp_duplicate_us": new},
        n,
        rounds,
    )
    conn.close()
    strategy.close()
    engine.dispose()
    return out


def bench_sqlite_batch(directory: str, n: int, rounds: int = 10) -> dict[str, float]:
    """A runner's batch of 32 on SQLite, in one thread, no broker: the handler's INSERT
    in the batch's transaction. The floor is the same INSERTs in one transaction per
    batch without deduplication; the rest of each idemp path is idemp's own per message
    (claims, savepoints, the step driver, results). The end-to-end suite measures the
    same listeners behind a runner, where the machine's spread is wider."""
    from idemp import Context, guarded
    from idemp.guards import RIDE_HAILING_ORDER, SqlStateStore
    from idemp.strategies._sql import make_engine

    url = f"sqlite:///{directory}/batch.db"
    engine = make_engine(url, 5.0, 4)
    meta = sa.MetaData()
    tables = {
        name: sa.Table(
            f"fx_{name}",
            meta,
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("k", sa.String(64), nullable=False, index=True),
        )
        for name in ("floor", "unique", "guarded")
    }
    meta.create_all(engine)
    msgs = [
        Message("T", f'{{"uid": "k{i}"}}'.encode(), properties={"UID": f"k{i}"}, msg_id=str(i))
        for i in range(n)
    ]
    unique = UniqueKeyTable(url, table="dedup_unique", transactional=True)
    guard_dedup = UniqueKeyTable(url, table="dedup_guarded", transactional=True)
    states = SqlStateStore(url, table="states")

    def joined(table: sa.Table) -> Callable[[Message, Context], None]:
        insert = table.insert()

        def handle(message: Message, ctx: Context) -> None:
            ctx.connection.execute(insert, {"k": message.properties["UID"]})

        return handle

    deduped = idempotent(key="property:UID", strategy=unique, group="g")(joined(tables["unique"]))
    ordered = guarded(
        RIDE_HAILING_ORDER,
        entity="property:UID",
        target=lambda m: "created",
        store=states,
        strategy=guard_dedup,
        key="property:UID",
        group="g",
        pass_context=True,
    )(joined(tables["guarded"]))
    floor_insert = tables["floor"].insert()

    def floor(first: int, count: int) -> None:
        for i in range(first, first + count, 32):
            with engine.begin() as conn:
                for m in msgs[i : min(i + 32, first + count)]:
                    conn.execute(floor_insert, {"k": m.properties["UID"]})

    def batches(listener: Any) -> Path:
        def path(first: int, count: int) -> None:
            for i in range(first, first + count, 32):
                listener.consume_batch(msgs[i : min(i + 32, first + count)])

        return path

    out = interleaved(
        {
            "sqlite_batch_floor_us": floor,
            "sqlite_batch_unique_key_tx_us": batches(deduped),
            "sqlite_batch_guarded_us": batches(ordered),
        },
        n,
        rounds,
    )
    for closing in (unique, guard_dedup, states):
        closing.close()
    engine.dispose()
    return out


def parse_rows(text: str) -> list[int]:
    """``"1M,10M"`` → ``[1_000_000, 10_000_000]`` (suffixes K and M)."""
    sizes = []
    for part in text.split(","):
        part = part.strip().upper()
        scale = {"K": 1_000, "M": 1_000_000}.get(part[-1:], 1)
        sizes.append(int(float(part.rstrip("KM")) * scale))
    return sizes


def _fill(engine: sa.Engine, table: sa.Table, rows: int, now: int) -> float:
    """Fill the dedup table with ``rows`` CONSUMED records in one INSERT … SELECT from
    generate_series (indexes dropped first and rebuilt after: much faster than
    maintaining them row by row), then VACUUM ANALYZE. Keys are md5 hex strings, so new
    keys land all over the primary-key B-tree as real business keys do. Every 10th row
    has already expired (for the purge). Returns the seconds it took."""
    start = time.perf_counter()
    name = table.name
    inspector = sa.inspect(engine)
    pk = inspector.get_pk_constraint(name)["name"]
    expiry_ix = [
        ix["name"] for ix in inspector.get_indexes(name) if ix["column_names"] == ["expires_ms"]
    ]
    with engine.begin() as conn:
        conn.exec_driver_sql("SET LOCAL maintenance_work_mem = '512MB'")
        conn.exec_driver_sql(f"ALTER TABLE {name} DROP CONSTRAINT {pk}")
        for ix in expiry_ix:
            conn.exec_driver_sql(f"DROP INDEX {ix}")
        conn.exec_driver_sql(
            f"INSERT INTO {name} (namespace, business_key, status, owner, fingerprint, attempts,"
            " deadline_ms, expires_ms, msg_id, created_ms, updated_ms)"
            " SELECT 'bench', md5(i::text), 'CONSUMED', 'fill', NULL, 1, NULL,"
            f" CASE WHEN mod(i, 10) = 0 THEN {now} - 1000 - i ELSE {now} + 86400000 + i END,"
            f" NULL, {now}, {now} FROM generate_series(1, {rows}) AS i"
        )
        conn.exec_driver_sql(
            f"ALTER TABLE {name} ADD CONSTRAINT {pk} PRIMARY KEY (namespace, business_key)"
        )
        for ix in expiry_ix:
            conn.exec_driver_sql(f"CREATE INDEX {ix} ON {name} (expires_ms)")
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(f"VACUUM ANALYZE {name}")
        # Flush the fill's dirty pages now, not during the measurement. (After a
        # checkpoint, the first change to each page writes it whole to the WAL: on a big
        # table new keys touch many pages, and that cost is part of what is measured.)
        conn.exec_driver_sql("CHECKPOINT")
    return time.perf_counter() - start


def _explain(engine: sa.Engine, strategy: UniqueKeyTable, job: Job) -> list[str]:
    """The plan of the claim statement as sent (PostgreSQL's one-trip insert-or-read)."""
    stmt = strategy._claim_one_trip
    row = strategy._row(job, "explain", int(time.time() * 1000), "CONSUMING")
    compiled = stmt.compile(dialect=engine.dialect)
    with engine.connect() as conn:
        plan = conn.exec_driver_sql(
            "EXPLAIN (COSTS OFF) " + str(compiled), compiled.construct_params(row)
        ).all()
        conn.rollback()
    return [line for (line,) in plan]


class _SizedTable:
    """One dedup table of ``rows`` records and the keys to claim on it."""

    def __init__(self, engine: sa.Engine, url: str, rows: int, n: int) -> None:
        self.rows = rows
        self.strategy = UniqueKeyTable(url, table=f"rows_{rows}_{uuid.uuid4().hex[:6]}")
        self.fill_s = _fill(engine, self.strategy.table, rows, int(time.time() * 1000))
        step = max(1, rows // (3 * n))
        live = [hashlib.md5(str(i).encode()).hexdigest() for i in range(1, rows + 1, step)]
        live = [h for i, h in zip(range(1, rows + 1, step), live) if i % 10]  # not expired
        random.Random(1).shuffle(live)
        self.fresh = _jobs([uuid.uuid4().hex for _ in range(2 * n + 200)])
        self.dups = _jobs(live[:n])
        self.new_us: list[float] = []
        self.dup_us: list[float] = []

    def claim(self, jobs: list[Job], expect: str) -> float:
        """µs per ``begin`` over ``jobs``; each must get the verdict ``expect``."""
        begin = self.strategy.begin
        start = time.perf_counter()
        verdicts = Counter(begin(job).verdict.name for job in jobs)
        elapsed = time.perf_counter() - start
        assert verdicts == Counter({expect: len(jobs)}), verdicts
        return elapsed / len(jobs) * 1e6


def _jobs(keys: list[str]) -> list[Job]:
    return [Job("bench", k, Message("T", b"{}", keys=(k,), msg_id=k[:8])) for k in keys]


def _purge_while_claiming(url: str, table: _SizedTable, jobs: list[Job]) -> dict[str, float]:
    """Purge (batches of 1,000, one transaction each) in a thread while ``jobs`` are
    claimed: the claims' µs and the purge batches' durations."""
    purger = UniqueKeyTable(url, table=table.strategy.table.name, create=False)
    batches: list[float] = []
    deleted = [0]
    stop = threading.Event()

    def purge() -> None:
        while not stop.is_set():
            start = time.perf_counter()
            gone = purger.purge(batch_size=1000, max_batches=1)
            batches.append(time.perf_counter() - start)
            deleted[0] += gone
            if gone == 0:
                return

    thread = threading.Thread(target=purge)
    thread.start()
    claim_us = table.claim(jobs, "RUN")
    stop.set()
    thread.join()
    purger.close()
    return {
        "claim_us": claim_us,
        "batches": len(batches),
        "rows": deleted[0],
        "max_ms": max(batches) * 1000,
        "median_ms": statistics.median(batches) * 1000,
    }


def main_table_rows(sizes: list[int], n: int, rounds: int = 10) -> int:
    """Fill one table per size, then claim on them in interleaved rounds (size A, size B,
    A, B, …) so that the load of a shared machine falls on every size alike; report the
    median round. Then the plan, and the purge while claims run."""
    from tests.servers import PostgresServer

    print("UniqueKeyTable claim cost by table size (PostgreSQL, µs per claim)")
    with PostgresServer() as ps:
        engine = sa.create_engine(ps.url)
        tables = [_SizedTable(engine, ps.url, rows, n) for rows in sizes]
        per = max(1, n // rounds)
        for t in tables:
            t.claim(t.fresh[:200], "RUN")  # warm up the pool and the statement cache
        for r in range(rounds):
            for t in tables:
                t.new_us.append(t.claim(t.fresh[200 + r * per : 200 + (r + 1) * per], "RUN"))
                t.dup_us.append(t.claim(t.dups[r * per : (r + 1) * per], "DUPLICATE"))
        status = 0
        for t in tables:
            plan = _explain(engine, t.strategy, t.fresh[0])
            rest = t.fresh[200 + rounds * per :][:n]
            p = _purge_while_claiming(ps.url, t, rest)
            print(f"  {t.rows:>11,} rows  (filled + VACUUM ANALYZE in {t.fill_s:.0f} s)")
            print(
                f"    claim, new key     median {statistics.median(t.new_us):8.1f}"
                f"  min {min(t.new_us):8.1f}  ({rounds} rounds of {per})"
            )
            print(
                f"    claim, duplicate   median {statistics.median(t.dup_us):8.1f}"
                f"  min {min(t.dup_us):8.1f}"
            )
            print(
                f"    claim, new, while purging {p['claim_us']:8.1f};  purge: {p['batches']:.0f}"
                f" batches of <=1000 ({p['rows']:.0f} rows), longest {p['max_ms']:.1f} ms,"
                f" median {p['median_ms']:.1f} ms"
            )
            scans = [line.strip() for line in plan if "Scan" in line or "Arbiter" in line]
            print("    plan: " + "; ".join(scans))
            if any("Seq Scan" in line for line in plan):
                print("    WARNING: a sequential scan in the claim plan")
                status = 1
            t.strategy.close()
        engine.dispose()
    return status


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks strategies")
    parser.add_argument("--n", type=int, default=5000, help="messages per measurement")
    parser.add_argument(
        "--table-rows",
        default="",
        help="e.g. 1M,10M: instead, claim cost of UniqueKeyTable at these table sizes",
    )
    args = parser.parse_args(argv)
    if args.table_rows:
        return main_table_rows(parse_rows(args.table_rows), min(args.n, 2000))
    from tests.servers import PostgresServer, RedisServer

    def row(label: str, us: float, ratio: str = "") -> None:
        print(f"  {label:<36}{us:8.1f}  {ratio}")

    with RedisServer() as rs:
        r = bench_redis(rs.url, args.n)
    raw = r["raw_two_commands_us"]
    print("Redis (per message, µs)")
    row("raw SET NX PX + SET XX EX", raw)
    for label, name in (
        ("RedisFlag new key", "idemp_new_key_us"),
        ("RedisFlag duplicate", "idemp_duplicate_us"),
    ):
        row(label, r[name], f"{r[name] / raw:5.2f}x raw")
    for label, name in (
        ("Powertools new key", "powertools_new_key_us"),
        ("Powertools duplicate", "powertools_duplicate_us"),
    ):
        if name in r:
            row(label, r[name], f"{r[name] / raw:5.2f}x raw")
    lock = r["redis_lock_us"]
    row("python-redis-lock acquire+release", lock)
    row(
        "python-redis-lock, auto-renewal",
        r["redis_lock_renewal_us"],
        f"{r['redis_lock_renewal_us'] / lock:5.2f}x plain",
    )
    row(
        "RedissonLock (watchdog), decorated",
        r["redisson_lock_us"],
        f"{r['redisson_lock_us'] / lock:5.2f}x plain",
    )
    raw_batch = r["raw_batch32_us"]
    row("raw pipelined 32 (2 pipelines)", raw_batch, f"{raw / raw_batch:5.1f}x faster/msg")
    batch = r["idemp_batch32_new_us"]
    row("RedisFlag batch of 32, new", batch, f"{r['idemp_new_key_us'] / batch:5.1f}x faster/msg")
    with PostgresServer() as ps:
        p = bench_postgres(ps.url, args.n)
    raw = p["raw_insert_update_us"]
    print("PostgreSQL (per message, µs)")
    row("raw INSERT + UPDATE", raw)
    for label, name in (
        ("UniqueKeyTable new key", "idemp_new_key_us"),
        ("UniqueKeyTable duplicate", "idemp_duplicate_us"),
    ):
        row(label, p[name], f"{p[name] / raw:5.2f}x raw")
    with tempfile.TemporaryDirectory() as directory:
        b = bench_sqlite_batch(directory, max(args.n, 3200))
    floor = b["sqlite_batch_floor_us"]
    print("SQLite, a runner's batch of 32 in one transaction (per message, µs)")
    row("the INSERTs alone (floor)", floor)
    for label, name in (
        ("UniqueKeyTable transactional", "sqlite_batch_unique_key_tx_us"),
        ("@guarded + UniqueKeyTable tx", "sqlite_batch_guarded_us"),
    ):
        row(label, b[name], f"idemp's own {b[name] - floor:5.1f}")
    return 0

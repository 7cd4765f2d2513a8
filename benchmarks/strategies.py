"""Strategy benchmark: per-message cost of idemp's decorator against the raw store
operations it needs, same server, same process, one run.

    python -m benchmarks strategies [--n 5000]

Redis: ``RedisFlag`` (new key, duplicate, pipelined batch of 32) vs ``SET NX PX`` then
``SET XX EX`` with redis-py, and AWS Powertools' ``idempotent_function`` with its Redis
persistence layer on the same server (when ``aws-lambda-powertools`` is installed).
PostgreSQL: ``UniqueKeyTable`` vs a bare INSERT then UPDATE (autocommit). Servers are
started on free loopback ports (``tests/servers.py``).
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable

import redis
import sqlalchemy as sa

from idemp import Message, idempotent
from idemp.strategies import RedisFlag, UniqueKeyTable


def per_msg_us(fn: Callable[[int], None], n: int) -> float:
    start = time.perf_counter()
    fn(n)
    return (time.perf_counter() - start) / n * 1e6


def bench_redis(url: str, n: int) -> dict[str, float]:
    client = redis.Redis.from_url(url)
    out: dict[str, float] = {}
    run = uuid.uuid4().hex[:6]

    def raw(count: int) -> None:
        for i in range(count):
            k = f"raw:{run}:{i}"
            client.set(k, b"1", nx=True, px=60_000)
            client.set(k, b"2", xx=True, ex=604_800)

    strategy = RedisFlag(client)
    msgs = [Message("T", b"{}", keys=(f"k{i}",), msg_id=str(i)) for i in range(n)]

    @idempotent(key="keys", strategy=strategy, namespace=f"bench-{run}")
    def handle(message: Message) -> None:
        return None

    @idempotent.batch(key="keys", strategy=strategy, namespace=f"bench-batch-{run}")
    def handle_batch(messages: list[Message]) -> None:
        return None

    def new(count: int) -> None:
        for m in msgs[:count]:
            handle(m)

    def batches(count: int) -> None:
        for i in range(0, count, 32):
            handle_batch(msgs[i : i + 32])

    def raw_batches(count: int) -> None:
        for i in range(0, count, 32):
            pipe = client.pipeline(transaction=False)
            for j in range(i, min(i + 32, count)):
                pipe.set(f"rawb:{run}:{j}", b"1", nx=True, px=60_000)
            pipe.execute()
            pipe = client.pipeline(transaction=False)
            for j in range(i, min(i + 32, count)):
                pipe.set(f"rawb:{run}:{j}", b"2", xx=True, ex=604_800)
            pipe.execute()

    raw(200)  # warm up connections and scripts
    handle(Message("T", b"{}", keys=("warm",), msg_id="w"))
    out["raw_two_commands_us"] = per_msg_us(raw, n)
    out["raw_batch32_us"] = per_msg_us(raw_batches, n)
    out["idemp_new_key_us"] = per_msg_us(new, n)
    out["idemp_duplicate_us"] = per_msg_us(new, n)  # the same keys again
    out["idemp_batch32_new_us"] = per_msg_us(batches, n)
    out.update(bench_powertools(client, n, run))
    strategy.close()
    client.close()
    return out


def bench_powertools(client: redis.Redis, n: int, run: str) -> dict[str, float]:
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
    layer = RedisCachePersistenceLayer(client=client)
    config = IdempotencyConfig(event_key_jmespath="key", expires_after_seconds=604_800)

    @idempotent_function(
        data_keyword_argument="order", persistence_store=layer, config=config, key_prefix=run
    )
    def handle(order: dict[str, str]) -> dict[str, str]:
        return {}

    orders = [{"key": f"pt{i}"} for i in range(n)]

    def new(count: int) -> None:
        for order in orders[:count]:
            handle(order=order)

    handle(order={"key": "warm"})
    return {
        "powertools_new_key_us": per_msg_us(new, n),
        "powertools_duplicate_us": per_msg_us(new, n),
    }


def bench_postgres(url: str, n: int) -> dict[str, float]:
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
    out: dict[str, float] = {}
    msgs = [Message("T", b"{}", keys=(f"k{i}",), msg_id=str(i)) for i in range(n)]

    @idempotent(key="keys", strategy=strategy, namespace="bench")
    def handle(message: Message) -> None:
        return None

    with engine.connect() as conn:

        def raw(count: int) -> None:
            for i in range(count):
                conn.execute(ins, {"namespace": "b", "business_key": f"k{i}", "status": "C"})
                conn.execute(upd, {"ns": "b", "k": f"k{i}"})

        out["raw_insert_update_us"] = per_msg_us(raw, n)

    def new(count: int) -> None:
        for m in msgs[:count]:
            handle(m)

    out["idemp_new_key_us"] = per_msg_us(new, n)
    out["idemp_duplicate_us"] = per_msg_us(new, n)
    strategy.close()
    engine.dispose()
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks strategies")
    parser.add_argument("--n", type=int, default=5000, help="messages per measurement")
    args = parser.parse_args(argv)
    from tests.servers import PostgresServer, RedisServer

    def row(label: str, us: float, ratio: str = "") -> None:
        print(f"  {label:<30}{us:8.1f}  {ratio}")

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
    return 0

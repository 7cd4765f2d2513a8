"""Worker processes for the race and crash tests.

    python -m tests.idempotency.workers race  SPEC_JSON PG_URL THREADS KEYS SEED [BATCH]
    python -m tests.idempotency.workers crash SPEC_JSON PG_URL KEY

``race``: builds the strategy, prints ``ready``, waits for ``go`` on stdin (so every
process starts at once), then THREADS threads each deliver all KEYS business keys in
their own shuffled order; a delivery answered "reconsume later" is delivered again later,
as the broker would; with BATCH > 1 each thread hands the listener BATCH deliveries at a
time (``consume_batch``, the runners' batch path). Prints one JSON line of outcome counts.

``crash``: delivers KEY once with a handler that (in transactional mode) writes its effect
and then prints ``claimed`` and blocks forever: the test SIGKILLs it inside the window
between claim and commit.
"""

from __future__ import annotations

import collections
import json
import os
import random
import sys
import threading
from typing import Any

import redis

from idemp import Context, Message, ack_of, idempotent
from tests.idempotency.effects import Effects
from tests.idempotency.specs import build

NS = "race-group/Orders"
MAX_ROUNDS = 2000  # per key and thread: a bound, far above what contention needs


def race(
    spec: dict[str, Any], pg_url: str, threads: int, keys: int, seed: int, batch: int = 1
) -> None:
    strategy = build(spec)
    effects = Effects(spec, pg_url, worker=str(os.getpid()))

    kind = spec["kind"]
    flags = redis.Redis.from_url(spec["url"]) if kind == "redisson" else None

    @idempotent(key="keys", strategy=strategy, namespace=NS, name="race")
    def handle(message: Message, ctx: Context) -> None:
        if kind == "pg_optimistic":  # a second creator conflicts, re-reads, is stale
            ctx.handle.insert(state="done")
        elif kind == "pg_pessimistic":  # check-then-act under the row lock
            if ctx.handle.row["state"] == "done":
                return
            ctx.handle.update(state="done")
        elif kind == "redisson":  # check-then-act (on a Redis flag) under the lock
            done = f"{spec['name']}:done:{ctx.key}"
            assert flags is not None
            if flags.get(done):
                return
            ctx.handle.check()
            effects.apply(message, ctx)
            flags.set(done, b"1")
            return
        effects.apply(message, ctx)

    counts: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    errors: list[str] = []

    def worker(n: int) -> None:
        order = [f"k{i:04d}" for i in range(keys)]
        random.Random(seed * 100 + n).shuffle(order)
        pending = collections.deque((k, 0) for k in order)
        local: collections.Counter[str] = collections.Counter()
        try:
            while pending:
                taken = [pending.popleft() for _ in range(min(batch, len(pending)))]
                msgs = [
                    Message("Orders", b"{}", keys=(key,), msg_id=f"{key}-{n}-{rounds}")
                    for key, rounds in taken
                ]
                # batch > 1: the runners' batch path (one session per batch)
                results = handle.consume_batch(msgs) if batch > 1 else [handle(msgs[0])]
                assert len(results) == len(taken)
                for (key, rounds), result in zip(taken, results):
                    local[result.outcome.name] += 1
                    if not ack_of(result):
                        if rounds >= MAX_ROUNDS:
                            raise RuntimeError(f"{key} never acked: {result.outcome}")
                        pending.append((key, rounds + 1))
        except Exception as exc:  # reported to the test, which fails
            errors.append(repr(exc))
        with lock:
            counts.update(local)

    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    print(json.dumps({"counts": dict(counts), "errors": errors}), flush=True)
    strategy.close()
    effects.close()


def crash(spec: dict[str, Any], pg_url: str, key: str) -> None:
    strategy = build(spec)
    effects = Effects(spec, pg_url, worker=str(os.getpid()))

    @idempotent(key="keys", strategy=strategy, namespace=NS)
    def handle(message: Message, ctx: Context) -> None:
        if effects.transactional:  # the effect shares the claim's transaction
            effects.apply(message, ctx)
        print("claimed", flush=True)
        threading.Event().wait()  # until SIGKILL

    handle(Message("Orders", b"{}", keys=(key,), msg_id="crash-1"))


if __name__ == "__main__":
    command, spec_json, pg = sys.argv[1], sys.argv[2], sys.argv[3]
    spec = json.loads(spec_json)
    if command == "race":
        batch = int(sys.argv[7]) if len(sys.argv) > 7 else 1
        race(spec, pg, int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), batch)
    elif command == "crash":
        crash(spec, pg, sys.argv[4])
    else:
        raise SystemExit(f"unknown command {command}")

"""Two SimpleConsumers of one group and a handler slower than the invisible duration, in
a child process of .cache/v5-venv (see test_adapter.py).

    python slow5.py '{"endpoint": ..., "topic": ..., "group": ..., "db": ..., "within": s}'

The first handler of the key sleeps ``slow_s`` (longer than the invisible duration)
before its effect: the message becomes visible again and the other consumer receives it
while the first still works. The claim (deadline 60 s) makes that delivery "in progress",
so it is neither acked nor run; after the first commits, a later delivery is a duplicate.
Prints the counters and how many receives each consumer made.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import sqlalchemy as sa
from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

from idemp import Message, idempotent, stats
from idemp.adapters import rocketmq5
from idemp.strategies import UniqueKeyTable


def main() -> None:
    spec: dict[str, Any] = json.loads(sys.argv[1])
    url = f"sqlite:///{spec['db']}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE IF NOT EXISTS effects (id TEXT, runner TEXT)"))
    runs: list[str] = []

    @idempotent(
        key="json:$.id",
        # autocommit claims: the claim row is visible to the other consumer at once (in
        # a transactional table it would wait on the first handler's open transaction)
        strategy=UniqueKeyTable(url, deadline_s=60),
        name="slow5",
    )
    def handle(message: Message) -> None:
        runs.append(threading.current_thread().name)
        time.sleep(spec["slow_s"])  # slower than the invisible duration
        with engine.begin() as conn:
            conn.execute(
                sa.text("INSERT INTO effects VALUES (:id, :runner)"),
                {"id": message.json()["id"], "runner": threading.current_thread().name},
            )

    cfg = ClientConfiguration(spec["endpoint"], Credentials(), request_timeout=10)
    stop = threading.Event()
    counts: dict[str, dict[str, int]] = {}

    def consumer(name: str) -> None:
        c = SimpleConsumer(cfg, spec["group"], {spec["topic"]: FilterExpression("*")}, 5)
        c.startup()
        counts[name] = rocketmq5.consume(
            c,
            handle,
            group=spec["group"],
            invisible_duration=spec["invisible"],
            max_messages=1,
            stop=stop,
        )
        c.shutdown()

    threads = [threading.Thread(target=consumer, args=(n,), name=n) for n in ("A", "B")]
    for t in threads:
        t.start()
    deadline = time.monotonic() + spec["within"]
    while stats("slow5")["duplicates"] < 1 and time.monotonic() < deadline:
        time.sleep(0.2)  # the consumers work on their own threads; poll the counters
    stop.set()
    for t in threads:
        t.join(60)
    print(json.dumps({"stats": stats("slow5"), "runs": runs, "counts": counts}), flush=True)


if __name__ == "__main__":
    main()

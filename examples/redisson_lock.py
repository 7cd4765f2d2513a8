"""A Redisson-style lock around a non-idempotent call.

The SMS gateway below charges per call and has no idempotency key: calling it twice
sends two texts. Duplicates of one ``RideArrived`` event are delivered to 8 threads at
once; the lock (reentrant, leased, renewed by a watchdog, with a fencing token) makes
them take turns, and under the lock the handler checks a "sent" marker before it calls.
``ctx.handle.check()`` refuses the call if the lease was lost meanwhile.

    REDIS_URL=redis://127.0.0.1:6379/0 python examples/redisson_lock.py
"""

from __future__ import annotations

import json
import threading
from collections import Counter

from _embedded import broker, producer, redis_url, send, settings, wait_until

from idemp import Context, Message, idempotent, stats
from idemp.runners import ConcurrentRunner
from idemp.strategies import RedissonLock

TOPIC, GROUP = "RideArrived", "sms"
RIDES = 12
texts: Counter[str] = Counter()
_gateway = threading.Lock()


def send_sms(phone: str, text: str) -> None:
    """The non-idempotent third-party call."""
    with _gateway:
        texts[phone] += 1


def main() -> int:
    with redis_url() as url, broker() as namesrv:
        strategy = RedissonLock(url, lease_s=30, renew_s=10, wait_s=5, prefix="example")
        marks = strategy.client

        @idempotent(key="json:$.ride", strategy=strategy, name="sms")
        def notify(message: Message, ctx: Context) -> None:
            ride = message.json()
            mark = f"example:sms-sent:{ride['ride']}"
            if marks.exists(mark):
                return  # a duplicate: the text went out under an earlier hold
            ctx.handle.check()  # still our lease (fencing token current)?
            send_sms(ride["phone"], f"Your ride {ride['ride']} has arrived")
            marks.set(mark, ctx.handle.token, ex=72 * 3600)

        p = producer(namesrv)
        for i in range(RIDES):
            body = json.dumps({"ride": f"r-{i}", "phone": f"+100000{i:02d}"})
            for _ in range(3):  # three copies of every event, consumed concurrently
                send(p, TOPIC, body, f"r-{i}")
        p.shutdown()
        consumer, client = settings(namesrv, GROUP)
        consumer.consume_thread_count = 8
        runner = ConcurrentRunner(notify, settings=consumer, client=client)
        runner.subscribe(TOPIC)
        runner.start()
        try:
            wait_until(
                lambda: stats("sms")["processed"] == 3 * RIDES,
                90,
                "every copy handled under the lock",
            )
        finally:
            runner.shutdown()
            strategy.close()
    c = stats("sms")
    print(
        f"texts sent {sum(texts.values())} to {len(texts)} phones for {RIDES} rides "
        f"({3 * RIDES} deliveries); waited for the lock and came back later: "
        f"{c['in_progress']}"
    )
    return 0 if set(texts.values()) == {1} and len(texts) == RIDES else 1


if __name__ == "__main__":
    raise SystemExit(main())

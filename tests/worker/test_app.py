"""The App in-process: a listener's backend chosen by the environment alone (real
SQLite, PostgreSQL and Redis), and the app inside an asyncio program, cancellable."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest

from idemp import App, Message, Outcome, idempotent
from idemp.broker.process import BrokerProcess
from idemp.client import ConsumeFrom, OutMessage, Producer
from idemp.config import IdempSettings
from idemp.strategies import RedisFlag, UniqueKeyTable
from tests.client.conftest import wait_for


def _at_least(rows: list[Any], n: int) -> bool:
    return len(rows) >= n


def _settled(spec: Any) -> bool:
    return bool(spec.lag() == 0 and spec.in_flight() == 0)


def _msg(key: str) -> Message:
    return Message("Orders", b"{}", keys=(key,), msg_id=uuid.uuid4().hex, consumer_group="g")


@pytest.mark.parametrize("backend", ["sqlite", "postgres", "redis"])
def test_a_listeners_backend_is_switched_by_the_environment_alone(
    backend: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    url, expected = {
        "sqlite": (lambda: f"sqlite:///{tmp_path / 'dedup.db'}", UniqueKeyTable),
        "postgres": (lambda: request.getfixturevalue("postgres_server").url, UniqueKeyTable),
        "redis": (lambda: request.getfixturevalue("redis_server").url, RedisFlag),
    }[backend]
    # The code below is the same for every backend: only the environment differs.
    monkeypatch.setenv("IDEMP_LISTENERS__on_order__BACKEND", url())
    monkeypatch.setenv("IDEMP_TABLE", f"t_{uuid.uuid4().hex[:10]}")
    monkeypatch.setenv("IDEMP_KEY_PREFIX", f"p{uuid.uuid4().hex[:10]}")
    monkeypatch.setenv("IDEMP_BACKEND", "sqlite:///nowhere/never-used.db")  # the others'
    app = App("svc", namesrv_addr="127.0.0.1:1")
    applied: list[str] = []

    @app.listener("Orders", group="g")
    def on_order(message: Message) -> None:
        applied.append(message.keys[0])

    app.build()
    spec = app.listeners[0]
    try:
        assert type(spec.strategies[0]) is expected
        first, again = spec.listener(_msg("o-1")), spec.listener(_msg("o-1"))
        assert (first.outcome, again.outcome) == (Outcome.PROCESSED, Outcome.DUPLICATE)
        assert applied == ["o-1"]
        record = spec.strategies[0].get("g/Orders", "o-1")
        assert record is not None and record.status == "CONSUMED"
    finally:
        for s in spec.strategies:
            s.close()


def test_serve_inside_asyncio_with_sync_and_async_listeners(
    make_broker: Callable[..., BrokerProcess], tmp_path: Any
) -> None:
    broker = make_broker()
    seen: dict[str, list[str]] = {"sync": [], "async": []}
    lock = threading.Lock()
    app = App("svc", namesrv_addr=broker.namesrv_addr)
    backend = f"sqlite:///{tmp_path / 'dedup.db'}"

    @app.listener("A", group="ga", strategy=backend, consume_from=ConsumeFrom.FIRST_OFFSET)
    def sync_listener(message: Message) -> None:
        with lock:
            seen["sync"].append(json.loads(message.body)["id"])

    @app.listener("B", group="gb", strategy=backend, consume_from=ConsumeFrom.FIRST_OFFSET)
    async def async_listener(message: Message) -> None:
        await asyncio.sleep(0)
        with lock:
            seen["async"].append(json.loads(message.body)["id"])

    producer = Producer(broker.namesrv_addr, "p").start()
    for i in range(10):
        for topic in ("A", "B"):
            body = json.dumps({"id": f"{topic}{i}"}).encode()
            producer.send(OutMessage(topic, body, keys=[f"{topic}{i}"]))
    producer.shutdown()

    async def main() -> None:
        task = asyncio.create_task(app.serve())
        loop = asyncio.get_running_loop()
        done = lambda: len(seen["sync"]) == 10 and len(seen["async"]) == 10  # noqa: E731
        await loop.run_in_executor(None, wait_for, done, 60, "both listeners")
        assert app.running and all(app.ready().values())
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert not app.running
    assert sorted(seen["sync"]) == sorted(f"A{i}" for i in range(10))
    assert sorted(seen["async"]) == sorted(f"B{i}" for i in range(10))


def test_a_listener_subscribed_with_an_sql92_selector(
    make_broker: Callable[..., BrokerProcess], tmp_path: Any
) -> None:
    """``sql=`` instead of ``tags=``: the broker (here with enablePropertyFilter=true, as a
    RocketMQ 4.x broker needs it) delivers only what the selector selects."""
    broker = make_broker(enablePropertyFilter="true")
    seen: list[str] = []  # list.append is atomic: the consume threads need no lock
    app = App("svc", namesrv_addr=broker.namesrv_addr)
    backend = f"sqlite:///{tmp_path / 'dedup.db'}"

    @app.listener(
        "Fares",
        group="gs",
        strategy=backend,
        consume_from=ConsumeFrom.FIRST_OFFSET,
        sql="cents >= 1000 AND TAGS = 'ride'",
    )
    def big_fares(message: Message) -> None:
        seen.append(message.keys[0])

    producer = Producer(broker.namesrv_addr, "p").start()
    for i, (cents, tag) in enumerate(
        [(500, "ride"), (1500, "ride"), (2500, "tip"), (1000, "ride")]
    ):
        body = json.dumps({"cents": cents}).encode()
        props = {"cents": str(cents)}
        producer.send(OutMessage("Fares", body, keys=[f"f{i}"], tags=tag, properties=props))
    producer.shutdown()
    app.start()
    try:
        wait_for(lambda: len(seen) >= 2, 30, "the two big ride fares")
        assert sorted(seen) == ["f1", "f3"]
    finally:
        app.stop()
    with pytest.raises(ValueError, match="sql= is a whole selector"):
        app.listener("Fares", group="g2", tags="ride", sql="cents > 1")


def test_a_listeners_consumer_settings_reach_its_runner_and_bad_ones_fail_early(
    tmp_path: Any,
) -> None:
    app = App("svc", namesrv_addr="127.0.0.1:1")
    backend = f"sqlite:///{tmp_path / 'dedup.db'}"

    @app.listener("Fares", group="g1", strategy=backend, retry_delay_level=2, max_reconsume_times=3)
    def fares(message: Message) -> None:
        pass

    app.build()  # builds the runners; nothing connects yet
    settings = app.listeners[0].runner.settings
    assert (settings.retry_delay_level, settings.max_reconsume_times) == (2, 3)
    with pytest.raises(ValueError, match="max_reconsume_times=-2: 0 or more, or -1"):
        app.listener("Fares", group="g3", max_reconsume_times=-2)
    # the settings' namespace (IDEMP_NAMESPACE) is the runners': on the wire only
    spaced = App(
        "svc3",
        namesrv_addr="127.0.0.1:1",
        settings=IdempSettings(backend=backend, namespace="ns1"),
    )
    spaced.listener("Fares", group="g4")(fares)
    spaced.build()
    runner = spaced.listeners[0].runner
    assert (runner.consumer.group, runner.settings.group) == ("ns1%g4", "g4")
    assert list(runner.consumer.subscriptions) == ["ns1%Fares"]
    bad = App("svc2", namesrv_addr="127.0.0.1:1")
    bad.listener("Fares", group="g2", strategy=backend, retry_delay_level=-2)(fares)
    with pytest.raises(ValueError, match="retry_delay_level=-2"):
        bad.build()


def _recorder(seen: list[str]) -> Callable[[Message], None]:
    def on_price(message: Message) -> None:
        seen.append(message.keys[0])  # list.append is atomic: no lock for the threads

    return on_price


@pytest.mark.parametrize("orderly", [False, True], ids=["concurrent", "orderly"])
def test_a_broadcasting_listener_applies_each_message_once_in_every_instance(
    orderly: bool,
    make_broker: Callable[..., BrokerProcess],
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two instances of one service (two Apps here, named by IDEMP_INSTANCE) share a dedup
    store: with broadcast=True each applies every message once, a duplicate send included
    (orderly: in the queue's order, with no queue lock to take); their records and offsets
    are their own."""
    broker = make_broker()
    monkeypatch.setenv("HOME", str(tmp_path))  # the local offsets: ~/.rocketmq_offsets
    backend = f"sqlite:///{tmp_path / 'dedup.db'}"
    applied: dict[str, list[str]] = {"a": [], "b": []}
    apps = []
    for name in applied:
        app = App(
            "cache-svc",
            namesrv_addr=broker.namesrv_addr,
            settings=IdempSettings(backend=backend, instance=name),
        )
        app.listener(
            "Prices",
            group="cache",
            consume_from=ConsumeFrom.FIRST_OFFSET,
            broadcast=True,
            orderly=orderly,
        )(_recorder(applied[name]))
        apps.append(app)
    producer = Producer(broker.namesrv_addr, "p").start()
    for key in ("p1", "p2", "p1", "p3"):  # p1 twice: a producer's retry, a new msgId
        producer.send_orderly(OutMessage("Prices", b"{}", keys=[key]), "prices")
    producer.shutdown()
    for app in apps:
        app.start()
    try:
        for name, rows in applied.items():
            wait_for(partial(_at_least, rows, 3), 30, f"instance {name}: three keys")
        for app in apps:  # every copy handed over (the duplicate absorbed, not applied)
            wait_for(partial(_settled, app.listeners[0]), 30, "all consumed")
    finally:
        for app in apps:
            app.stop()
    # one queue (one sharding key): in its order when orderly, in any order when not
    got = applied if orderly else {k: sorted(v) for k, v in applied.items()}
    assert got == {"a": ["p1", "p2", "p3"], "b": ["p1", "p2", "p3"]}
    offsets = sorted(
        p.parent.parent.name.split("@")[1]
        for p in tmp_path.glob(".rocketmq_offsets/*/cache/offsets.json")
    )
    assert offsets == ["a", "b"]
    store = UniqueKeyTable(backend)
    try:
        assert store.get("cache@a/Prices", "p1").status == "CONSUMED"  # type: ignore[union-attr]
        assert store.get("cache@b/Prices", "p1").status == "CONSUMED"  # type: ignore[union-attr]
        assert store.get("cache/Prices", "p1") is None
    finally:
        store.close()


def test_a_broadcasting_listener_needs_its_instance_named(tmp_path: Any) -> None:
    backend = f"sqlite:///{tmp_path / 'dedup.db'}"
    app = App("svc", namesrv_addr="127.0.0.1:1", settings=IdempSettings(backend=backend))

    @app.listener("Prices", group="cache", broadcast=True)
    def on_price(message: Message) -> None:
        pass

    with pytest.raises(ValueError, match=r"broadcast=True: .* set IDEMP_INSTANCE"):
        app.build()
    with pytest.raises(ValueError, match="instance 'a/b': letters, digits"):
        app.name_instance("a/b")  # idemp worker --instance, checked as IDEMP_INSTANCE is
    app.name_instance("pod-1")
    app.build()
    runner = app.listeners[0].runner
    assert runner is not None and runner.client_settings.instance_name == "pod-1"
    with pytest.raises(ValueError, match="RocketMQ 5's gRPC clients have no broadcasting"):
        app.listener("Prices", group="c5", protocol="grpc", broadcast=True)
    named = App(
        "svc", namesrv_addr="127.0.0.1:1", settings=IdempSettings(backend=backend, instance="a")
    )
    named.listener("Prices", group="cache", broadcast=True)(
        idempotent(key="keys", strategy=backend, group="cache")(on_price)
    )
    with pytest.raises(ValueError, match="give the App the plain function"):
        named.build()
    with pytest.raises(ValueError, match="instance 'a/b': letters, digits"):
        IdempSettings(instance="a/b")

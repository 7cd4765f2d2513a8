"""The application object: listeners declared where they are written, run together.

    app = App("orders-service")

    @app.listener("Orders", group="orders", key="json:order_id")
    def on_order(message, ctx): ...

Each listener names its topic, tag expression, consumer group, orderly or concurrent,
business key, strategy and threads. The strategy is an object, a backend URL, or a name
resolved from the settings (``IDEMP_*`` environment, the ``IDEMP_CONFIG`` TOML file) when
the app starts, so switching a listener from SQLite to PostgreSQL or Redis is an
environment change. A function already decorated with ``@idempotent``/``@guarded`` is
run as it is.

``app.start()``/``app.stop()`` are the blocking pair; ``await app.serve()`` runs the app
inside an asyncio program until cancelled; ``idemp worker module:app`` runs it in the
foreground with health, readiness and metrics over HTTP (:mod:`idemp.worker`).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from idemp.client import ClientSettings, ConsumeFrom, ConsumerSettings, MessageModel
from idemp.config import IdempSettings
from idemp.keys import KeySpec
from idemp.pipeline import AsyncIdempotentListener, IdempotentListener, idempotent
from idemp.runners import ConcurrentRunner, OrderlyRunner
from idemp.runners.base import check_group
from idemp.strategies.base import StoreError, Strategy

log = logging.getLogger("idemp.app")

_DECORATED = (IdempotentListener, AsyncIdempotentListener)


@dataclass
class ListenerSpec:
    """One declared listener and, once the app runs, its runner."""

    name: str
    fn: Callable[..., Any]
    topic: str
    group: str
    tags: str = "*"
    orderly: bool = False
    key: KeySpec = "keys"
    strategy: Strategy | str | None = None
    threads: int | None = None
    batch_size: int = 1
    consume_from: ConsumeFrom = ConsumeFrom.LAST_OFFSET
    protocol: str = "remoting"  # or "grpc": RocketMQ 5's official client, POP
    listener: Any = None  # the decorated listener that runs
    runner: Any = None  # a ConcurrentRunner, an OrderlyRunner, or rocketmq5.PushRunner
    latency: Any = None  # set by the worker: a histogram child, or None
    started: bool = False
    strategies: list[Strategy] = field(default_factory=list)  # built here: closed at stop
    sql: str | None = None  # an SQL92 selector over properties, instead of tags
    retry_delay_level: int = 0  # send-backs' delay level (0: the broker's schedule)
    max_reconsume_times: int = 16  # then the DLQ (-1: Java's, 16 or forever when orderly)
    broadcast: bool = False  # every instance gets every message (RocketMQ's BROADCASTING)

    def lag(self) -> int:
        """Messages stored in the broker and not yet consumed by this instance's queues
        (the broker's max offset, from the last pull, minus the consumed offset)."""
        runner = self.runner
        if runner is None or self.protocol == "grpc":
            return 0  # POP: the broker, not this instance, knows what is left
        consumer = runner.consumer
        total = 0
        for mq, pq in list(consumer.process_queues.items()):
            done = consumer.offsets.read_memory(mq) if consumer.offsets is not None else None
            if pq.broker_max_offset >= 0 and done is not None:
                total += max(0, pq.broker_max_offset - done)
        return total

    def queues_held(self) -> int:
        """Queues this instance consumes (orderly: those it holds the broker's lock of)."""
        runner = self.runner
        if runner is None or self.protocol == "grpc":
            return 0  # POP: no queue belongs to an instance
        pqs = list(runner.consumer.process_queues.values())
        return sum(1 for pq in pqs if pq.locked and not pq.dropped) if self.orderly else len(pqs)

    def in_flight(self) -> int:
        runner = self.runner
        if runner is None:
            return 0
        if self.protocol == "grpc":
            return int(runner.in_flight())
        return sum(pq.msg_count for pq in list(runner.consumer.process_queues.values()))


class App:
    """Collects listeners and runs each on idemp's runners."""

    def __init__(
        self,
        name: str = "idemp",
        *,
        namesrv_addr: str | None = None,
        settings: IdempSettings | None = None,
        client: ClientSettings | None = None,
        endpoint: str | None = None,
    ) -> None:
        self.name = name
        self._endpoint = endpoint
        self._settings = settings
        self._namesrv = namesrv_addr
        self._client = client
        self.listeners: list[ListenerSpec] = []
        self._lock = threading.Lock()
        self.running = False
        self.stopping = False

    @property
    def settings(self) -> IdempSettings:
        """Read when the app starts (not at import): the environment of the worker."""
        if self._settings is None:
            self._settings = IdempSettings.load()
        return self._settings

    def listener(
        self,
        topic: str,
        *,
        group: str,
        tags: str = "*",
        orderly: bool = False,
        key: KeySpec = "keys",
        strategy: Strategy | str | None = None,
        threads: int | None = None,
        batch_size: int = 1,
        name: str | None = None,
        consume_from: ConsumeFrom = ConsumeFrom.LAST_OFFSET,
        protocol: str = "remoting",
        sql: str | None = None,
        retry_delay_level: int = 0,
        max_reconsume_times: int = 16,
        broadcast: bool = False,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Declare a listener: ``topic``, ``tags`` (a tag expression), consumer ``group``,
        ``orderly`` (per-queue order, the broker's queue locks) or concurrent, ``key`` and
        ``strategy`` (an object, a URL, or a configured name; default: the listener's name
        if the settings configure it, else the global backend), ``threads`` (the runner's
        consume threads), ``batch_size`` (messages per hand-off). ``protocol="grpc"`` runs
        it on RocketMQ 5's official client (``PushConsumer``, the ``rocketmq5`` extra)
        against the proxy at ``App(endpoint=...)``/``IDEMP_ENDPOINT``: order comes from a
        FIFO group there, not from ``orderly``. The function is returned unchanged, so it
        can still be called directly. ``sql`` subscribes with an SQL92 selector over the
        messages' properties instead of tags (RocketMQ 4.x brokers need
        ``enablePropertyFilter=true``; the runner checks with them at start).
        ``retry_delay_level`` is the delay level of a concurrent listener's messages sent
        back unacked (0: RocketMQ's schedule, 10 s, 30 s, 1 min…; a listener's
        ``ReconsumeLater`` chooses per message); ``max_reconsume_times`` how many
        redeliveries a message gets before it goes to the group's ``%DLQ%`` (16; -1 is
        Java's default: 16, or forever for an orderly listener). ``broadcast=True``
        delivers every message to every instance of the service (RocketMQ's
        broadcasting): each keeps its offsets and its dedup records under its own name
        (``IDEMP_INSTANCE``), so each applies a message once."""
        check_group(f"listener on {topic}", group)
        if sql is not None and (not sql.strip() or tags != "*"):
            raise ValueError(
                f"listener on {topic}: sql= is a whole selector (TAGS included: "
                "\"TAGS = 'A' AND ...\"), not an addition to tags=, and not empty"
            )
        if protocol not in ("remoting", "grpc"):
            raise ValueError(f"listener on {topic}: protocol {protocol!r} is not remoting or grpc")
        if protocol == "grpc" and (retry_delay_level or max_reconsume_times != 16):
            raise ValueError(
                f"listener on {topic}: protocol='grpc': the RocketMQ 5 group's retry policy "
                "spaces the deliveries and counts them (its retryMaxTimes), not "
                "retry_delay_level or max_reconsume_times"
            )
        if not isinstance(max_reconsume_times, int) or max_reconsume_times < -1:
            raise ValueError(
                f"listener on {topic}: max_reconsume_times={max_reconsume_times!r}: "
                "0 or more, or -1 (Java's default)"
            )
        if protocol == "grpc" and broadcast:
            raise ValueError(
                f"listener on {topic}: protocol='grpc': RocketMQ 5's gRPC clients have no "
                "broadcasting; use protocol='remoting' for broadcast=True"
            )
        if protocol == "grpc" and (orderly or batch_size != 1):
            raise ValueError(
                f"listener on {topic}: protocol='grpc' consumes by POP; per-group order comes "
                "from a FIFO consumer group (idemp admin update-sub-group --fifo), not "
                "orderly=, and messages are handed over one at a time (no batch_size)"
            )

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            label = name or getattr(fn, "name", None) or fn.__name__
            if any(s.name == label for s in self.listeners):
                raise ValueError(f"{self.name}: two listeners are named {label!r}")
            self.listeners.append(
                ListenerSpec(
                    label,
                    fn,
                    topic,
                    group,
                    tags,
                    orderly,
                    key,
                    strategy,
                    threads,
                    batch_size,
                    consume_from,
                    protocol,
                    sql=sql,
                    retry_delay_level=retry_delay_level,
                    max_reconsume_times=max_reconsume_times,
                    broadcast=broadcast,
                )
            )
            return fn

        return register

    # -- building -------------------------------------------------------------------
    def _strategy(self, spec: ListenerSpec) -> Strategy:
        s = spec.strategy
        if isinstance(s, Strategy):
            return s
        settings = self.settings
        if s is None:
            built = settings.strategy_for(spec.name if spec.name in settings.listeners else None)
        elif "://" in s:
            from idemp.config import build_strategy

            built = build_strategy(s)
        else:
            built = settings.strategy_named(s)
        spec.strategies.append(built)
        return built

    def _prepare(self, spec: ListenerSpec) -> None:
        """Resolve the strategy, check the store answers, build the runner: everything
        that can be wrong in the configuration fails here, before anything consumes."""
        instance = self._instance_name(spec) if spec.broadcast else ""
        if isinstance(spec.fn, _DECORATED):
            if spec.broadcast:
                raise ValueError(
                    f"listener {spec.name}: broadcast=True: give the App the plain function; "
                    "it keeps each instance's dedup records apart (a decorated one shares "
                    "them, and only one instance would apply each message)"
                )
            listener = spec.fn
        else:
            strategy = self._strategy(spec)
            _check_store(spec.name, strategy)
            # broadcasting: this instance's own records (namespace <group>@<instance>/<topic>)
            group = f"{spec.group}@{instance}" if spec.broadcast else spec.group
            listener = idempotent(key=spec.key, strategy=strategy, group=group, name=spec.name)(
                spec.fn
            )
        spec.listener = _timed(listener, spec)
        if spec.protocol == "grpc":
            # the adapters live outside this package's folder (mypy and the import graph
            # see idemp/ alone): imported by name, when a grpc listener is built
            adapter = importlib.import_module("idemp.adapters.rocketmq5")
            spec.runner = adapter.PushRunner(
                spec.listener,
                group=spec.group,
                endpoint=self._grpc_endpoint(),
                threads=spec.threads,
                credentials=(self.settings.access_key, self.settings.secret_key),
            )
            spec.runner.subscribe(*_subscription(spec))
            return
        consumer = ConsumerSettings(
            group=spec.group, consume_from=spec.consume_from, enable_trace=self.settings.trace
        )
        if spec.threads is not None:
            consumer.consume_thread_count = spec.threads
        consumer.consume_batch_size = spec.batch_size
        consumer.retry_delay_level = spec.retry_delay_level
        consumer.max_reconsume_times = spec.max_reconsume_times
        if spec.broadcast:
            consumer.message_model = MessageModel.BROADCASTING
        client = self._client_settings()
        runner_cls = OrderlyRunner if spec.orderly else ConcurrentRunner
        spec.runner = runner_cls(spec.listener, settings=consumer, client=client)
        spec.runner.subscribe(*_subscription(spec))

    def _client_settings(self) -> ClientSettings:
        if self._client is not None:
            return self._client
        addr = self._namesrv or self.settings.namesrv
        if not addr:
            raise ValueError(
                f"{self.name}: no nameserver: pass App(namesrv_addr=...), set IDEMP_NAMESRV "
                "or give the worker --namesrv"
            )
        s = self.settings
        return ClientSettings(
            namesrv_addr=addr,
            namespace=s.namespace,
            access_key=s.access_key,
            secret_key=s.secret_key,
            security_token=s.security_token,
            use_tls=s.use_tls,
            tls_ca_file=s.tls_ca_file,
            instance_name=s.instance or "DEFAULT",
        )

    def name_instance(self, name: str) -> None:
        """This instance's name (``idemp worker --instance``), over IDEMP_INSTANCE and the
        App's client settings; checked as IDEMP_INSTANCE is."""
        self._settings = type(self.settings)(**{**self.settings.model_dump(), "instance": name})
        if self._client is not None:
            self._client = dataclasses.replace(self._client, instance_name=name)

    def _instance_name(self, spec: ListenerSpec) -> str:
        """A broadcasting listener's offsets (``<ip>@<instance>/<group>/offsets.json``) and
        dedup records are this instance's: its name must be given, as a default shared by
        two instances would let only one of them apply each message."""
        if self._client is not None:
            name = self._client.instance_name
            how = "ClientSettings(instance_name=...)"
        else:
            name = self.settings.instance
            how = "IDEMP_INSTANCE (IdempSettings(instance=...))"
        if not name or name == "DEFAULT":
            raise ValueError(
                f"listener {spec.name}: broadcast=True: every instance applies every message "
                f"and keeps its offsets and dedup records under its own name; set {how} to a "
                "name each instance keeps across restarts and no other instance uses"
            )
        return name

    def _grpc_endpoint(self) -> str:
        addr = self._endpoint or self.settings.endpoint
        if not addr:
            raise ValueError(
                f"{self.name}: no RocketMQ 5 endpoint for protocol='grpc' listeners: pass "
                "App(endpoint=...), set IDEMP_ENDPOINT or give the worker --endpoint"
            )
        return addr

    def build(self) -> None:
        """Resolve every listener's strategy, check its store, build its runner, without
        consuming: what ``start()`` does first (and a deploy check can do alone)."""
        if not self.listeners:
            raise ValueError(f"{self.name}: no listeners declared")
        for spec in self.listeners:
            if spec.runner is None:
                self._prepare(spec)

    # -- running --------------------------------------------------------------------
    def start(self) -> None:
        """Build every listener (failing on the first configuration error, nothing
        started), then start them; returns once each holds its subscriptions (its first
        rebalance is done)."""
        with self._lock:
            if self.running:
                return
            self.stopping = False
            self.build()
            try:
                for spec in self.listeners:
                    assert spec.runner is not None
                    spec.runner.start()
                    spec.started = True
                    log.info(
                        "idemp event=listener_started app=%s listener=%s topic=%s group=%s %s",
                        self.name,
                        spec.name,
                        spec.topic,
                        spec.group,
                        "grpc"
                        if spec.protocol == "grpc"
                        else ("orderly" if spec.orderly else "concurrent")
                        + (" broadcasting" if spec.broadcast else ""),
                    )
            except BaseException:
                self._stop_runners(30.0)
                raise
            self.running = True

    def ready(self) -> dict[str, bool]:
        """Per listener: started and not stopping (readiness)."""
        return {s.name: s.started and not self.stopping for s in self.listeners}

    def stop(self, timeout: float = 30.0) -> None:
        """Stop pulling, let in-flight handlers finish within ``timeout`` seconds, commit
        offsets, unlock orderly queues at the broker (another instance takes them at its
        next rebalance, not after the 60 s lock expiry), close the strategies built here."""
        with self._lock:
            self.stopping = True
            self._stop_runners(timeout)
            self.running = False
            for spec in self.listeners:  # a later start() builds fresh runners
                spec.runner = None

    def _stop_runners(self, timeout: float) -> None:
        for spec in self.listeners:
            if spec.runner is not None and spec.started:
                began = time.monotonic()
                spec.runner.shutdown(timeout)
                spec.started = False
                log.info(
                    "idemp event=listener_stopped listener=%s seconds=%.2f",
                    spec.name,
                    time.monotonic() - began,
                )
            for strategy in spec.strategies:
                strategy.close()
            spec.strategies.clear()

    async def serve(self) -> None:
        """Run inside an asyncio program until cancelled: start in a worker thread (the
        runners have their own threads and loop), then wait; on cancellation, stop."""
        import asyncio

        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.start)
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.shield(loop.run_in_executor(None, self.stop))


def _check_store(name: str, strategy: Strategy) -> None:
    """One read, so an unreachable store fails the start and not the first message."""
    probe = getattr(strategy, "get", None)
    if probe is None:
        return
    try:
        probe("idemp-startup-check", "-")
    except StoreError as exc:
        raise ValueError(f"listener {name}: the dedup store does not answer: {exc}") from exc


def _timed(listener: Any, spec: ListenerSpec) -> Any:
    """The listener with its consume time observed (when the worker set a histogram)."""
    if inspect.iscoroutinefunction(listener) or isinstance(listener, AsyncIdempotentListener):

        async def run_async(message: Any) -> Any:
            began = time.perf_counter()
            try:
                return await listener(message)
            finally:
                if spec.latency is not None:
                    spec.latency.observe(time.perf_counter() - began)

        return run_async

    def run(message: Any) -> Any:
        began = time.perf_counter()
        try:
            return listener(message)
        finally:
            if spec.latency is not None:
                spec.latency.observe(time.perf_counter() - began)

    batch = getattr(listener, "consume_batch", None)
    if batch is not None:

        def consume_batch(messages: Any, **options: Any) -> Any:
            # each message's latency: until its batch is committed (as its ack waits)
            began = time.perf_counter()
            try:
                return batch(messages, **options)
            finally:
                if spec.latency is not None:
                    took = time.perf_counter() - began
                    for _ in messages:
                        spec.latency.observe(took)

        run.consume_batch = consume_batch  # type: ignore[attr-defined]
    return run


__all__ = ["App", "ListenerSpec"]


def _subscription(spec: ListenerSpec) -> tuple[str, str, str]:
    """(topic, expression, expression type) for a runner's subscribe."""
    if spec.sql is not None:
        return spec.topic, spec.sql, "SQL92"
    return spec.topic, spec.tags, "TAG"

"""The per-process client instance (RocketMQ's MQClientInstance).

Producers and consumers of one process with one client id share it: one loop thread,
one connection per server, one route cache, and the timers every RocketMQ client
runs (route refresh, heartbeat, rebalance, offset persistence). Brokers reach the
process through it (transaction checks, consumer-ids-changed notices).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Any, Protocol

from idemp.remoting import MessageExt, RemotingCommand, RequestCode, ResponseCode
from idemp.remoting.acl import is_acl_refusal
from idemp.remoting.mqversion import version_desc

from . import running_info
from .loop import LoopThread
from .reply import deliver
from .route import MASTER_ID, MessageQueue, TopicRoute
from .settings import ClientSettings
from .transport import (
    ConnectError,
    Connection,
    RemotingError,
    ResponseError,
    Transport,
    within,
)

log = logging.getLogger("idemp.client")


class NoRouteError(RemotingError):
    pass


class ProducerMember(Protocol):
    group: str

    async def check_transaction(self, conn: Connection, cmd: RemotingCommand) -> None: ...


class ConsumerMember(Protocol):
    group: str

    def heartbeat_data(self) -> dict[str, Any]: ...

    def topics(self) -> list[str]: ...

    async def rebalance(self) -> None: ...

    async def persist_offsets(self) -> None: ...

    async def reset_offsets(
        self, topic: str, timestamp: int, offsets: dict[MessageQueue, int] | None = None
    ) -> None: ...

    def running_info(self) -> dict[str, Any]: ...

    async def consume_directly(self, ext: MessageExt, broker_name: str) -> dict[str, Any]: ...


class ClientInstance:
    _registry: dict[str, ClientInstance] = {}
    _registry_lock = threading.Lock()

    @classmethod
    def acquire(cls, settings: ClientSettings) -> ClientInstance:
        """The shared instance for this client id and nameserver list."""
        key = f"{settings.client_id()}|{settings.namesrv_addr}"
        with cls._registry_lock:
            inst = cls._registry.get(key)
            if inst is None or inst._stopped:
                inst = cls._registry[key] = ClientInstance(settings)
            elif inst.settings.security() != settings.security():
                # one client id, one set of credentials and TLS settings: the Java client
                # would use the first one's, silently
                raise ValueError(
                    f"client {inst.client_id} already runs in this process with other ACL "
                    f"or TLS settings (access key {inst.settings.access_key!r}, TLS "
                    f"{inst.settings.use_tls}); give this one its own instance_name"
                )
            inst._refs += 1
            return inst

    def __init__(self, settings: ClientSettings) -> None:
        if not settings.namesrv_addr:
            raise ValueError("no nameserver address (namesrv_addr or NAMESRV_ADDR)")
        self.settings = settings
        self.client_id = settings.client_id()
        self.namesrvs = [a.strip() for a in settings.namesrv_addr.split(";") if a.strip()]
        self._ns_index = 0
        self.loop_thread = LoopThread(f"idemp-client-{self.client_id}")
        self.transport = Transport(
            language=settings.language,
            version=settings.version,
            connect_timeout=settings.connect_timeout,
            on_request=self._on_request,
            sign=settings.signer(),
            tls=settings.tls_context(),
        )
        self.routes: dict[str, TopicRoute] = {}
        self.brokers: dict[str, dict[int, str]] = {}
        self.producers: dict[str, ProducerMember] = {}
        self.consumers: dict[str, ConsumerMember] = {}
        # requests waiting for their reply, by correlation id (loop thread only)
        self.replies: dict[str, asyncio.Future[Any]] = {}
        # message trace dispatchers by trace topic (producer.tracer), flushed at stop
        self.tracers: dict[str, Any] = {}
        self._refs = 0
        self._stopped = False
        self._tasks: list[asyncio.Task[None]] = []
        self._rebalance_wake: asyncio.Event | None = None
        self.loop_thread.call(self._start())

    # --- life cycle --------------------------------------------------------------
    async def _start(self) -> None:
        self._rebalance_wake = asyncio.Event()
        s = self.settings
        self._tasks = [
            asyncio.ensure_future(self._every(s.route_refresh_interval, self.refresh_routes)),
            asyncio.ensure_future(self._every(s.heartbeat_interval, self.heartbeat_all)),
            asyncio.ensure_future(self._every(s.persist_offset_interval, self.persist_all)),
            asyncio.ensure_future(self._rebalance_loop()),
        ]

    def release(self) -> None:
        with self._registry_lock:
            self._refs -= 1
            if self._refs > 0:
                return
            self._stopped = True
            for key, inst in list(self._registry.items()):
                if inst is self:
                    del self._registry[key]
        try:
            self.loop_thread.call(self._stop(), timeout=10)
        finally:
            self.loop_thread.stop()

    async def _stop(self) -> None:
        for tracer in self.tracers.values():
            await tracer.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.transport.close()

    async def _every(self, interval: float, fn: Any) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await fn()
            except Exception as exc:  # a timer must survive a bad round
                log.warning("%s failed: %s", getattr(fn, "__name__", fn), exc)

    async def _rebalance_loop(self) -> None:
        assert self._rebalance_wake is not None
        while True:
            try:
                await within(self._rebalance_wake.wait(), self.settings.rebalance_interval)
            except asyncio.TimeoutError:
                pass
            self._rebalance_wake.clear()
            await self.rebalance_all()

    def wake_rebalance(self) -> None:
        if self._rebalance_wake is not None:
            self._rebalance_wake.set()

    async def rebalance_all(self) -> None:
        for consumer in list(self.consumers.values()):
            try:
                await consumer.rebalance()
            except Exception as exc:
                log.warning("rebalance of %s failed: %s", consumer.group, exc)

    async def persist_all(self) -> None:
        for consumer in list(self.consumers.values()):
            try:
                await consumer.persist_offsets()
            except Exception as exc:
                log.warning("persisting offsets of %s failed: %s", consumer.group, exc)

    # --- nameserver and routes ---------------------------------------------------
    async def namesrv_invoke(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """Try the nameservers in turn, starting with the last one that answered."""
        last: Exception | None = None
        for i in range(len(self.namesrvs)):
            idx = (self._ns_index + i) % len(self.namesrvs)
            try:
                resp = await self.transport.invoke(self.namesrvs[idx], cmd, timeout)
            except RemotingError as exc:
                last = exc
                continue
            self._ns_index = idx
            return resp
        raise ConnectError(f"no nameserver reachable ({', '.join(self.namesrvs)}): {last}")

    async def fetch_route(self, topic: str) -> TopicRoute | None:
        cmd = self.transport.request(
            RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic, "acceptStandardJsonOnly": "true"}
        )
        resp = await self.namesrv_invoke(cmd, self.settings.request_timeout)
        if resp.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        if resp.code != ResponseCode.SUCCESS or not resp.body:
            raise ResponseError(resp.code, resp.remark, f"route of {topic}")
        return TopicRoute.parse(topic, resp.body)

    async def update_route(
        self, topic: str, default_topic: str | None = None, default_queues: int = 4
    ) -> TopicRoute | None:
        route = await self.fetch_route(topic)
        if route is None and default_topic:
            base = await self.fetch_route(default_topic)
            if base is not None:
                route = base.with_topic(topic, default_queues)
        if route is not None:
            self._set_route(route)
        return route

    def _set_route(self, route: TopicRoute) -> None:
        new_broker = False
        for name, addrs in route.brokers.items():
            if self.brokers.get(name) != addrs:
                new_broker = True
            self.brokers[name] = dict(addrs)
        self.routes[route.topic] = route
        if new_broker:
            asyncio.ensure_future(self._heartbeat_quietly())

    async def _heartbeat_quietly(self) -> None:
        try:
            await self.heartbeat_all()
        except Exception as exc:
            log.warning("heartbeat failed: %s", exc)

    async def route(
        self, topic: str, default_topic: str | None = None, default_queues: int = 4
    ) -> TopicRoute:
        route = self.routes.get(topic)
        if route is None:
            route = await self.update_route(topic, default_topic, default_queues)
        if route is None:
            raise NoRouteError(f"no route info of topic {topic}")
        return route

    async def refresh_routes(self) -> None:
        for topic in list(self.routes):
            try:
                route = await self.fetch_route(topic)
            except RemotingError as exc:
                log.info("route refresh of %s failed: %s", topic, exc)
                continue
            if route is not None:
                self._set_route(route)

    def master_addr(self, broker_name: str) -> str | None:
        return self.brokers.get(broker_name, {}).get(MASTER_ID)

    def admin_addr(self, broker_name: str) -> str | None:
        """Lowest broker id (offset queries go there, as in both official clients)."""
        addrs = self.brokers.get(broker_name, {})
        return addrs[min(addrs)] if addrs else None

    def master_addrs(self) -> list[str]:
        return sorted({a[MASTER_ID] for a in self.brokers.values() if MASTER_ID in a})

    # --- broker calls ------------------------------------------------------------
    async def broker_call(
        self,
        addr: str,
        code: int,
        ext: dict[str, str] | None = None,
        body: bytes = b"",
        timeout: float | None = None,
    ) -> RemotingCommand:
        cmd = self.transport.request(code, ext, body)
        return await self.transport.invoke(
            addr, cmd, self.settings.request_timeout if timeout is None else timeout
        )

    async def broker_oneway(
        self, addr: str, code: int, ext: dict[str, str] | None = None, body: bytes = b""
    ) -> None:
        cmd = self.transport.request(code, ext, body)
        await self.transport.invoke_oneway(addr, cmd, self.settings.connect_timeout)

    # --- heartbeat ---------------------------------------------------------------
    def heartbeat_body(self) -> bytes:
        data = {
            "clientID": self.client_id,
            "consumerDataSet": [c.heartbeat_data() for c in self.consumers.values()],
            "producerDataSet": [{"groupName": g} for g in self.producers]
            + [{"groupName": "CLIENT_INNER_PRODUCER"}],
        }
        return json.dumps(data, separators=(",", ":")).encode()

    async def heartbeat_all(self, *, acl_refusal_raises: bool = False) -> None:
        """Register this client's groups at every master. ``acl_refusal_raises``: a
        consumer's start, where a refusal by the broker's ACL (wrong credentials, no
        permission for the group or a topic) is a configuration error to raise at once,
        not a warning before every pull fails."""
        if not self.consumers and not self.producers:
            return
        body = self.heartbeat_body()
        errors: list[str] = []
        for addr in self.master_addrs():
            try:
                resp = await self.broker_call(addr, RequestCode.HEART_BEAT, None, body)
            except RemotingError as exc:
                errors.append(f"{addr}: {exc}")
                continue
            if resp.code == ResponseCode.SUCCESS:
                continue
            if acl_refusal_raises and is_acl_refusal(resp.remark):
                raise ResponseError(
                    resp.code, resp.remark, f"the broker at {addr} refused this client"
                )
            errors.append(f"{addr}: {resp.code} {resp.remark}")
        if errors:
            log.info("heartbeat: %s", "; ".join(errors))

    async def unregister(self, producer_group: str = "", consumer_group: str = "") -> None:
        for addr in self.master_addrs():
            try:
                await self.broker_call(
                    addr,
                    RequestCode.UNREGISTER_CLIENT,
                    {
                        "clientID": self.client_id,
                        "producerGroup": producer_group,
                        "consumerGroup": consumer_group,
                    },
                )
            except RemotingError as exc:
                log.info("unregister at %s failed: %s", addr, exc)

    # --- requests from servers ---------------------------------------------------
    def _on_request(self, conn: Connection, cmd: RemotingCommand) -> Any:
        code = cmd.code
        if code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            log.debug("consumer ids changed: %s", cmd.ext_fields.get("consumerGroup"))
            self.wake_rebalance()
            return None
        if code == RequestCode.CHECK_TRANSACTION_STATE:
            return self._check_transaction(conn, cmd)
        if code == RequestCode.GET_CONSUMER_RUNNING_INFO:
            group = cmd.ext_fields.get("consumerGroup", "")
            consumer = self.consumers.get(group)
            if consumer is None:
                return cmd.response(ResponseCode.SYSTEM_ERROR, f"no consumer group {group}")
            body = running_info.encode(
                consumer.running_info(),
                self.settings.namesrv_addr,
                version_desc(self.settings.version),
                cmd.ext_fields.get("jstackEnable") == "true",
            )
            return cmd.response(ResponseCode.SUCCESS, body=body)
        if code == RequestCode.CONSUME_MESSAGE_DIRECTLY:
            return self._consume_directly(cmd)
        if code == RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT:
            return deliver(self.replies, cmd)
        if code == RequestCode.RESET_CONSUMER_CLIENT_OFFSET:
            group = cmd.ext_fields.get("group", "")
            reset_consumer = self.consumers.get(group)
            if reset_consumer is not None:
                return reset_consumer.reset_offsets(
                    cmd.ext_fields.get("topic", ""),
                    int(cmd.ext_fields.get("timestamp", "0")),
                    reset_offsets_of(cmd.body),
                )
            return None
        return cmd.response(
            ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {code} not supported"
        )

    async def _consume_directly(self, cmd: RemotingCommand) -> RemotingCommand:
        from idemp.remoting import decode_messages

        group = cmd.ext_fields.get("consumerGroup", "")
        consumer = self.consumers.get(group)
        if consumer is None:  # RocketMQ's words
            absent = f"The Consumer Group <{group}> not exist in this consumer"
            return cmd.response(ResponseCode.SYSTEM_ERROR, absent)
        msgs = decode_messages(cmd.body) if cmd.body else []
        if not msgs:  # the broker found no message under the id it was given
            return cmd.response(ResponseCode.SYSTEM_ERROR, "no message in the request to consume")
        result = await consumer.consume_directly(msgs[0], cmd.ext_fields.get("brokerName", ""))
        return cmd.response(ResponseCode.SUCCESS, body=json.dumps(result).encode())

    async def _check_transaction(self, conn: Connection, cmd: RemotingCommand) -> None:
        from idemp.remoting import decode_messages
        from idemp.remoting.codes import Prop

        try:
            msgs = decode_messages(cmd.body)
        except ValueError as exc:
            log.warning("undecodable transaction check: %s", exc)
            return
        if not msgs:
            return
        group = msgs[0].properties.get(Prop.PGROUP, "")
        producer = self.producers.get(group)
        if producer is None:
            log.info("transaction check for unknown producer group %r", group)
            return
        await producer.check_transaction(conn, cmd)

    # --- helpers for members ------------------------------------------------------
    async def consumer_ids(self, group: str, topic: str) -> list[str]:
        route = self.routes.get(topic)
        names = list(route.brokers) if route else list(self.brokers)
        for name in names:
            addr = self.master_addr(name) or self.admin_addr(name)
            if addr is None:
                continue
            resp = await self.broker_call(
                addr, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group}
            )
            if resp.code == ResponseCode.SUCCESS and resp.body:
                ids = json.loads(resp.body).get("consumerIdList") or []
                return sorted(str(i) for i in ids)
            raise ResponseError(resp.code, resp.remark, f"consumer list of {group}")
        return []

    def _lock_bodies(self, group: str, mqs: list[MessageQueue]) -> list[tuple[str, bytes]]:
        """(master address, LockBatchRequestBody) per broker: lock and unlock share it."""
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            by_broker.setdefault(mq.broker_name, []).append(mq)
        out: list[tuple[str, bytes]] = []
        for name, items in by_broker.items():
            addr = self.master_addr(name)
            if addr is None:
                continue
            body = {
                "consumerGroup": group,
                "clientId": self.client_id,
                "mqSet": [m.as_json() for m in items],
            }
            out.append((addr, json.dumps(body).encode()))
        return out

    async def lock_batch(self, group: str, mqs: list[MessageQueue]) -> set[MessageQueue]:
        """LOCK_BATCH_MQ at each queue's master; returns the queues this client holds."""
        won: set[MessageQueue] = set()
        for addr, body in self._lock_bodies(group, mqs):
            try:
                resp = await self.broker_call(addr, RequestCode.LOCK_BATCH_MQ, None, body)
            except RemotingError as exc:
                log.info("lock at %s failed: %s", addr, exc)
                continue
            if resp.code != ResponseCode.SUCCESS or not resp.body:
                continue
            for m in json.loads(resp.body).get("lockOKMQSet") or []:
                won.add(MessageQueue(str(m["topic"]), str(m["brokerName"]), int(m["queueId"])))
        return won

    async def unlock_batch(self, group: str, mqs: list[MessageQueue]) -> None:
        for addr, body in self._lock_bodies(group, mqs):
            try:
                await self.broker_call(addr, RequestCode.UNLOCK_BATCH_MQ, None, body)
            except RemotingError as exc:
                log.info("unlock at %s failed: %s", addr, exc)


def now_ms() -> int:
    return int(time.time() * 1000)


def reset_offsets_of(body: bytes) -> dict[MessageQueue, int]:
    """The offsets of a RESET_CONSUMER_CLIENT_OFFSET body: a Java broker's ResetOffsetBody
    (MessageQueue objects as map keys) or the C++ form (a list with ``offset``)."""
    from idemp.remoting.jsonlenient import loads_fastjson

    if not body:
        return {}
    try:
        table = loads_fastjson(body).get("offsetTable")
    except (ValueError, AttributeError):
        log.warning("unreadable offset reset body: %r", body[:200])
        return {}
    pairs = table if isinstance(table, list) else []
    out: dict[MessageQueue, int] = {}
    for entry in pairs:
        key, offset = entry if isinstance(entry, tuple) else (entry, entry.get("offset"))
        try:
            mq = MessageQueue(str(key["topic"]), str(key["brokerName"]), int(key["queueId"]))
            out[mq] = int(offset)
        except (KeyError, TypeError, ValueError):
            continue
    return out

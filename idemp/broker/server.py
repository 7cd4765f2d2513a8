"""The broker process: two loopback listeners (nameserver and broker) on one event loop.

``Connection`` frames bytes with the codec and hands requests to the handler table
of its listener. A handler returns a response, ``None`` (oneway, or answered later,
as a held pull is), or an awaitable of either (a SYNC_FLUSH send waits for fsync).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import logging
import ssl
import time
from collections.abc import Iterator
from typing import Any

from idemp.remoting import (
    FrameDecoder,
    ProtocolError,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    encode,
)
from idemp.remoting.codes import RPC_ONEWAY
from idemp.waiting import within

from .acl import AclDenied, AclFileWatch, PlainAcl, default_acl_path, load_acl
from .clients import ClientManager
from .config import BrokerConfig
from .context import Handler
from .diskguard import CHECK_INTERVAL_S
from .halfcheck import TransactionCheckService
from .kvconfig import NamesrvState
from .locks import LockManager
from .longpoll import PullHoldService
from .store import MessageStore
from .timer import TimerService
from .tls import HANDSHAKE_RECORD, ServerTls, TlsRefused, TlsSession

log = logging.getLogger("idemp.broker")

IDLE_CLOSE_S = 120.0


class Connection(asyncio.Protocol):
    def __init__(self, server: BrokerServer, handlers: dict[int, Handler], role: str) -> None:
        self.server = server
        self.handlers = handlers
        self.role = role
        self.decoder = FrameDecoder(max_frame=server.max_frame)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.peer_host: tuple[str, int] = ("127.0.0.1", 0)
        self.closed = False
        self.last_active = time.monotonic()
        self._waiting: dict[int, asyncio.Future[RemotingCommand]] = {}  # opaque -> answer
        self.language = "JAVA"
        self.version = 0
        self.tls: TlsSession | None = None
        self._first_bytes = True  # TLS or plain is decided by the first byte (tls.py)

    # --- asyncio.Protocol ----------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer_host = (peer[0], peer[1])
            self.peer = f"{peer[0]}:{peer[1]}"
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(ConnectionError(f"{self.peer} closed the connection"))
        self._waiting.clear()
        self.server.connections.discard(self)
        self.server.on_connection_closed(self)

    def data_received(self, data: bytes) -> None:
        self.last_active = time.monotonic()
        if self._first_bytes and data:
            self._first_bytes = False
            if not self._choose_tls(data[0] == HANDSHAKE_RECORD):
                return
        if self.tls is not None:
            try:
                data = self.tls.receive(data)
            except ssl.SSLError as exc:
                log.warning("%s %s: closing TLS connection: %s", self.role, self.peer, exc)
                self.close()
                return
            self._flush_tls()
            if self.tls.closed_by_peer:
                self.close()
            if not data:
                return
        try:
            commands = self.decoder.feed(data)
        except ProtocolError as exc:
            log.warning("%s %s: closing connection: %s", self.role, self.peer, exc)
            self.close()
            return
        for cmd in commands:
            if cmd.is_response:
                fut = self._waiting.pop(cmd.opaque, None)
                if fut is not None and not fut.done():
                    fut.set_result(cmd)
                continue  # otherwise an answer nobody waits for (a oneway's)
            self.language = cmd.language
            self.version = cmd.version
            self._dispatch(cmd)

    def _choose_tls(self, hello: bool) -> bool:
        """False when the connection is closed instead (tls.py)."""
        try:
            self.tls = self.server.tls.session_for(hello, f"{self.role} {self.peer}")
        except TlsRefused:
            self.close()
            return False
        return True

    def _flush_tls(self) -> None:
        assert self.tls is not None
        out = self.tls.take_output()
        if out and self.transport is not None and not self.closed:
            self.transport.write(out)

    # --- dispatch ------------------------------------------------------------------
    def _dispatch(self, cmd: RemotingCommand) -> None:
        acl = self.server.acl
        if acl is not None and self.role == "broker" and not self._acl_allows(acl, cmd):
            return
        handler = self.handlers.get(cmd.code)
        if handler is None:
            # RocketMQ's broker hands unknown codes to its default processor, which
            # answers REQUEST_CODE_NOT_SUPPORTED; like every answer, it is dropped for
            # a oneway request (AdminBrokerProcessor.getUnknownCmdResponse).
            self.reply(
                cmd.response(
                    ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                    f" request type {cmd.code} not supported",
                ),
                request=cmd,
            )
            return
        try:
            result = handler(self.server, self, cmd)
        except Exception as exc:  # a handler bug must cost one request, not the server
            self._failed(cmd, exc)
            return
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(result)
            task.add_done_callback(functools.partial(self._finished, cmd))
        elif result is not None:
            self.reply(result, request=cmd)

    def _acl_allows(self, acl: PlainAcl, cmd: RemotingCommand) -> bool:
        """RocketMQ runs the ACL as an RPC hook before any processor (unknown codes
        included, on the broker port only) and answers a refusal, like any exception
        there, with SYSTEM_ERROR and the exception's text (NettyRemotingAbstract)."""
        try:
            acl.check(cmd, self.peer_host[0])
        except AclDenied as exc:
            log.warning(
                "broker %s: request code %d refused by ACL (accessKey=%s): %s",
                self.peer,
                cmd.code,
                exc.access_key,
                exc,
            )
            self.reply(
                cmd.response(ResponseCode.SYSTEM_ERROR, exc.remark()),
                request=cmd,
            )
            return False
        return True

    def _finished(self, cmd: RemotingCommand, task: asyncio.Future[RemotingCommand | None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self._failed(cmd, exc)
            return
        result = task.result()
        if result is not None:
            self.reply(result, request=cmd)

    def _failed(self, cmd: RemotingCommand, exc: BaseException) -> None:
        from idemp.remoting import HeaderFieldError

        if not isinstance(exc, (HeaderFieldError, ValueError)):
            log.exception(
                "%s %s: request code %d failed", self.role, self.peer, cmd.code, exc_info=exc
            )
        else:
            log.info("%s %s: request code %d refused: %s", self.role, self.peer, cmd.code, exc)
        self.reply(
            cmd.response(ResponseCode.SYSTEM_ERROR, str(exc) or type(exc).__name__), request=cmd
        )

    def reply(self, response: RemotingCommand, request: RemotingCommand | None = None) -> None:
        if request is not None and request.is_oneway:
            return
        self.send(response)

    def send(self, cmd: RemotingCommand) -> None:
        if self.closed or self.transport is None:
            return
        if self.tls is not None:
            self.tls.send(encode(cmd))
            self._flush_tls()
            return
        self.transport.write(encode(cmd))

    def send_request_oneway(self, code: int, ext_fields: dict[str, str], body: bytes = b"") -> None:
        self.send(
            RemotingCommand(
                code=code,
                opaque=next(self.server.opaques),
                flag=RPC_ONEWAY,
                ext_fields=ext_fields,
                body=body,
            )
        )

    async def invoke(
        self, code: int, ext_fields: dict[str, str], body: bytes = b"", timeout: float = 5.0
    ) -> RemotingCommand:
        """A request to the client on this connection, and its answer (the broker asks
        consumers for their running info, or to consume a message directly)."""
        opaque = next(self.server.opaques)
        fut: asyncio.Future[RemotingCommand] = asyncio.get_running_loop().create_future()
        self._waiting[opaque] = fut
        self.send(RemotingCommand(code=code, opaque=opaque, ext_fields=ext_fields, body=body))
        try:
            return await within(fut, timeout)
        finally:
            self._waiting.pop(opaque, None)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()


class BrokerServer:
    def __init__(self, config: BrokerConfig, *, max_frame: int = 16 * 1024 * 1024) -> None:
        self.config = config
        self.max_frame = max_frame
        self.store: MessageStore | None = None
        self.clients = ClientManager()
        self.locks = LockManager(config.rebalanceLockMaxLiveTime)
        self.holds = PullHoldService()
        self.connections: set[Connection] = set()
        self.opaques: Iterator[int] = itertools.count(1)
        self.broker_handlers: dict[int, Handler] = {}
        self.namesrv_handlers: dict[int, Handler] = {}
        self.servers: list[asyncio.Server] = []
        self.broker_addr = ""
        self.namesrv_addr = ""
        self._tasks: list[asyncio.Task[None]] = []
        self.acl: PlainAcl | None = None
        self.config_version = 0
        self.boot_ms = int(time.time() * 1000)
        self.grpc_addr = ""
        self.grpc: Any = None  # v5.endpoint.GrpcEndpoint once started
        self.registrar: Any = None  # registrar.Registrar without an embedded nameserver
        self.tls = ServerTls(config)  # a bad tls.* setting fails here, before the start

    # --- life cycle ----------------------------------------------------------------
    async def start(self) -> None:
        from . import (
            acl_admin,
            admin,
            admin_clients,
            admin_config,
            admin_maintenance,
            admin_stats,
            consumers,
            namesrv,
            pull,
            reply,
            schedule,
            send,
            transaction,
        )

        self.tls.check()  # before anything listens: a certificate that does not load
        if self.config.aclEnable:  # before anything listens: a bad file must stop the start
            self.acl = load_acl(default_acl_path(self.config))
            log.info("ACL enabled: %d accounts from %s", len(self.acl.accounts), self.acl.path)
        grpc_port = self.config.grpc_port  # before listenPort is replaced by the bound port
        asked_port = self.config.listenPort  # 0: a free port, and then no VIP channel
        self.store = MessageStore(self.config)
        self.store.disk.check()  # before anything is accepted (RocketMQ: 1 s after start)
        self.namesrv = NamesrvState(self.store.root / "config" / "kvConfig.json")
        self.store.listeners.append(self.holds.arrived)
        self.holds.max_offset = self.store.max_offset
        for module in (
            send,
            pull,
            consumers,
            admin,
            admin_stats,
            admin_clients,
            admin_config,
            admin_maintenance,
            acl_admin,
            transaction,
            reply,
        ):
            module.register(self.broker_handlers)
        embedded = self.config.embeddedNamesrv
        if embedded:
            namesrv.register(self.namesrv_handlers)
            namesrv.sync_order_topics(self)
        loop = asyncio.get_running_loop()
        bind = self.config.bindAddress
        broker = await loop.create_server(
            lambda: Connection(self, self.broker_handlers, "broker"),
            bind,
            self.config.listenPort,
            reuse_address=True,
        )
        port = broker.sockets[0].getsockname()[1]
        self.config.listenPort = port
        self.store.store_host = (self.config.brokerIP1, port)
        self.broker_addr = f"{self.config.brokerIP1}:{port}"
        self.servers = [broker]
        if embedded:
            # the port bound (0 asks for a free one), as getBrokerConfig reports it
            self.namesrv_addr = self.config.namesrvAddr = await self._listen_namesrv(bind)
        else:
            self.namesrv_addr = ";".join(self.config.namesrv_addrs)
        await self._start_fast_port(bind, asked_port)
        self.scheduler = schedule.ScheduleService(self)
        self.timer = TimerService(self)
        self.transactions = TransactionCheckService(self)
        self._tasks = [
            loop.create_task(self._housekeeping()),
            loop.create_task(self.scheduler.run()),
            loop.create_task(self.timer.run()),
            loop.create_task(self.transactions.run()),
            loop.create_task(self.holds.run(self._hold_check_period)),
            loop.create_task(self._sample_stats()),
            loop.create_task(self._check_disk()),
        ]
        if embedded:
            self._tasks.append(loop.create_task(self._scan_brokers()))
        if not self.config.sync_flush:
            self._tasks.append(loop.create_task(self._async_flush()))
        if grpc_port >= 0:
            from .v5.endpoint import GrpcEndpoint

            self.grpc = GrpcEndpoint(self)
            try:
                # a free gRPC port is never listenPort - 2: started again on this listenPort
                # (BrokerProcess restarts so), the broker opens its VIP channel there first
                avoid = self.config.listenPort - 2
                port = await self.grpc.start(bind, grpc_port, avoid=avoid)
            except BaseException:
                await self.stop()
                raise
            self.grpc_addr = f"{self.config.brokerIP1}:{port}"
            # as listenPort: the bound port, which getBrokerConfig tells the cluster's
            # other gRPC endpoints (they route 5.x clients here)
            self.config.grpcServerPort = port
        if self.acl is not None:
            watch = AclFileWatch(self.acl, lambda acl: setattr(self, "acl", acl))
            self._tasks.append(loop.create_task(watch.run()))
        if not embedded:  # last: the nameservers hear of the broker once it serves
            from .registrar import Registrar

            self.registrar = Registrar(self, self.opaques)
            try:
                await self.registrar.start()
            except BaseException:
                self.registrar = None
                await self.stop()
                raise
            self._tasks.append(loop.create_task(self.registrar.run()))

    async def _listen_namesrv(self, bind: str | None) -> str:
        ns_host, ns_port = self.config.namesrv_host_port
        loop = asyncio.get_running_loop()
        ns = await loop.create_server(
            lambda: Connection(self, self.namesrv_handlers, "namesrv"),
            bind if ns_host in ("127.0.0.1", "localhost", "0.0.0.0") else ns_host,
            ns_port,
            reuse_address=True,
        )
        self.servers.append(ns)
        return f"{ns_host}:{ns.sockets[0].getsockname()[1]}"

    async def _scan_brokers(self) -> None:
        """NamesrvController's scan: registered brokers silent for two minutes go."""
        while True:
            await asyncio.sleep(10.0)
            for addr in self.namesrv.routes.expire(time.monotonic()):
                log.info("namesrv: broker %s not registered for 120 s, removed", addr)

    async def _start_fast_port(self, bind: str | None, port: int) -> None:
        """RocketMQ's "VIP channel": the same requests but pulls on listenPort - 2, where a
        Java client with ``vipChannelEnabled`` (the default of 4.4 and older) sends, and
        mqadmin too when so configured. Optional for every other client, so a port that
        is taken is a warning, not a failed start (RocketMQ would not start)."""
        if port <= 2:  # listenPort=0 asks for a free port: no fixed neighbour to take
            return
        pull = RequestCode.PULL_MESSAGE
        fast_handlers = {c: h for c, h in self.broker_handlers.items() if c != pull}
        loop = asyncio.get_running_loop()
        try:
            fast = await loop.create_server(
                lambda: Connection(self, fast_handlers, "broker"),
                bind,
                port - 2,
                reuse_address=True,
            )
        except OSError as exc:
            log.warning("VIP channel port %d not opened: %s", port - 2, exc.strerror or exc)
            return
        self.servers.append(fast)
        log.info("VIP channel on port %d", port - 2)

    async def _sample_stats(self) -> None:
        """StoreStatsService's sampling: once a second, for the TPS over 10/60/600 s."""
        while True:
            await asyncio.sleep(1.0)
            if self.store is not None:
                self.store.stats.sample()

    async def stop(self) -> None:
        if self.registrar is not None:
            registrar, self.registrar = self.registrar, None
            await registrar.stop()
        if self.grpc is not None:
            await self.grpc.stop()
            self.grpc = None
        for srv in self.servers:
            srv.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        for conn in list(self.connections):
            conn.close()
        if self.store is not None:
            self.scheduler.persist()
            self.store.close()

    async def _check_disk(self) -> None:
        assert self.store is not None
        while True:
            await asyncio.sleep(CHECK_INTERVAL_S)
            self.store.disk.check()

    async def _housekeeping(self) -> None:
        assert self.store is not None
        interval = self.config.flushConsumerOffsetInterval / 1000
        last_offsets = time.monotonic()
        while True:
            await asyncio.sleep(min(interval, 10.0))
            now = time.monotonic()
            if now - last_offsets >= interval:
                last_offsets = now
                self.store.offsets.persist()
            for conn in list(self.connections):
                if now - conn.last_active > IDLE_CLOSE_S:
                    log.info("%s %s: idle for %ds, closing", conn.role, conn.peer, IDLE_CLOSE_S)
                    conn.close()
            for channel in self.clients.expire(now):
                if isinstance(channel, Connection):
                    channel.close()

    async def _async_flush(self) -> None:
        """ASYNC_FLUSH: fsync the commit log every flushIntervalCommitLog ms if dirty; an
        idle broker sleeps until the next append instead of waking to find nothing."""
        assert self.store is not None
        loop = asyncio.get_running_loop()
        log_, appended = self.store.commitlog, self.store.appended
        while True:
            await appended.wait()
            appended.clear()
            await asyncio.sleep(self.config.flushIntervalCommitLog / 1000)
            if log_.flushed < log_.end:
                await loop.run_in_executor(None, log_.fsync)

    def _hold_check_period(self) -> float:
        """PullRequestHoldService's wait between checks of the held pulls."""
        if self.config.longPollingEnable:
            return 5.0
        return max(self.config.shortPollingTimeMills, 1) / 1000

    # --- events --------------------------------------------------------------------
    def on_connection_closed(self, conn: Connection) -> None:
        if conn.role == "namesrv":
            self.namesrv.routes.connection_closed(conn)
            return
        self.holds.cancel_where(lambda p: p.owner is conn)
        for group in self.clients.channel_closed(conn):
            self.notify_consumer_ids_changed(group, group_flag=False)

    def notify_consumer_ids_changed(self, group: str, *, group_flag: bool = True) -> None:
        """DefaultConsumerIdsChangeListener: the broker's notifyConsumerIdsChangedEnable
        gates every notice; the group's own flag only those of a heartbeat or an
        unregister (ConsumerManager.doChannelCloseEvent does not look at it)."""
        assert self.store is not None
        if not self.config.notifyConsumerIdsChangedEnable:
            return
        cfg = self.store.groups.groups.get(group) if group_flag else None
        if cfg is not None and not cfg.notifyConsumerIdsChangedEnable:
            return
        info = self.clients.consumers.get(group)
        if info is None:
            return
        for ch in info.channels.values():
            ch.channel.send_request_oneway(
                RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group}
            )

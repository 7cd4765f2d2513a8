"""The gRPC server RocketMQ 5 clients connect to, on the broker's own event loop.

grpc.aio serves on the running asyncio loop, so the MessagingService reads and writes the
store as the remoting handlers do, with no lock and no thread hop.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import grpc

from .service import MessagingService

if TYPE_CHECKING:
    from ..context import Broker

log = logging.getLogger("idemp.broker.v5")
REVIVE_INTERVAL_S = 0.5
MAX_MESSAGE_BYTES = 130 * 1024 * 1024  # the proxy's grpcMaxInboundMessageSize


class GrpcEndpoint:
    def __init__(self, broker: Broker) -> None:
        self.service = MessagingService(broker)
        self.server: grpc.aio.Server | None = None
        self._revive: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int) -> int:
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.so_reuseport", 0),
            ]
        )
        server.add_generic_rpc_handlers((self.service.handler(),))
        try:
            bound = server.add_insecure_port(f"{host}:{port}")
        except RuntimeError:  # grpcio's "Failed to bind to address"
            bound = 0
        if bound == 0:
            raise OSError(f"cannot listen on {host}:{port} for gRPC (grpcServerPort)")
        await server.start()
        self.server = server
        self.service.endpoint = (self.service.endpoint[0], bound)
        self._revive = asyncio.get_running_loop().create_task(self._revive_loop())
        return bound

    async def _revive_loop(self) -> None:
        while True:
            await asyncio.sleep(REVIVE_INTERVAL_S)
            try:
                service = self.service
                service.pop.renew(service.alive)
                service.pop.revive()
                service.expire_clients()
            except Exception:  # pragma: no cover - a bug must not stop redelivery
                log.exception("v5: revive failed")

    async def stop(self) -> None:
        if self._revive is not None:
            self._revive.cancel()
        if self.server is not None:
            await self.server.stop(grace=0.5)
            self.server = None

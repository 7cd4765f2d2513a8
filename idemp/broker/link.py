"""A broker's own requests to other servers: the registrar's to the nameservers, the
gRPC endpoint's to the nameservers and the other brokers of its cluster.

A kept connection that the other side closed (a restart) is opened afresh once, at
once, rather than failing the request."""

from __future__ import annotations

import asyncio
from typing import Any

from idemp.remoting import FrameDecoder, RemotingCommand, encode


class RemotingLink:
    """One kept connection to one nameserver or broker; one request at a time."""

    def __init__(self, addr: str, opaques: Any, what: str) -> None:
        self.addr = addr
        self.what = what
        self.opaques = opaques
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._decoder = FrameDecoder()
        self._lock = asyncio.Lock()

    async def request(
        self, code: int, fields: dict[str, str], body: bytes, timeout: float
    ) -> RemotingCommand:
        async with self._lock:
            reused = self._streams is not None
            try:
                return await asyncio.wait_for(self._exchange(code, fields, body), timeout)
            except (OSError, ConnectionError):
                self.close()
                if not reused:
                    raise
            except asyncio.TimeoutError:
                self.close()
                raise
            # the other side closed the kept connection (a restart): once more, afresh
            try:
                return await asyncio.wait_for(self._exchange(code, fields, body), timeout)
            except (OSError, asyncio.TimeoutError, ConnectionError):
                self.close()
                raise

    async def _exchange(self, code: int, fields: dict[str, str], body: bytes) -> RemotingCommand:
        if self._streams is None:
            host, _, port = self.addr.rpartition(":")
            self._streams = await asyncio.open_connection(host, int(port))
            self._decoder = FrameDecoder()
        reader, writer = self._streams
        cmd = RemotingCommand(code=code, opaque=next(self.opaques), ext_fields=fields, body=body)
        writer.write(encode(cmd))
        await writer.drain()
        while True:
            data = await reader.read(65536)
            if not data:
                raise ConnectionError(f"{self.what} {self.addr} closed the connection")
            for got in self._decoder.feed(data):
                if got.is_response and got.opaque == cmd.opaque:
                    return got

    def close(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None

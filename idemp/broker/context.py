"""What a request handler sees of the broker and of the connection a request came on.

The handler modules (admin, consumers, namesrv, pull, schedule, send, transaction) are
typed against these protocols, not against ``server``: the server imports and registers
them, so the imports point one way (server → handlers → context).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol, Union

from idemp.remoting import RemotingCommand

from .acl import PlainAcl
from .clients import ClientManager
from .config import BrokerConfig
from .kvconfig import NamesrvState
from .locks import LockManager
from .longpoll import PullHoldService
from .store import MessageStore
from .tls import ServerTls


class Peer(Protocol):
    """The connection a request came on."""

    peer: str  # "host:port", for messages
    peer_host: tuple[str, int]
    closed: bool

    def reply(self, response: RemotingCommand, request: RemotingCommand | None = None) -> None: ...

    def send_request_oneway(
        self, code: int, ext_fields: dict[str, str], body: bytes = b""
    ) -> None: ...

    def _failed(self, cmd: RemotingCommand, exc: BaseException) -> None: ...

    async def invoke(
        self, code: int, ext_fields: dict[str, str], body: bytes = b"", timeout: float = 5.0
    ) -> RemotingCommand: ...


class Broker(Protocol):
    """The broker's state the handlers read and change."""

    config: BrokerConfig
    store: MessageStore | None
    clients: ClientManager
    locks: LockManager
    holds: PullHoldService
    broker_addr: str
    namesrv_addr: str
    namesrv: NamesrvState  # the embedded nameserver's KV config and write permissions
    acl: PlainAcl | None  # aclEnable=true: the accounts in force (acl_admin changes them)
    tls: ServerTls  # tls.server.mode and the certificate, for every listener
    config_version: int  # bumped by UPDATE_BROKER_CONFIG (GET_BROKER_CONFIG's version)
    transactions: Any  # halfcheck.TransactionCheckService
    scheduler: Any  # schedule.ScheduleService (its ``progress``: delay level → offset)
    registrar: Any  # registrar.Registrar when the broker registers with other nameservers
    opaques: Iterator[int]  # the opaques of the broker's own requests to other servers

    def notify_consumer_ids_changed(self, group: str, *, group_flag: bool = True) -> None: ...


HandlerResult = Union[RemotingCommand, None, Awaitable[Union[RemotingCommand, None]]]  # noqa: UP007
Handler = Callable[[Broker, Peer, RemotingCommand], HandlerResult]

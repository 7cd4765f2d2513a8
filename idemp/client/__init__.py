"""idemp.client: a pure-Python RocketMQ 4.x client on ``idemp.remoting``.

An asyncio core on its own loop thread (uvloop when available) behind blocking
facades: ``Producer`` for sends, ``PushConsumer`` driven by a runner
(``idemp.runners``) for consumption. It speaks only the public remoting protocol,
so it works against real RocketMQ as against idemp's broker.
"""

from .consumer import PushConsumer
from .instance import ClientInstance, NoRouteError
from .producer import (
    OutMessage,
    Producer,
    ReplyTimeout,
    SendError,
    SendResult,
    SendStatus,
    TransactionState,
    create_reply,
)
from .route import MessageQueue
from .settings import (
    Allocation,
    ClientSettings,
    ConsumeFrom,
    ConsumerSettings,
    MessageModel,
    ProducerSettings,
)
from .sharding import queue_index_for_key, std_hash_string
from .transport import ConnectError, RemotingError, RequestTimeout, ResponseError

__all__ = [
    "Allocation",
    "ClientInstance",
    "ClientSettings",
    "ConnectError",
    "ConsumeFrom",
    "ConsumerSettings",
    "MessageModel",
    "MessageQueue",
    "NoRouteError",
    "OutMessage",
    "Producer",
    "ProducerSettings",
    "PushConsumer",
    "RemotingError",
    "ReplyTimeout",
    "RequestTimeout",
    "ResponseError",
    "SendError",
    "SendResult",
    "SendStatus",
    "TransactionState",
    "create_reply",
    "queue_index_for_key",
    "std_hash_string",
]

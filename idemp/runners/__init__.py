"""Runners: how pulled messages reach a listener.

``ConcurrentRunner`` (RocketMQ's ConsumeMessageConcurrentlyService) and
``OrderlyRunner`` (ConsumeMessageOrderlyService, the three-lock model). A listener
is a callable taking an ``idemp.Message``, plain (run in a thread pool) or
``async def`` (run on the client's loop); its result is read with ``idemp.ack_of``
and raising means "reconsume later".
"""

from .concurrent import ConcurrentRunner
from .orderly import OrderlyRunner

__all__ = ["ConcurrentRunner", "OrderlyRunner"]

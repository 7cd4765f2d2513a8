"""The event-loop thread behind the sync facade.

The client's core is asyncio; users call it from ordinary threads. One loop thread
per client instance runs every connection and timer; ``call`` hands a coroutine to it
and blocks the calling thread for the result.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a Linux dependency
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class LoopThread:
    def __init__(self, name: str = "idemp-client-loop") -> None:
        self.loop = new_event_loop()
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()
        self._ready.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        self.loop.run_forever()

    def in_loop(self) -> bool:
        return threading.current_thread() is self.thread

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if self.in_loop():
            coro.close()
            raise RuntimeError("a blocking client call was made on the client's own loop")
        return self.submit(coro).result(timeout)

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        if not self.in_loop():
            self.thread.join(10)
            if not self.thread.is_alive():
                self.loop.close()

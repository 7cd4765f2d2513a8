"""The broker's own loops, in process on a temporary store: they end when its stop cancels
them, whatever else happens in the same turn of the event loop, and sleep while idle."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from idemp.broker.config import BrokerConfig
from idemp.broker.server import BrokerServer
from idemp.remoting import MessageExt


def test_loops_cancelled_as_they_are_woken_end(tmp_path: Path) -> None:
    """The delay-level and timer loops wait for a wake-up or their next due time; with
    ``asyncio.wait_for`` (Python 3.11) a cancellation arriving in the turn the wake-up was
    set was dropped and the loop waited again, so the broker's stop, which awaits its
    cancelled loops, could hang."""

    async def scenario() -> list[str]:
        cfg = BrokerConfig(
            storePathRootDir=str(tmp_path / "store"),
            listenPort=0,
            namesrvAddr="127.0.0.1:0",
            grpcServerPort=-1,
        )
        server = BrokerServer(cfg)
        await server.start()
        loops: dict[str, Any] = {
            "ScheduleService.run": server.scheduler,
            "TimerService.run": server.timer,
        }
        tasks = {t.get_coro().__qualname__: t for t in server._tasks}  # type: ignore[union-attr]
        tasks = {name: tasks[name] for name in loops}
        for _ in range(5):  # each loop has reached its wait
            await asyncio.sleep(0)
        for name, service in loops.items():
            service._wake.set()
            tasks[name].cancel()
        await asyncio.wait(tasks.values(), timeout=5)
        still = [name for name, task in tasks.items() if not task.done()]
        await asyncio.wait_for(server.stop(), 10)
        return still

    assert asyncio.run(scenario()) == []


def test_async_flush_syncs_each_append_and_sleeps_between(tmp_path: Path) -> None:
    """ASYNC_FLUSH waits for an append, then fsyncs within ``flushIntervalCommitLog``;
    between appends it sleeps (an idle broker used to wake twice a second for nothing).
    Two appends an idle spell apart are both synced: the wait re-arms."""

    async def scenario() -> list[tuple[int, int]]:
        cfg = BrokerConfig(
            storePathRootDir=str(tmp_path / "store"),
            listenPort=0,
            namesrvAddr="127.0.0.1:0",
            grpcServerPort=-1,
            flushIntervalCommitLog=100,
        )
        server = BrokerServer(cfg)
        await server.start()
        store = server.store
        assert store is not None
        log = store.commitlog
        seen = []
        for n in range(2):
            store.put(MessageExt(topic="T", body=b"x", properties={"UNIQ_KEY": f"u{n}"}))
            end = log.end
            deadline = time.monotonic() + 10
            while log.flushed < end and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            seen.append((log.flushed, end))
            await asyncio.sleep(0.3)  # idle: three flush intervals with nothing to sync
        await asyncio.wait_for(server.stop(), 10)
        return seen

    (first, second) = asyncio.run(scenario())
    assert first[0] == first[1] and second[0] == second[1] > first[1]

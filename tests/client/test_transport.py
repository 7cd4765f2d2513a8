"""idemp.client.transport: cancellation of in-flight requests.

Regression for the "a test sometimes takes 15 s" race: a consumer's shutdown cancels
its pull tasks and awaits them. ``asyncio.wait_for`` (Python < 3.12) drops a
cancellation that lands after the awaited thing is done but before ``wait_for`` has
woken up; a pull task cancelled right after its connection lookup then sent its PULL
anyway, the broker held it for the long-poll time (15 s), and shutdown waited for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from idemp.client.loop import new_event_loop
from idemp.client.transport import RequestTimeout, Transport, within
from idemp.remoting import RequestCode

# Long enough that a request still running after HELD_S was not cancelled; the server
# never answers, so only a working cancellation ends the request before it.
HELD_S = 600.0
# A correctness bound, not a performance one: a cancelled request must end within a
# few loop iterations; 10 s only keeps a regression from hanging the suite.
CANCEL_BOUND_S = 10.0

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "client-loop": new_event_loop,  # uvloop on Linux, as the client runs
}


async def _silent_server() -> tuple[asyncio.AbstractServer, str]:
    """A broker stand-in that reads requests and never answers (a held pull)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(65536):
            pass
        writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    return srv, f"127.0.0.1:{srv.sockets[0].getsockname()[1]}"


async def _cancel_after(steps: int) -> tuple[bool, bool]:
    """Start a request, let the loop run ``steps`` iterations, cancel it; return
    (ended within the bound, ended as cancelled)."""
    srv, addr = await _silent_server()
    transport = Transport()
    try:
        await transport.connection(addr)  # the usual case: the connection exists
        task = asyncio.ensure_future(
            transport.invoke(addr, transport.request(RequestCode.PULL_MESSAGE), HELD_S)
        )
        for _ in range(steps):
            await asyncio.sleep(0)
        task.cancel()
        done, _ = await asyncio.wait((task,), timeout=CANCEL_BOUND_S)
        ended, cancelled = bool(done), task.cancelled()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return ended, cancelled
    finally:
        transport.close()
        srv.close()
        await srv.wait_closed()


@pytest.mark.parametrize("loop_kind", sorted(LOOPS))
def test_cancelled_request_ends_at_every_point(loop_kind: str) -> None:
    # Every cancellation point from "not started" to "waiting for the answer":
    # before the fix, steps 1-3 (connection lookup done, wait_for not yet woken)
    # left the request running until the server answered.
    loop = LOOPS[loop_kind]()
    try:
        outcomes = [loop.run_until_complete(_cancel_after(steps)) for steps in range(8)]
    finally:
        loop.close()
    assert outcomes == [(True, True)] * 8


def test_within_times_out_and_passes_results() -> None:
    async def scenario() -> tuple[int, str]:
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        fut.set_result(7)
        value = await within(fut, 1.0)
        try:
            await within(asyncio.get_running_loop().create_future(), 0.01)
        except asyncio.TimeoutError:
            outcome = "timeout"
        else:
            outcome = "no timeout"
        return value, outcome

    assert asyncio.run(scenario()) == (7, "timeout")


def test_unanswered_request_times_out() -> None:
    async def scenario() -> tuple[str, str]:
        srv, addr = await _silent_server()
        transport = Transport()
        try:
            await transport.invoke(addr, transport.request(RequestCode.PULL_MESSAGE), 0.2)
        except RequestTimeout as exc:
            return addr, str(exc)
        finally:
            transport.close()
            srv.close()
            await srv.wait_closed()
        return addr, "answered"

    addr, outcome = asyncio.run(scenario())
    assert outcome == f"request code {int(RequestCode.PULL_MESSAGE)} to {addr} timed out after 0.2s"

"""RocketMQ 5 fixtures: idemp's broker with its gRPC endpoint, and the official 5.x client
in child processes of its own virtualenv (``.cache/v5-venv``, built by ``make test``)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from idemp.broker.process import BrokerProcess
from tests.broker.conftest import make_broker  # noqa: F401 - the fixture, shared
from tests.broker.rawclient import RawClient

from .raw import Raw

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("child5.py")
MARK = "@@v5 "


def v5_python() -> Path:
    path = Path(os.environ.get("IDEMP_V5_PYTHON", ROOT / ".cache" / "v5-venv" / "bin" / "python"))
    if not path.exists():
        pytest.fail(
            f"{path} is missing: the RocketMQ 5 client lives in a venv of its own, "
            "built by `make v5-venv` (make test builds it)"
        )
    return path


class Client5:
    """One child process of the official 5.x client; ``call`` sends a command and waits,
    with a deadline, for its answer."""

    def __init__(self, endpoint: str, log: Path, env: dict[str, str] | None = None) -> None:
        self.endpoint = endpoint
        self.log_path = log
        self._ids = itertools.count(1)
        self._answers: dict[int, dict[str, Any]] = {}
        self._cond = threading.Condition()
        with open(log, "a", encoding="utf-8") as err:
            self.proc = subprocess.Popen(
                [str(v5_python()), str(CHILD)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env={**os.environ, "HOME": str(log.parent), **(env or {})},
            )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._wait(0, 60.0)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(MARK):
                answer = json.loads(line[len(MARK) :])
                with self._cond:
                    self._answers[answer["id"]] = answer
                    self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def _wait(self, ident: int, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while ident not in self._answers:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise AssertionError(
                        f"5.x client gave no answer to command {ident} within {timeout} s "
                        f"(exit {self.proc.poll()}); log: {self.log_path}"
                    )
                self._cond.wait(min(left, 0.5))
            return self._answers.pop(ident)

    def call(self, op: str, *, timeout: float = 60.0, **kw: Any) -> dict[str, Any]:
        ident = next(self._ids)
        command = {"id": ident, "op": op, "endpoint": self.endpoint, **kw}
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return self._wait(ident, timeout)

    def ok(self, op: str, *, timeout: float = 60.0, **kw: Any) -> dict[str, Any]:
        answer = self.call(op, timeout=timeout, **kw)
        assert answer["ok"], answer
        return answer

    def receive_until(
        self, want: int, within: float, invisible: int = 10, *, name: str = "c", max: int = 16
    ) -> list[dict[str, Any]]:
        """SimpleConsumer ``name`` receives (each receive long-polls) until ``want``
        messages came or ``within`` seconds passed; what came, in order."""
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + within
        while len(got) < want and time.monotonic() < deadline:
            got += self.ok("receive", name=name, max=max, invisible=invisible)["messages"]
        return got

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write(json.dumps({"id": -1, "op": "exit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


@dataclass
class Endpoint5:
    grpc_addr: str  # where 5.x clients connect
    broker_addr: str  # the broker's remoting port, for admin requests and 4.x clients
    real: bool  # True: real RocketMQ 5 (IDEMP_V5_REAL), not idemp's broker
    # the shortest invisible duration a receive may ask (minInvisibleTimeMillsForRecv):
    # RocketMQ's default 10 s; idemp's broker is started with 2 s so that the tests that
    # wait for a message to become visible again do not idle
    invisible_s: int = 10
    # the nameserver (idemp's broker; with IDEMP_V5_REAL a third address, RocketMQ's)
    namesrv_addr: str = ""


@pytest.fixture
def broker5(make_broker: Callable[..., BrokerProcess]) -> Endpoint5:  # noqa: F811
    """idemp's broker, or with ``IDEMP_V5_REAL=<proxy grpc host:port>,<broker host:port>``
    (``,<nameserver host:port>`` for the tests that need one) a running RocketMQ 5
    (../shared/realrmq5): the same tests, to check them on the real thing. Topic and
    group names are unique per test, so a shared server does not leak. (On RocketMQ a
    receive before the client's Telemetry settings arrived fails with 50001, so the
    child's SimpleConsumer waits for them after its start.)"""
    real = os.environ.get("IDEMP_V5_REAL")
    if real:
        grpc_addr, broker_addr, *namesrv = real.split(",")
        return Endpoint5(grpc_addr, broker_addr, True, namesrv_addr="".join(namesrv))
    # 5.x clients' transactions checked every 5 s instead of RocketMQ 5.3.3's 30 s (4.x
    # halves keep 4.9.7's 60 s), so the check-back test does not idle; the shortest
    # invisible time 2 s (see Endpoint5)
    broker = make_broker(grpcTransactionCheckInterval=5000, minInvisibleTimeMillsForRecv=2000)
    return Endpoint5(
        broker.grpc_addr, broker.broker_addr, False, invisible_s=2, namesrv_addr=broker.namesrv_addr
    )


@pytest.fixture
def names() -> Callable[[str], str]:
    """``names("T")`` → a topic or group name unique to this test run."""
    run = uuid.uuid4().hex[:8]
    return lambda prefix: f"{prefix}_{run}"


def dead_letters(broker_addr: str, group: str, want: int, within: float) -> list[Any]:
    """The messages of ``%DLQ%<group>`` (pulled by a 4.x client), once ``want`` are there
    or ``within`` seconds passed: the DLQ write follows the last failed delivery."""
    found: list[Any] = []
    deadline = time.monotonic() + within
    with RawClient(broker_addr) as remoting:
        while len(found) < want and time.monotonic() < deadline:
            found = remoting.pull_messages(f"%DLQ%{group}", 0)
            if len(found) < want:
                time.sleep(0.5)  # polled, bounded by ``within``
    return found


@pytest.fixture
def raw(broker5: Endpoint5) -> Iterator[Raw]:
    """Raw gRPC calls (requests no official client would send)."""
    client = Raw(broker5.grpc_addr)
    yield client
    client.close()


@pytest.fixture
def admin(broker5: Endpoint5) -> Iterator[RawClient]:
    """A remoting connection for what mqadmin does (topics with a message type, groups)."""
    with RawClient(broker5.broker_addr) as client:
        yield client


@pytest.fixture
def client5(broker5: Endpoint5, tmp_path: Path) -> Iterator[Callable[[], Client5]]:
    """Factory of 5.x client processes pointed at the broker's gRPC endpoint."""
    made: list[Client5] = []

    def factory() -> Client5:
        client = Client5(broker5.grpc_addr, tmp_path / f"client5-{len(made)}.log")
        made.append(client)
        return client

    yield factory
    for client in made:
        client.close()

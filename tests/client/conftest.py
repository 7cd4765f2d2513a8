"""Fixtures for idemp.client and runner tests: idemp's broker as a child process, and
``idemp consume`` / ``idemp produce`` as real separate processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from idemp.broker.process import BrokerProcess
from tests.realbroker import start_broker

# Fast retries and redelivery for tests: every delay level is 1 s.
FAST_DELAYS = " ".join(["1s"] * 18)


@pytest.fixture
def make_broker(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., BrokerProcess]]:
    """``make_broker(**broker_conf_keys)``: a broker on a fresh store; all are stopped.
    With IDEMP_4X_REAL set, RocketMQ 4.9.7 (tests/realbroker.py)."""
    started: list[BrokerProcess] = []

    def factory(store: Path | None = None, **props: object) -> BrokerProcess:
        store = store or tmp_path / f"store{len(started)}"
        broker = start_broker(store, {k: str(v) for k, v in props.items()}, request.path)
        started.append(broker)
        return broker

    yield factory
    for broker in started:
        broker.stop()


@pytest.fixture
def broker(make_broker: Callable[..., BrokerProcess]) -> BrokerProcess:
    return make_broker(messageDelayLevel=FAST_DELAYS)


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, step: float = 0.05) -> Any:
    """Poll ``predicate`` until truthy; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.endswith("}"):
            out.append(json.loads(line))
    return out


class ConsumeProcess:
    """``idemp consume`` in a child process; its record file and stderr events."""

    def __init__(self, name: str, workdir: Path, args: list[str]) -> None:
        self.name = name
        self.record = workdir / f"{name}.jsonl"
        self.err_path = workdir / f"{name}.err"
        self._err = open(self.err_path, "w", encoding="utf-8")
        cmd = [sys.executable, "-m", "idemp", "consume", "--record", str(self.record), *args]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=self._err,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        out = []
        for line in self.err_path.read_text(encoding="utf-8").splitlines():
            if line.startswith("{"):
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if kind is None or e.get("event") == kind:
                    out.append(e)
        return out

    def records(self) -> list[dict[str, Any]]:
        return read_jsonl(self.record)

    def wait_started(self, timeout: float = 30.0) -> None:
        wait_for(
            lambda: self.events("started") or self.proc.poll() is not None,
            timeout,
            f"{self.name} to start",
        )
        assert self.proc.poll() is None, f"{self.name} exited: {self.stderr_tail()}"

    def stderr_tail(self) -> str:
        return "".join(self.err_path.read_text(encoding="utf-8").splitlines(True)[-20:])

    def terminate(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self._err.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self._err.close()

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._err.close()


@pytest.fixture
def consumers(tmp_path: Path) -> Iterator[Callable[..., ConsumeProcess]]:
    """Start ``idemp consume`` processes; any still running at the end are killed."""
    procs: list[ConsumeProcess] = []

    def start(name: str, *args: str) -> ConsumeProcess:
        p = ConsumeProcess(name, tmp_path, list(args))
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.proc.poll() is None:
            p.kill()


def run_produce(*args: str, timeout: float = 120.0) -> dict[str, Any]:
    """``idemp produce`` as a process; returns its JSON summary."""
    res = subprocess.run(
        [sys.executable, "-m", "idemp", "produce", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))

"""Start idemp's broker (or a nameserver alone) as a child process and wait for its
ready line.

Used by the demo, the tests and the benchmarks: a real process, so a test can kill
it with SIGKILL and start it again on the same store and ports.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

READY_PREFIX = "idemp broker ready "
NAMESRV_READY_PREFIX = "idemp namesrv ready "


class BrokerStartError(RuntimeError):
    pass


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets ``sig`` when its parent dies, so a crashed test
    run, demo or chaos run never leaves a process behind (Linux PR_SET_PDEATHSIG)."""

    def arm() -> None:  # pragma: no cover - runs in the child before exec
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)
        except OSError:  # not Linux
            pass

    return arm


# The broker child arms its own death signal (``arm_from_environment``, called by ``idemp
# broker``) instead of a preexec_fn: with no preexec_fn, subprocess can vfork, and the
# pthread_atfork handlers of libraries in the parent (gRPC's restart its poller in the
# child, which then aborts on an epoll fd already closed for exec: grpc/grpc#43157) never
# run in between.
PARENT_ENV = "IDEMP_DIE_WITH_PARENT"


def arm_from_environment() -> None:
    """In a child started with ``PARENT_ENV`` set to its parent's pid: get SIGTERM when
    that parent dies, or exit now if it already has."""
    parent = os.environ.pop(PARENT_ENV, "")
    if not parent.isdigit():
        return
    die_with_parent()()
    if os.getppid() != int(parent):
        sys.exit(1)  # the parent died before the death signal was armed


def stop_process(proc: subprocess.Popen[Any], timeout: float) -> int:
    """SIGTERM and wait; SIGKILL when it does not exit within ``timeout``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def kill_process(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL (no flush, no goodbye) and reap."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


class BrokerProcess:
    def __init__(
        self,
        store: str | Path,
        *,
        properties: dict[str, str] | None = None,
        log_path: str | Path | None = None,
        start_timeout: float = 30.0,
        config_file: str | Path | None = None,
    ) -> None:
        """``config_file``: a broker.conf given with ``-c`` (``properties`` override it)."""
        self.store = Path(store)
        self.properties = dict(properties or {})
        self.config_file = None if config_file is None else Path(config_file)
        self.log_path = (
            Path(log_path) if log_path else self.store.parent / (self.store.name + ".log")
        )
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[str] | None = None
        self.namesrv_port = 0
        self.broker_port = 0
        self.grpc_port = 0
        self.ready_line = ""

    @property
    def namesrv_addr(self) -> str:
        return f"127.0.0.1:{self.namesrv_port}"

    @property
    def broker_addr(self) -> str:
        return f"127.0.0.1:{self.broker_port}"

    def start(self) -> BrokerProcess:
        props = {"storePathRootDir": str(self.store), **self.properties}
        props.setdefault("listenPort", str(self.broker_port))
        props.setdefault("namesrvAddr", f"127.0.0.1:{self.namesrv_port}")
        if self.broker_port:
            props["listenPort"] = str(self.broker_port)
        if self.namesrv_port:
            props["namesrvAddr"] = self.namesrv_addr
        if self.grpc_port:
            props["grpcServerPort"] = str(self.grpc_port)
        cmd = [sys.executable, "-m", "idemp", "broker", "--log-level", "INFO"]
        if self.config_file is not None:
            cmd += ["-c", str(self.config_file)]
        for key, value in props.items():
            cmd += ["-p", f"{key}={value}"]
        fields = self._spawn(cmd, READY_PREFIX, "broker")
        self.namesrv_port = int(fields["namesrv"].rsplit(":", 1)[1])
        self.broker_port = int(fields["broker"].rsplit(":", 1)[1])
        if fields.get("grpc", "off") != "off":
            self.grpc_port = int(fields["grpc"].rsplit(":", 1)[1])
        return self

    def _spawn(self, cmd: list[str], prefix: str, what: str) -> dict[str, str]:
        """Start ``cmd`` (stderr appended to the log), and return its ready line's fields."""
        self.store.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "a", encoding="utf-8")
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env={**os.environ, PARENT_ENV: str(os.getpid())},
            )
        finally:
            log.close()
        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + self.start_timeout
        line = ""
        while time.monotonic() < deadline:
            if sel.select(timeout=max(0.0, deadline - time.monotonic())):
                line = self.proc.stdout.readline()
                if line.startswith(prefix) or not line:
                    break
        sel.close()
        if not line.startswith(prefix):
            self.kill()
            raise BrokerStartError(
                f"{what} did not start (exit {self.proc.returncode}); log: {self.log_path}\n"
                + self._log_tail()
            )
        self.ready_line = line.strip()
        return dict(part.split("=", 1) for part in line[len(prefix) :].split() if "=" in part)

    @property
    def grpc_addr(self) -> str:
        """Where RocketMQ 5 clients connect (the proxy's endpoint)."""
        return f"127.0.0.1:{self.grpc_port}"

    def _log_tail(self) -> str:
        try:
            return "".join(self.log_path.read_text(encoding="utf-8").splitlines(True)[-30:])
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait: the broker flushes and exits 0."""
        if self.proc is None:
            return 0
        code = stop_process(self.proc, timeout)
        self._close_pipe()
        return code

    def kill(self) -> None:
        """SIGKILL: no flush, no goodbye."""
        if self.proc is None:
            return
        kill_process(self.proc)
        self._close_pipe()

    def _close_pipe(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class NamesrvProcess(BrokerProcess):
    """``idemp namesrv`` as a child process: a nameserver that outlives its brokers.
    ``store`` holds its KV config; a restart keeps the port."""

    def start(self) -> NamesrvProcess:
        cmd = [sys.executable, "-m", "idemp", "namesrv", "--log-level", "INFO"]
        cmd += ["--listen-port", str(self.namesrv_port)]
        cmd += ["--kv-config", str(self.store / "kvConfig.json")]
        fields = self._spawn(cmd, NAMESRV_READY_PREFIX, "nameserver")
        self.namesrv_port = int(fields["namesrv"].rsplit(":", 1)[1])
        return self

    def __enter__(self) -> NamesrvProcess:
        return self.start()

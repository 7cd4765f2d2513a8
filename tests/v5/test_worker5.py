"""``idemp worker`` hosting an App listener declared with ``protocol="grpc"``: RocketMQ 5's
PushConsumer in the worker process (.cache/v5-venv), duplicates absorbed, SIGTERM → exit 0,
and the configuration errors of grpc listeners at start, in one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from tests.broker.rawclient import RawClient

from .conftest import Client5, Endpoint5, v5_python

APP = """
import sqlalchemy as sa

from idemp import App, Message

app = App("rides5")
engine = sa.create_engine("sqlite:///{db}")


@app.listener("{topic}", group="{group}", key="json:$.id", strategy="sqlite:///{dedup}",
              protocol="grpc")
def on_ride(message: Message) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO effects VALUES (:id)"), {{"id": message.json()["id"]}})
"""


def _worker(tmp: Path, *args: str) -> subprocess.Popen[str]:
    env = {"HOME": str(tmp), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp)}
    return subprocess.Popen(
        [str(v5_python()), "-m", "idemp", "worker", "rides5:app", *args],
        cwd=tmp,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp / "worker.err", "w", encoding="utf-8"),  # noqa: SIM115 - the child's
        text=True,
    )


def test_worker_runs_a_grpc_listener(
    broker5: Endpoint5,
    admin: RawClient,
    client5: Callable[[], Client5],
    names: Callable[[str], str],
    tmp_path: Path,
) -> None:
    topic, group = names("T"), names("G")
    assert admin.create_topic(topic, 4).code == 0
    db = tmp_path / "effects.db"
    engine = sa.create_engine(f"sqlite:///{db}")
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE effects (id TEXT)"))
    app = APP.format(db=db, dedup=tmp_path / "dedup.db", topic=topic, group=group)
    (tmp_path / "rides5.py").write_text(app, encoding="utf-8")
    worker = _worker(tmp_path, "--endpoint", broker5.grpc_addr)
    try:
        sender = client5()
        sender.ok("producer", name="p", topics=[topic])
        ids = [f"ride-{i}" for i in range(20)] + ["ride-3", "ride-11"]  # producer retries
        sender.ok(
            "send",
            name="p",
            messages=[{"topic": topic, "body": json.dumps({"id": i})} for i in ids],
        )
        deadline = time.monotonic() + 60
        rows: list[str] = []
        while len(rows) < 20 and time.monotonic() < deadline:
            assert worker.poll() is None, (tmp_path / "worker.err").read_text()
            with engine.connect() as conn:
                rows = [r[0] for r in conn.execute(sa.text("SELECT id FROM effects"))]
            time.sleep(0.2)  # the worker is another process; poll its effects
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(60) == 0, (tmp_path / "worker.err").read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
    with engine.connect() as conn:
        rows = [r[0] for r in conn.execute(sa.text("SELECT id FROM effects"))]
    engine.dispose()
    assert sorted(rows) == sorted(f"ride-{i}" for i in range(20))  # each once
    err = (tmp_path / "worker.err").read_text()
    assert "event=listener_started" in err and "grpc" in err


def test_a_grpc_listener_without_endpoint_fails_at_start(tmp_path: Path) -> None:
    app = APP.format(db=tmp_path / "e.db", dedup=tmp_path / "d.db", topic="T", group="G")
    (tmp_path / "rides5.py").write_text(app, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "IDEMP_ENDPOINT"}
    done = subprocess.run(
        [str(v5_python()), "-m", "idemp", "worker", "rides5:app"],
        cwd=tmp_path,
        env={**env, "HOME": str(tmp_path), "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("idemp worker: ")]
    assert "no RocketMQ 5 endpoint for protocol='grpc' listeners" in line


def test_orderly_and_batches_are_refused_for_grpc_listeners() -> None:
    import pytest

    from idemp import App

    app = App("x", endpoint="127.0.0.1:8081")
    for options in ({"orderly": True}, {"batch_size": 8}):
        with pytest.raises(ValueError, match="consumes by POP; per-group order comes from a FIFO"):
            app.listener("T", group="G", protocol="grpc", **options)
    with pytest.raises(ValueError, match="protocol 'http' is not remoting or grpc"):
        app.listener("T", group="G", protocol="http")
    retry_options: list[dict[str, Any]] = [{"retry_delay_level": 1}, {"max_reconsume_times": 3}]
    for options in retry_options:
        with pytest.raises(ValueError, match="group's retry policy spaces the deliveries"):
            app.listener("T", group="G", protocol="grpc", **options)

"""A file the command cannot read is one line naming it, exit status 2, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("option", ["--body-file", "--keys-from"])
def test_produce_names_a_missing_file(tmp_path: Path, option: str) -> None:
    missing = tmp_path / "absent.bin"
    out = subprocess.run(
        [sys.executable, "-m", "idemp", "produce", "--namesrv", "127.0.0.1:1", "--topic", "t"]
        + [option, str(missing)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr == f"idemp produce: cannot read {missing}: No such file or directory\n"


def _idemp(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "idemp", *argv], capture_output=True, text=True, timeout=60
    )


def test_consume_names_a_record_file_it_cannot_write(tmp_path: Path) -> None:
    record = tmp_path / "absent-dir" / "seen.jsonl"
    out = _idemp(
        "consume",
        "--namesrv",
        "127.0.0.1:1",
        "--topic",
        "t",
        "--group",
        "g",
        "--record",
        str(record),
    )
    assert out.returncode == 2
    assert out.stderr == f"idemp consume: cannot write {record}: No such file or directory\n"


def test_export_table_names_the_database_it_cannot_open(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/absent-dir/app.db"
    out = _idemp("reconcile", "export-table", "--url", url, "--table", "t", "--out", "x.parquet")
    assert out.returncode == 2
    assert out.stderr == (
        f"idemp reconcile export-table: {url}: "
        "(sqlite3.OperationalError) unable to open database file\n"
    )


def test_export_redis_masks_the_password_of_a_server_it_cannot_reach() -> None:
    out = _idemp(
        "reconcile", "export-redis", "--url", "redis://:s3cret@127.0.0.1:1/0", "--out", "x.parquet"
    )
    assert out.returncode == 2
    assert "s3cret" not in out.stderr and "Traceback" not in out.stderr
    assert out.stderr.startswith("idemp reconcile export-redis: redis://:***@127.0.0.1:1/0: ")
    assert out.stderr.count("\n") == 1

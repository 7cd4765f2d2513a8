"""Bad input: a clear error naming the file and the column; no report that looks complete."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from idemp.reconcile.cli import main
from tests.reconcile import planted

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    b, _ = planted.build()
    return planted.write(b, tmp_path_factory.mktemp("good"), "parquet")


def run(paths: dict[str, str], out: Path, capsys: pytest.CaptureFixture[str]) -> str:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text('{"complete": true}')  # a previous run's
    (out / "report.html").write_text("old")
    code = main(
        [
            "--history",
            paths["history"],
            "--records",
            paths["records"],
            "--offsets",
            paths["offsets"],
            "--out",
            str(out),
            "--no-progress",
            "--as-of",
            str(planted.AS_OF),
        ]
    )
    assert code == 2
    assert not (out / "summary.json").exists()
    assert not (out / "report.html").exists()
    error = json.loads((out / "error.json").read_text())
    assert error["complete"] is False
    err = capsys.readouterr().err
    assert error["error"] in err
    return str(error["error"])


def _history(paths: dict[str, str]) -> pa.Table:
    return pq.read_table(paths["history"])


def test_missing_column(
    spark: Any, tmp_path: Path, good: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "history.parquet"
    pq.write_table(_history(good).drop(["kind"]), bad)
    msg = run({**good, "history": str(bad)}, tmp_path / "out", capsys)
    assert msg.startswith(f"history input {bad}, column 'kind': missing")


def test_wrong_type_parquet(
    spark: Any, tmp_path: Path, good: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    t = _history(good)
    i = t.schema.get_field_index("queue_offset")
    bad = tmp_path / "history.parquet"
    pq.write_table(t.set_column(i, "queue_offset", t["queue_offset"].cast(pa.string())), bad)
    msg = run({**good, "history": str(bad)}, tmp_path / "out", capsys)
    assert msg == f"history input {bad}, column 'queue_offset': has type string, expected bigint"


def test_wrong_type_json_lines(
    spark: Any, tmp_path: Path, good: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    rows = _history(good).to_pylist()
    rows[7]["queue_offset"] = "seven"  # not the first record: found by the parse pass
    bad = tmp_path / "history.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    msg = run({**good, "history": str(bad)}, tmp_path / "out", capsys)
    assert msg.startswith(f"history input {bad}, column 'queue_offset': a record has a value")


def test_empty_input(
    spark: Any, tmp_path: Path, good: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "history.parquet"
    pq.write_table(_history(good).slice(0, 0), bad)
    msg = run({**good, "history": str(bad)}, tmp_path / "out", capsys)
    assert msg == f"history input {bad}: is empty (no rows)"


def test_unreadable_file(
    spark: Any, tmp_path: Path, good: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "records.parquet"
    bad.write_bytes(b"this is not parquet at all")
    msg = run({**good, "records": str(bad)}, tmp_path / "out", capsys)
    assert msg.startswith(f"records input {bad}: cannot be read as parquet")


def test_missing_file(
    spark: Any, tmp_path: Path, good: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "nope.parquet"
    msg = run({**good, "history": str(bad)}, tmp_path / "out", capsys)
    assert msg == f"history input {bad}: does not exist"


def test_records_missing_status(
    spark: Any, tmp_path: Path, good: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "records.parquet"
    pq.write_table(pq.read_table(good["records"]).drop(["status"]), bad)
    msg = run({**good, "records": str(bad)}, tmp_path / "out", capsys)
    assert msg.startswith(f"records input {bad}, column 'status': missing")


def test_offsets_not_json(
    spark: Any, tmp_path: Path, good: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "consumerOffset.json"
    bad.write_text("{offsetTable: nope")
    msg = run({**good, "offsets": str(bad)}, tmp_path / "out", capsys)
    assert msg.startswith(f"offsets input {bad}: not a consumerOffset.json")

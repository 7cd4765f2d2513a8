"""The unique-key table read over JDBC (PostgreSQL and SQLite) gives the same exact
counts as its Parquet export. The driver jars come from ``make`` (``.cache/jdbc``,
a prerequisite of ``make test``) and are put on the shared session by conftest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from idemp.reconcile.cli import main
from idemp.strategies.unique_key import make_table
from tests.reconcile import planted
from tests.reconcile.conftest import JDBC_DIR
from tests.servers import PostgresServer

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[planted.Builder, dict[str, str]]:
    b, _ = planted.build()
    return b, planted.write(b, tmp_path_factory.mktemp("jdbc"), "parquet")


def fill_unique_key_table(url: str, table: str, b: planted.Builder) -> None:
    """The planted records as rows of idemp.strategies.unique_key's own table."""
    engine = sa.create_engine(url)
    t = make_table(table)
    try:
        t.metadata.create_all(engine)
        with engine.begin() as conn:
            conn.execute(
                t.insert(),
                [
                    {
                        "namespace": r["namespace"],
                        "business_key": r["key"],
                        "status": r["status"],
                        "owner": r["owner"],
                        "fingerprint": r["fingerprint"],
                        "attempts": r["attempts"],
                        "deadline_ms": r["deadline"],
                        "expires_ms": r["expiry"],
                        "msg_id": None,
                        "created_ms": r["updated_at"],
                        "updated_ms": r["updated_at"],
                    }
                    for r in b.records
                ],
            )
    finally:
        engine.dispose()


def reconcile(paths: dict[str, str], records: str, out: Path) -> tuple[int, dict[str, Any]]:
    code = main(
        [
            "--history",
            paths["history"],
            "--records",
            records,
            "--offsets",
            paths["offsets"],
            "--effects",
            f"{paths['effects']}:order_id:{planted.NS1}",
            "--out",
            str(out),
            "--as-of",
            str(planted.AS_OF),
            "--jdbc-jars",
            str(JDBC_DIR),
            "--no-progress",
            "--no-html",
        ]
    )
    return code, json.loads((out / "summary.json").read_text())


def assert_same_as_parquet(spark: Any, paths: dict[str, str], jdbc: str, tmp_path: Path) -> None:
    jars = spark.sparkContext.getConf().get("spark.jars", "")
    assert "postgresql.jar" in jars and "sqlite" in jars, (
        f"the shared session has no JDBC jars ({jars!r}): run `make {JDBC_DIR}/.stamp`"
    )
    code, by_file = reconcile(paths, paths["records"], tmp_path / "file")
    jcode, by_jdbc = reconcile(paths, jdbc, tmp_path / "jdbc")
    assert (jcode, code) == (1, 1)
    for name, n in planted.CLASS_COUNTS.items():
        assert by_jdbc["counts"][name] == n, name
    assert by_jdbc["counts"] == by_file["counts"]
    assert by_jdbc["per_day"] == by_file["per_day"]
    assert by_jdbc["failed"] == {"doubled": 1, "lost": 4, "stuck": 3, "effect_missing": 1}
    keys = {  # every key's class, the unkeyed rows (null key) included
        name: {
            (r["namespace"], r["key"], r["class"])
            for r in spark.read.parquet(str(tmp_path / name / "keys")).collect()
        }
        for name in ("file", "jdbc")
    }
    assert len(keys["file"]) == planted_rows(spark, tmp_path / "file")
    assert keys["jdbc"] == keys["file"]


def planted_rows(spark: Any, out: Path) -> int:
    return int(spark.read.parquet(str(out / "keys")).count())


def test_postgresql_over_jdbc(
    spark: Any, tmp_path: Path, dataset: Any, postgres_server: PostgresServer
) -> None:
    b, paths = dataset
    fill_unique_key_table(postgres_server.url, "dedup_jdbc", b)
    jdbc = (
        f"jdbc:postgresql://{postgres_server.host}:{postgres_server.port}/postgres"
        f"?user=postgres#dedup_jdbc"
    )
    assert_same_as_parquet(spark, paths, jdbc, tmp_path)


def test_sqlite_over_jdbc(spark: Any, tmp_path: Path, dataset: Any) -> None:
    b, paths = dataset
    db = tmp_path / "app.db"
    fill_unique_key_table(f"sqlite:///{db}", "idemp_dedup", b)
    # no #TABLE: idemp_dedup, the strategy's default table
    assert_same_as_parquet(spark, paths, f"jdbc:sqlite:{db}", tmp_path)


def test_jdbc_errors_name_the_table(
    spark: Any, tmp_path: Path, dataset: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    b, paths = dataset
    db = tmp_path / "empty.db"
    engine = sa.create_engine(f"sqlite:///{db}")
    make_table("idemp_dedup").metadata.create_all(engine)
    engine.dispose()
    out = tmp_path / "out"
    for spec, problem in [
        (f"jdbc:sqlite:{db}#missing_table", "cannot be read over JDBC"),
        (f"jdbc:sqlite:{db}", "is empty (no rows)"),
    ]:
        code = main(
            [
                "--history",
                paths["history"],
                "--records",
                spec,
                "--offsets",
                paths["offsets"],
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        assert code == 2
        error = json.loads((out / "error.json").read_text())
        table = spec.partition("#")[2] or "idemp_dedup"
        assert error["error"].startswith(f"records input jdbc:sqlite:{db}#{table}: {problem}")
        assert not (out / "summary.json").exists()
    capsys.readouterr()

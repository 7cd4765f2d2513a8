"""One local[2] SparkSession for the whole test run (starting one takes ~8-10 s).

JDBC driver jars are JVM options: they are given when the session is created, from
``.cache/jdbc`` (``make .cache/jdbc/.stamp``, a prerequisite of ``make test``);
test_jdbc.py fails with that hint when they are missing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

JDBC_DIR = Path(__file__).resolve().parents[2] / ".cache" / "jdbc"


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from idemp.reconcile.session import get_session

    jars = [JDBC_DIR] if (JDBC_DIR / ".stamp").exists() else []
    session = get_session(
        "local[2]", shuffle_partitions=4, conf={"spark.driver.memory": "2g"}, jdbc_jars=jars
    )
    try:
        yield session
    finally:
        session.stop()

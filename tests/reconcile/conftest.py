"""One local[2] SparkSession for the whole test run (starting one takes ~8-10 s)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from idemp.reconcile.session import get_session

    session = get_session("local[2]", shuffle_partitions=4,
                          conf={"spark.driver.memory": "2g"})
    try:
        yield session
    finally:
        session.stop()

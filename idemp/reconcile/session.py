"""The SparkSession: ``local[*]`` by default, whatever ``spark-submit`` says otherwise."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def under_spark_submit() -> bool:
    """spark-submit starts the JVM first and hands Python its gateway port."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def get_session(
    master: str | None = None,
    shuffle_partitions: int | None = None,
    conf: dict[str, str] | None = None,
    app_name: str = "idemp-reconcile",
) -> SparkSession:
    """An existing session is reused (tests share one); a new local one is configured
    for a laptop: loopback only, no UI, few shuffle partitions, UTC days."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if not under_spark_submit():
        master = master or "local[*]"
        builder = builder.master(master)
        if master.startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            builder = builder.config("spark.ui.enabled", "false")
            cores = os.cpu_count() or 2
            builder = builder.config(
                "spark.sql.shuffle.partitions", str(shuffle_partitions or max(4, 2 * cores))
            )
    elif shuffle_partitions:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    builder = builder.config("spark.ui.showConsoleProgress", "false")  # ours is tqdm
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark

"""The SparkSession: ``local[*]`` by default, whatever ``spark-submit`` says otherwise."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def under_spark_submit() -> bool:
    """spark-submit starts the JVM first and hands Python its gateway port."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


# xerial's SQLite driver as Debian ships it has no native library inside the jar: it
# loads the one named by these properties (found next to the jars, see jdbc_conf).
SQLITE_NATIVE = "libsqlitejdbc.so"


def jdbc_conf(paths: Sequence[str | Path]) -> dict[str, str]:
    """Spark configuration that puts JDBC driver jars on the classpath.

    ``paths``: jars, or directories whose ``*.jar`` are taken (``make`` fetches
    PostgreSQL's and SQLite's into ``.cache/jdbc``). A directory holding
    ``libsqlitejdbc.so`` also points the SQLite driver at it. JVM options: they take
    effect only when the session (its JVM) is created.
    """
    jars: list[str] = []
    native: Path | None = None
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(str(j.resolve()) for j in p.glob("*.jar"))
            if not found:
                raise FileNotFoundError(f"no *.jar in JDBC driver directory {p}")
            jars += found
            if (p / SQLITE_NATIVE).is_file():
                native = p.resolve()
        elif p.is_file():
            jars.append(str(p.resolve()))
            if (p.parent / SQLITE_NATIVE).is_file():
                native = p.parent.resolve()
        else:
            raise FileNotFoundError(f"JDBC driver jar {p} does not exist")
    if not jars:
        return {}
    conf = {"spark.jars": ",".join(jars)}
    if native is not None:
        opts = f"-Dorg.sqlite.lib.path={native} -Dorg.sqlite.lib.name={SQLITE_NATIVE}"
        conf["spark.driver.extraJavaOptions"] = opts
        conf["spark.executor.extraJavaOptions"] = opts
    return conf


def get_session(
    master: str | None = None,
    shuffle_partitions: int | None = None,
    conf: dict[str, str] | None = None,
    app_name: str = "idemp-reconcile",
    jdbc_jars: Sequence[str | Path] = (),
) -> SparkSession:
    """An existing session is reused (tests share one); a new local one is configured
    for a laptop: loopback only, no UI, few shuffle partitions, UTC days.
    ``jdbc_jars``: see :func:`jdbc_conf` (only a new session can take them)."""
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
    merged = jdbc_conf(jdbc_jars)
    for k, v in (conf or {}).items():
        # JVM options add up (the SQLite driver's and the caller's); the rest replace
        joined = k.endswith("extraJavaOptions") and k in merged
        merged[k] = f"{merged[k]} {v}" if joined else v
    for k, v in merged.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark

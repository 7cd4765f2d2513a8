"""A cluster of several brokers: a queue is (broker, queue id). Each broker's records are
judged against that broker's committed offsets, never another's queue of the same id;
inputs that cannot say which broker a queue is on are refused, naming what to give."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from idemp.broker.process import BrokerProcess, NamesrvProcess
from idemp.reconcile.cli import main
from tests.broker.conftest import make_broker  # noqa: F401 - the fixture
from tests.broker.rawclient import RawClient
from tests.reconcile import planted

pytestmark = pytest.mark.spark

NS = "g1/orders"


def _cluster(d: Path, named_history: bool = True) -> dict[str, str]:
    """Five messages on queue 0 of each broker; broker-a's consumed and committed,
    broker-b's neither (its consumer never ran)."""
    b = planted.Builder()
    for broker in ("broker-a", "broker-b"):
        for i in range(5):
            b.msg("orders", f"{broker}-k{i}", i)
            if named_history:
                b.rows[-1]["broker"] = broker
    for i in range(5):
        b.record(NS, f"broker-a-k{i}", "CONSUMED")
    paths = planted.write(b, d, "parquet")
    for broker, committed in (("broker-a", 5), ("broker-b", 0)):
        path = d / f"{broker}.json"
        path.write_text(json.dumps({"offsetTable": {"orders@g1": {"0": committed}}}))
        paths[broker] = str(path)
    return paths


def _run(paths: dict[str, str], out: Path, *offsets: str) -> int:
    args = ["--history", paths["history"], "--records", paths["records"]]
    for spec in offsets:
        args += ["--offsets", spec]
    args += ["--subscription", "orders@g1", "--out", str(out), "--no-progress", "--no-html"]
    return main([*args, "--as-of", str(planted.AS_OF)])


def test_each_brokers_records_are_judged_by_its_own_offsets(spark: Any, tmp_path: Path) -> None:
    paths = _cluster(tmp_path / "in")
    out = tmp_path / "out"
    code = _run(paths, out, f"broker-a={paths['broker-a']}", f"broker-b={paths['broker-b']}")
    counts = json.loads((out / "summary.json").read_text())["counts"]
    # broker-b's five are waiting for their consumer, not lost (broker-a's queue 0 has
    # committed offset 5; read for broker-b's queue 0 it would call them acknowledged)
    assert (counts["ok"], counts["pending"], counts["lost"]) == (5, 5, 0)
    assert code == 0


def _refused(paths: dict[str, str], out: Path, capsys: Any, *offsets: str) -> str:
    assert _run(paths, out, *offsets) == 2
    assert not (out / "summary.json").exists()
    return str(capsys.readouterr().err)


def test_one_brokers_offsets_for_a_history_of_two_are_refused(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = _cluster(tmp_path / "in")
    err = _refused(paths, tmp_path / "out", capsys, paths["broker-a"])
    assert err == (
        f"idemp reconcile: offsets input {paths['broker-a']}: is one broker's, and the history "
        "holds records of brokers broker-a, broker-b: give each broker's offsets (--offsets "
        "BROKER=PATH, repeated) or the cluster's (namesrv://HOST:PORT?group=G&topic=T)\n"
    )


def test_two_unnamed_offsets_files_are_refused(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = _cluster(tmp_path / "in")
    err = _refused(paths, tmp_path / "out", capsys, paths["broker-a"], paths["broker-b"])
    assert err == (
        f"idemp reconcile: offsets input {paths['broker-a']}: is one of several; name each "
        "broker's offsets: --offsets BROKER=PATH\n"
    )


def test_a_history_without_broker_names_for_several_brokers_offsets_is_refused(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = _cluster(tmp_path / "in", named_history=False)
    assert pq.read_table(paths["history"]).column("broker").null_count == 10
    err = _refused(
        paths,
        tmp_path / "out",
        capsys,
        f"broker-a={paths['broker-a']}",
        f"broker-b={paths['broker-b']}",
    )
    assert err == (
        "idemp reconcile: history input --history: has records without a broker name, and "
        "the offsets are of brokers broker-a, broker-b: export each store with --broker-name "
        "(or pull the history with idemp history pull, which names them)\n"
    )


@pytest.mark.idemp_only("starts idemp's brokers with --no-namesrv")
def test_a_live_cluster_reconciles_from_its_pulled_history_and_offsets(
    spark: Any,
    make_broker: Callable[..., BrokerProcess],  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    """The workflow on a cluster, as a user runs it: consume through @idempotent
    (``idemp consume --strategy``), pull the history from the cluster (each record named
    by its broker), read the offsets of every broker live (``namesrv://``), reconcile."""
    namesrv = NamesrvProcess(tmp_path / "namesrv").start()
    try:
        for name in ("broker-a", "broker-b"):
            broker = make_broker(
                namesrvAddr=namesrv.namesrv_addr, embeddedNamesrv="false", brokerName=name
            )
            with RawClient(broker.broker_addr) as c:
                assert c.create_topic("orders", 2).code == 0
        ns, keys = namesrv.namesrv_addr, tmp_path / "keys.txt"
        keys.write_text("".join(f"k{i}\n" for i in range(20)))
        _idemp(
            "produce",
            "--namesrv",
            ns,
            "--topic",
            "orders",
            "--count",
            "20",
            "--keys-from",
            str(keys),
        )
        dedup = f"sqlite:///{tmp_path / 'dedup.db'}"
        where = ["--namesrv", ns, "--topic", "orders", "--group", "g1"]
        _idemp(
            "consume",
            *where,
            "--strategy",
            dedup,
            "--max",
            "20",
            "--idle-exit",
            "10",
            "--record",
            str(tmp_path / "got.jsonl"),
        )
        history = tmp_path / "history.parquet"
        _idemp(
            "history",
            "pull",
            *where,
            "--out",
            str(history),
        )
        assert Counter(pq.read_table(history).column("broker").to_pylist()) == {
            "broker-a": 10,
            "broker-b": 10,
        }
        records = tmp_path / "records.parquet"
        _idemp(
            "reconcile",
            "export-table",
            "--url",
            dedup,
            "--table",
            "idemp_dedup",
            "--out",
            str(records),
        )
        out = tmp_path / "out"
        code = main(
            [
                "--history",
                str(history),
                "--records",
                str(records),
                "--offsets",
                f"namesrv://{ns}?group=g1&topic=orders",
                "--subscription",
                "orders@g1",
                "--out",
                str(out),
                "--no-progress",
                "--no-html",
            ]
        )
    finally:
        namesrv.stop()
    counts = json.loads((out / "summary.json").read_text())["counts"]
    assert (counts["keys"], counts["ok"], counts["pending"], counts["lost"]) == (20, 20, 0, 0)
    assert code == 0


def _idemp(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "idemp", *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, (args, done.stderr)

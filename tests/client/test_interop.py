"""Interop with the official client (rocketmq-client-python 0.5.0rc2, C++ inside), both
ways, through idemp's broker: one sharding key lands on one queue whichever client
sent it (std::hash(key) % queues), and per-key order holds."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from idemp.broker.process import BrokerProcess
from idemp.client import queue_index_for_key
from tests.client.conftest import ConsumeProcess, read_jsonl, run_produce, wait_for

pytest.importorskip("rocketmq.client")

CHILD = str(Path(__file__).with_name("official_child.py"))
COUNT, KEYS = 200, 13


def _env(home: Path) -> dict[str, str]:
    home.mkdir(exist_ok=True)
    return {**os.environ, "HOME": str(home)}  # the C++ client logs under $HOME


def _check(records: list[dict[str, Any]]) -> None:
    assert sorted(r["index"] for r in records) == list(range(COUNT))
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_key[r["keys"][0]].append(r)
    for key, recs in by_key.items():
        assert {r["queue"] for r in recs} == {queue_index_for_key(key, 4)}, key
        by_offset = sorted(recs, key=lambda r: r["offset"])
        assert [r["index"] for r in by_offset] == sorted(r["index"] for r in recs), key


@pytest.mark.official
@pytest.mark.slow
def test_official_producer_to_idemp_orderly_consumer(
    broker: BrokerProcess, consumers: Callable[..., ConsumeProcess], tmp_path: Path
) -> None:
    res = subprocess.run(
        [sys.executable, CHILD, "produce", broker.namesrv_addr, "IO1", str(COUNT), str(KEYS)],
        capture_output=True, text=True, timeout=120, env=_env(tmp_path / "home"),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    c = consumers(
        "idemp", "--namesrv", broker.namesrv_addr, "--topic", "IO1", "--group", "ig",
        "--orderly", "--from", "first", "--max", str(COUNT),
    )  # fmt: skip
    assert c.wait(60) == 0, c.stderr_tail()
    records = c.records()
    _check(records)
    # consumed in queue order, message by message
    by_queue: dict[int, list[int]] = defaultdict(list)
    for r in records:
        by_queue[r["queue"]].append(r["offset"])
    assert all(offs == sorted(offs) for offs in by_queue.values())


@pytest.mark.official
@pytest.mark.slow
def test_idemp_producer_to_official_orderly_consumer(broker: BrokerProcess, tmp_path: Path) -> None:
    summary = run_produce(
        "--namesrv", broker.namesrv_addr, "--topic", "IO2", "--count", str(COUNT),
        "--sharding-key-count", str(KEYS),
    )  # fmt: skip
    assert summary["sent"] == COUNT
    out = tmp_path / "official.jsonl"
    proc = subprocess.Popen(
        [sys.executable, CHILD, "consume", broker.namesrv_addr, "IO2", "og", str(COUNT), str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(tmp_path / "home"),
    )  # fmt: skip
    try:
        wait_for(lambda: len(read_jsonl(out)) >= COUNT or proc.poll() is not None, 90,
                 "the official consumer to get every message")  # fmt: skip
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    _check(read_jsonl(out))

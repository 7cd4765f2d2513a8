"""``idemp admin``: topics and groups as mqadmin creates them, for RocketMQ 5 clients."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from idemp.broker.process import BrokerProcess
from tests.broker.conftest import make_broker  # noqa: F401 - the fixture

IDEMP = [sys.executable, "-m", "idemp", "admin"]


def _idemp(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*IDEMP, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.idemp_only("a RocketMQ 5 topic attribute, read from idemp's store")
def test_update_topic_and_group(make_broker: Callable[..., BrokerProcess], tmp_path: Path) -> None:  # noqa: F811
    broker = make_broker(store=tmp_path / "store")
    done = _idemp(
        "update-topic",
        "--broker",
        broker.broker_addr,
        "--topic",
        "Rides",
        "--type",
        "FIFO",
        "--queues",
        "4",
    )
    assert (done.returncode, done.stdout) == (0, "topic Rides: 4 queues, type FIFO\n"), done.stderr
    done = _idemp(
        "update-sub-group",
        "--broker",
        broker.broker_addr,
        "--group",
        "billing",
        "--fifo",
        "--retry-max",
        "3",
    )
    assert (done.returncode, done.stdout) == (0, "group billing: FIFO, retryMaxTimes 3\n"), (
        done.stderr
    )
    broker.stop()
    topics = json.loads((tmp_path / "store/config/topics.json").read_text())["topicConfigTable"]
    assert topics["Rides"]["attributes"] == {"message.type": "FIFO"}
    assert topics["Rides"]["readQueueNums"] == 4
    groups = json.loads((tmp_path / "store/config/subscriptionGroup.json").read_text())
    billing = groups["subscriptionGroupTable"]["billing"]
    assert (billing["consumeMessageOrderly"], billing["retryMaxTimes"]) == (True, 3)


def test_unreachable_broker_is_one_line() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    done = _idemp("update-topic", "--broker", f"127.0.0.1:{port}", "--topic", "T")
    assert done.returncode == 1
    assert done.stderr.startswith("idemp admin: ") and done.stderr.count("\n") == 1


def test_a_refused_topic_name_is_reported(make_broker: Callable[..., BrokerProcess]) -> None:  # noqa: F811
    broker = make_broker()
    done = _idemp("update-topic", "--broker", broker.broker_addr, "--topic", "bad topic!")
    assert done.returncode == 1
    assert done.stderr.startswith("idemp admin: topic bad topic!: the broker answered 1: ")

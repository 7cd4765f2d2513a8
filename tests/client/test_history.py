"""``idemp history pull`` against idemp's broker: the rows equal ``idemp broker export``'s
for the same topics, and no consumer group's stored offsets move."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from idemp.broker.process import BrokerProcess
from idemp.client import (
    ClientSettings,
    ConsumeFrom,
    ConsumerSettings,
    MessageQueue,
    OutMessage,
    Producer,
)
from idemp.history import arrow_schema
from idemp.message import ConsumeResult, Message
from idemp.remoting import RequestCode, ResponseCode
from idemp.runners import ConcurrentRunner
from idemp.tools.history_pull import DEFAULT_PULL_GROUP, HistoryPuller
from tests.client.conftest import FAST_DELAYS, wait_for

GROUP = "g-hist"
TOPICS = ["H1", "H2", f"%RETRY%{GROUP}", f"%DLQ%{GROUP}"]


def _cli(*args: str) -> str:
    res = subprocess.run(
        [sys.executable, "-m", "idemp", *args], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def _rows(path: Path) -> list[dict[str, Any]]:
    assert pq.read_schema(path) == arrow_schema()
    return sorted(pq.read_table(path).to_pylist(), key=lambda r: r["commit_log_offset"])


def _stored_offsets(puller: HistoryPuller, group: str) -> dict[str, int]:
    """QUERY_CONSUMER_OFFSET of ``group`` for every queue of H1/H2/%RETRY%."""
    out: dict[str, int] = {}
    for topic in TOPICS[:3]:
        for mq in puller.queues(topic) or []:
            resp = puller._request(
                mq,
                RequestCode.QUERY_CONSUMER_OFFSET,
                {"consumerGroup": group, "topic": mq.topic, "queueId": str(mq.queue_id)},
            )
            assert resp.code == ResponseCode.SUCCESS
            out[str(mq)] = int(resp.ext_fields["offset"])
    return out


@pytest.mark.idemp_only("idemp broker export reads idemp's store")
def test_history_pull_equals_export(
    make_broker: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    broker = make_broker(messageDelayLevel=FAST_DELAYS)
    producer = Producer(broker.namesrv_addr, "hist-producer").start()
    seen: list[Message] = []

    def listener(msg: Message) -> ConsumeResult:
        seen.append(msg)
        return ConsumeResult.RECONSUME_LATER if msg.body == b"bad" else ConsumeResult.SUCCESS

    cs = ConsumerSettings(group=GROUP, consume_from=ConsumeFrom.FIRST_OFFSET, max_reconsume_times=1)
    consumer = ConcurrentRunner(
        listener,
        settings=cs,
        client=ClientSettings(
            namesrv_addr=broker.namesrv_addr, rebalance_interval=1.0, persist_offset_interval=0.5
        ),
    )
    consumer.subscribe("H1")
    puller = HistoryPuller(broker.namesrv_addr)
    try:
        for i in range(10):
            producer.send(OutMessage("H1", f"{i} h1".encode(), tags="t", keys=[f"k{i}"]))
        producer.send(OutMessage("H1", b"z" * 5000, keys=["big"]))  # stored compressed
        producer.send(OutMessage("H1", b"bad", keys=["kb"]))
        producer.send_batch([OutMessage("H2", f"{i} h2".encode()) for i in range(3)])
        consumer.start()
        dlq = MessageQueue(f"%DLQ%{GROUP}", "broker-a", 0)
        wait_for(
            lambda: (
                puller.queues(dlq.topic)
                and puller.queue_offset(dlq, RequestCode.GET_MAX_OFFSET) == 1
            ),
            60,
            "the bad message to reach the DLQ",
        )
        wait_for(lambda: len(seen) == 13, 30, "12 messages and the retried one consumed")
    finally:
        consumer.shutdown()  # persists the group's offsets synchronously
        producer.shutdown()
    before = _stored_offsets(puller, GROUP)
    assert sum(before.values()) == 12 + 1  # H1 (12 messages) and %RETRY% (1) all consumed

    pulled = tmp_path / "pulled.parquet"
    args = ["history", "pull", "--namesrv", broker.namesrv_addr, "--group", GROUP]
    out = _cli(*args, "--topic", "H1", "--topic", "H2", "--out", str(pulled))
    assert out.strip() == f"pulled 17 messages to {pulled}"

    pulled_rows = _rows(pulled)
    mid = pulled_rows[5]["store_timestamp"]
    window = tmp_path / "window.parquet"
    _cli(
        *args,
        "--topic",
        "H1",
        "--begin-ms",
        str(mid),
        "--end-ms",
        str(mid + 1),
        "--out",
        str(window),
    )
    window_rows = _rows(window)

    assert _stored_offsets(puller, GROUP) == before
    puller.close()
    broker.stop()
    offsets_file = json.loads((broker.store / "config" / "consumerOffset.json").read_text())
    assert [k for k in offsets_file["offsetTable"] if DEFAULT_PULL_GROUP in k] == []

    exported = tmp_path / "export.parquet"
    store = str(broker.store)
    _cli("broker", "export", "--store", store, "--out", str(exported), "--broker-name", "broker-a")
    export_rows = [r for r in _rows(exported) if r["topic"] in TOPICS]
    assert {r["broker"] for r in pulled_rows} == {"broker-a"}  # a queue is the broker's
    assert pulled_rows == export_rows
    assert [(r["topic"], r["kind"]) for r in pulled_rows].count((f"%DLQ%{GROUP}", "dlq")) == 1
    assert [r["kind"] for r in pulled_rows].count("retry") == 1
    big = [r for r in pulled_rows if r["keys"] == "big"]
    assert [(r["body_size"], r["sys_flag"] & 1) for r in big] == [(5000, 1)]
    # The time window: exactly the H1/%RETRY%/%DLQ% rows stored in that millisecond.
    assert window_rows == [
        r for r in export_rows if r["topic"] != "H2" and mid <= r["store_timestamp"] < mid + 1
    ]
    assert window_rows != []


def test_the_kind_of_rocketmq5_records() -> None:
    """A message waiting in RocketMQ 5's timer is scheduled (as one in a delay level's
    queue); a recall's marker there and every other rmq_sys_ topic are the broker's own;
    a POP retry is a retry."""
    from idemp.history import kind_of
    from idemp.remoting.message import MessageExt

    def kind(topic: str, **props: str) -> str:
        return kind_of(MessageExt(topic=topic, properties=dict(props)))

    assert kind("rmq_sys_wheel_timer", REAL_TOPIC="T", TIMER_DELIVER_MS="1") == "scheduled"
    assert kind("rmq_sys_wheel_timer", TIMER_DEL_UNIQKEY="T+ID") == "system"
    assert kind("rmq_sys_REVIVE_LOG_broker-a") == "system"
    assert kind("%RETRY%G_T", RETRY_TOPIC="T", **{"1ST_POP_TIME": "1"}) == "retry"
    assert kind("T") == "message"

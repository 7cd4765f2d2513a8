"""What the official RocketMQ 5 client's SimpleConsumer sees across a restart of idemp's
broker: as on RocketMQ 5.3.3 (measured with the official Java client, SIGTERM and kill
-9, docs/broker.md), a message received before the restart and not acked comes back only
when its invisible time ends, as the next attempt, and a handle from before the restart
still acks its message, which then never comes again. (idemp only: restarting RocketMQ
is not something a test here can do.)"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from idemp.broker.process import BrokerProcess
from tests.broker.rawclient import RawClient

from .conftest import Client5

INVISIBLE_S = 8


def _after_restart(client: Client5, op: str, **kw: Any) -> dict[str, Any]:
    """The client's first calls after the restart may find its channel still
    reconnecting (UNAVAILABLE, as on RocketMQ): such a call is made again, for at most
    5 s; any other answer is the answer."""
    deadline = time.monotonic() + 5
    while True:
        answer = client.call(op, **kw)
        if answer["ok"] or "UNAVAILABLE" not in str(answer) or time.monotonic() > deadline:
            return answer
        time.sleep(0.2)  # the channel's reconnect, bounded by the deadline


@pytest.mark.parametrize("stop", ["graceful", "crash"])
def test_a_message_in_flight_keeps_its_time_and_its_handle_across_a_restart(
    make_broker: Callable[..., BrokerProcess], tmp_path: Path, stop: str
) -> None:
    broker = make_broker(minInvisibleTimeMillsForRecv=2000)
    topic, group = "TRestart5", "GRestart5"
    with RawClient(broker.broker_addr) as admin:
        assert admin.create_topic(topic, 1).code == 0
        assert admin.create_group(group).code == 0
    client = Client5(broker.grpc_addr, tmp_path / "client5.log")
    try:
        client.ok("producer", name="p", topics=[topic])
        messages = [{"topic": topic, "body": body} for body in ("acked", "kept")]
        client.ok("send", name="p", messages=messages)
        client.ok("simple", name="c", group=group, subs={topic: "*"}, **{"await": 5})
        first = client.receive_until(2, 20, INVISIBLE_S)
        assert [(m["body"], m["delivery_attempt"]) for m in first] == [("acked", 1), ("kept", 1)]
        received = first[1]["asked"]
        if stop == "graceful":
            assert broker.stop() == 0
        else:
            broker.kill()
        broker.start()
        assert _after_restart(client, "ack", name="c", ref=first[0]["ref"])["ok"]
        again = client.receive_until(1, INVISIBLE_S + 15, INVISIBLE_S)
        assert [(m["body"], m["delivery_attempt"]) for m in again] == [("kept", 2)]
        assert again[0]["at"] >= received + INVISIBLE_S
        client.ok("ack", name="c", ref=again[0]["ref"])
        assert client.ok("receive", name="c", max=16, invisible=INVISIBLE_S)["messages"] == []
    finally:
        client.close()

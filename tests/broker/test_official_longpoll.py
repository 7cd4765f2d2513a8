"""Long polling, seen through the OFFICIAL client: an idle consumer costs the broker
(almost) no CPU, and a message sent to it while idle is delivered at once."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from idemp.broker.process import BrokerProcess
from tests.broker.official_scripts import Clients, clients_fixture

pytestmark = pytest.mark.official

IDLE_S = 5.0
# CPU the broker may spend while one consumer idles for IDLE_S: its held pulls, one
# offset commit round (every 5 s) and the broker's own timers (statistics every second,
# housekeeping); measured 0.11-0.14 s on a slow day of this machine (2026-11-27), 0.05-0.08
# of it with no client at all, where every wake-up of the event loop costs about a
# millisecond. A broker answering PULL_NOT_FOUND at once instead of holding makes the
# client re-pull in a tight loop and spends whole seconds.
IDLE_CPU_BOUND_S = 0.2
# Correctness bound for the long-poll wake-up (a held pull must be answered when a
# matching message arrives, not when its 15 s suspension ends); not a performance target.
WAKE_UP_BOUND_S = 1.0


@pytest.fixture
def clients(tmp_path: Path) -> Iterator[Clients]:
    yield from clients_fixture(tmp_path)


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/<pid>/stat (fields 14 and 15)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state), so utime (14) and stime (15) are at 11 and 12.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.idemp_only("a bound on idemp's own CPU (RocketMQ's JVM spends about as much)")
def test_idle_consumer_costs_no_cpu_and_is_woken_at_once(
    broker: BrokerProcess, clients: Clients
) -> None:
    topic = "OffLongPoll"
    producer = clients.producer(broker.namesrv_addr)
    producer.send([{"ref": "first", "topic": topic, "body": "first"}])  # creates the topic
    consumer = clients.consumer(broker.namesrv_addr, "off-longpoll", topic)
    consumer.wait(lambda: len(consumer.messages) == 1, 30.0, "the first message")

    assert broker.proc is not None
    before = _cpu_seconds(broker.proc.pid)
    time.sleep(IDLE_S)  # the measurement window itself, not a synchronisation
    spent = _cpu_seconds(broker.proc.pid) - before
    assert spent < IDLE_CPU_BOUND_S, f"broker used {spent:.2f} s CPU while idle"
    assert [m["body"] for m in consumer.messages] == ["first"]

    [sent] = producer.send([{"ref": "wake", "topic": topic, "body": "wake"}])
    consumer.wait(lambda: len(consumer.messages) == 2, 30.0, "the second message")
    clients.stop_all([consumer, producer])
    latest = consumer.messages[-1]
    assert latest["body"] == "wake"
    latency = latest["t"] - sent["t0"]  # both CLOCK_MONOTONIC, system-wide
    assert 0 < latency < WAKE_UP_BOUND_S

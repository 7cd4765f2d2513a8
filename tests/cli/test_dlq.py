"""``idemp dlq``: a group's dead letters listed, and sent back to that group only."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from idemp.broker.process import BrokerProcess, NamesrvProcess
from idemp.client import (
    ClientSettings,
    ConsumeFrom,
    ConsumerSettings,
    MessageModel,
    OutMessage,
    Producer,
)
from idemp.message import ConsumeResult, Message
from idemp.runners import ConcurrentRunner
from idemp.tools.dlq import dead_letters, retry_route
from tests.broker.rawclient import RawClient
from tests.client.conftest import broker, make_broker, wait_for  # noqa: F401 - fixtures

DLQ = [sys.executable, "-m", "idemp", "dlq"]


def _dlq(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, **(env or {})}
    return subprocess.run([*DLQ, *args], capture_output=True, text=True, timeout=60, env=environ)


class Listener:
    """Dead-letters the messages whose body starts with ``bad`` while ``broken``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.broken = True
        self.got: list[Message] = []

    def __call__(self, msg: Message) -> ConsumeResult:
        with self.lock:
            self.got.append(msg)
            if self.broken and msg.body.startswith(b"bad"):
                return ConsumeResult.DEAD_LETTER
        return ConsumeResult.SUCCESS

    def bodies(self) -> list[bytes]:
        with self.lock:
            return [m.body for m in self.got]


def _runner(
    namesrv: str,
    group: str,
    listener: Listener,
    namespace: str = "",
) -> ConcurrentRunner:
    r = ConcurrentRunner(
        listener,
        settings=ConsumerSettings(group=group, consume_from=ConsumeFrom.FIRST_OFFSET),
        client=ClientSettings(namesrv_addr=namesrv, rebalance_interval=1.0, namespace=namespace),
    )
    r.subscribe("Bills")
    return r


def test_dead_letters_are_listed_and_replayed_to_their_group_only(
    broker: BrokerProcess,  # noqa: F811
) -> None:
    ns = broker.namesrv_addr
    assert _dlq("list", "--namesrv", ns, "--group", "billing").stdout == (
        "no dead letters of billing\n"
    )
    with Producer(ns, "bills") as producer:
        sent = [
            producer.send(
                OutMessage("Bills", body, tags="b", keys=[f"k{n}"], properties={"amount": str(n)})
            )
            for n, body in enumerate([b"good 0", b"bad 1", b"bad 2"])
        ]
    billing, audit = Listener(), Listener()
    audit.broken = False  # another group of the topic: it must not see the replays
    runners = [_runner(ns, "billing", billing), _runner(ns, "audit", audit)]
    for r in runners:
        r.start()
    try:
        wait_for(lambda: len(billing.got) == 3 and len(audit.got) == 3, 30, "first deliveries")
        # the runner sends a dead letter back after its listener returned
        wait_for(lambda: len(dead_letters(ns, "billing")) == 2, 30, "two dead letters", 0.2)
        listed = _dlq("list", "--namesrv", ns, "--group", "billing", "--json")
        rows = [json.loads(line) for line in listed.stdout.splitlines()]
        # in the DLQ's order; the two failed on two listener threads, so either may be first
        assert [r["offset"] for r in rows] == [0, 1]
        assert sorted(
            (r["msg_id"], r["topic"], r["keys"], r["tags"], r["body"]) for r in rows
        ) == sorted(
            [
                (sent[1].msg_id, "Bills", ["k1"], "b", "bad 1"),
                (sent[2].msg_id, "Bills", ["k2"], "b", "bad 2"),
            ]
        )

        billing.broken = False  # the cause is fixed: the operator replays one, then all
        one = _dlq("replay", "--namesrv", ns, "--group", "billing", "--msg-id", sent[2].msg_id)
        assert one.returncode == 0 and one.stdout.startswith(
            f"replayed {sent[2].msg_id} (Bills) to %RETRY%billing at offset "
        ), one.stderr
        wait_for(lambda: len(billing.got) == 4, 30, "the replayed message")
        again = billing.got[3]
        assert (again.topic, again.msg_id, again.keys, again.tags, again.body) == (
            "Bills",
            sent[2].msg_id,
            ("k2",),
            "b",
            b"bad 2",
        )
        assert (again.properties["amount"], again.reconsume_times) == ("2", 0)

        rest = _dlq("replay", "--namesrv", ns, "--group", "billing", "--from-offset", "0")
        assert rest.returncode == 0 and len(rest.stdout.splitlines()) == 2, rest.stderr
        wait_for(lambda: len(billing.got) == 6, 30, "both dead letters again")
        assert sorted(billing.bodies()[4:]) == [b"bad 1", b"bad 2"]

        missing = _dlq("replay", "--namesrv", ns, "--group", "billing", "--msg-id", "NOSUCH")
        assert (missing.returncode, missing.stdout) == (1, "")
        assert missing.stderr == "idemp dlq: not in %DLQ%billing: NOSUCH; nothing sent\n"
    finally:
        for r in runners:
            r.shutdown()
    assert len(audit.got) == 3  # the replays went to billing's retry topic only
    # the dead letters stay where they were
    assert (
        len(_dlq("list", "--namesrv", ns, "--group", "billing", "--json").stdout.splitlines()) == 2
    )


def test_replay_needs_a_choice() -> None:
    done = _dlq("replay", "--namesrv", "127.0.0.1:1", "--group", "g")
    assert done.returncode == 2
    assert "one of the arguments --msg-id --from-offset --all is required" in done.stderr


def test_the_retry_topic_a_replay_goes_to() -> None:
    """4.x groups read %RETRY%<group>; RocketMQ 5 (POP) groups their POP retry topic,
    which their dead letters name (V1 and V2 forms), or, as idemp's broker wrote them
    before 2026-11-27, a popped dead letter naming its original topic."""
    from idemp.remoting import MessageExt

    def route(**props: str) -> tuple[str, str]:
        return retry_route(MessageExt("%DLQ%g", properties=props), "g")

    assert route(RETRY_TOPIC="Bills") == ("%RETRY%g", "Bills")
    assert route(RETRY_TOPIC="%RETRY%g_Bills") == ("%RETRY%g_Bills", "Bills")
    assert route(RETRY_TOPIC="%RETRY%g+Bills") == ("%RETRY%g+Bills", "Bills")
    assert route(RETRY_TOPIC="Bills", **{"1ST_POP_TIME": "1"}) == ("%RETRY%g_Bills", "Bills")
    assert route() == ("%RETRY%g", "%DLQ%g")  # sent to the DLQ by hand: no better name


def test_a_namespaced_groups_dead_letters(broker: BrokerProcess) -> None:  # noqa: F811
    """With the consumers' namespace (IDEMP_NAMESPACE) the tool takes the group's plain
    name: its dead letters are in %DLQ%ns1%billing, its retry topic %RETRY%ns1%billing."""
    ns, spaced = broker.namesrv_addr, {"IDEMP_NAMESPACE": "ns1"}
    client = ClientSettings(namesrv_addr=ns, namespace="ns1")
    with Producer(client=client) as producer:
        sent = producer.send(OutMessage("Bills", b"bad 1", keys=["k1"]))
    billing = Listener()
    runner = _runner(broker.namesrv_addr, "billing", billing, namespace="ns1")
    runner.start()
    try:
        wait_for(lambda: len(dead_letters(ns, "ns1%billing")) == 1, 30, "the dead letter", 0.2)
        listed = _dlq("list", "--namesrv", ns, "--group", "billing", "--json", env=spaced)
        (row,) = [json.loads(line) for line in listed.stdout.splitlines()]
        assert (row["msg_id"], row["topic"]) == (sent.msg_id, "ns1%Bills")
        billing.broken = False
        replayed = _dlq("replay", "--namesrv", ns, "--group", "billing", "--all", env=spaced)
        assert replayed.stdout.startswith(
            f"replayed {sent.msg_id} (ns1%Bills) to %RETRY%ns1%billing at offset "
        ), replayed.stderr
        wait_for(lambda: len(billing.got) == 2, 30, "the replayed message")
    finally:
        runner.shutdown()
    assert [(m.topic, m.msg_id, m.reconsume_times) for m in billing.got] == [
        ("Bills", sent.msg_id, 0),
        ("Bills", sent.msg_id, 0),
    ]


def test_a_broadcasting_groups_dead_letter_is_replayed_to_its_topic(
    broker: BrokerProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A broadcasting group does not read %RETRY%<group>: replaying there is refused while
    its consumers are online, and ``--to`` sends the dead letter to its topic again."""
    ns = broker.namesrv_addr
    listener = Listener()
    runner = ConcurrentRunner(
        listener,
        settings=ConsumerSettings(
            group="prices",
            consume_from=ConsumeFrom.FIRST_OFFSET,
            message_model=MessageModel.BROADCASTING,
            offset_store_dir=str(tmp_path / "offsets"),
        ),
        client=ClientSettings(namesrv_addr=ns, rebalance_interval=1.0),
    )
    runner.subscribe("Quotes")
    with Producer(ns, "quotes") as producer:
        producer.send(OutMessage("Quotes", b"bad 1", keys=["q1"]))
    runner.start()
    try:
        wait_for(lambda: len(dead_letters(ns, "prices")) == 1, 30, "the dead letter", 0.2)
        listener.broken = False
        refused = _dlq("replay", "--namesrv", ns, "--group", "prices", "--all")
        assert (refused.returncode, refused.stdout) == (2, "")
        assert refused.stderr.startswith(
            "idemp dlq: prices consumes by broadcasting: its consumers do not read "
            "%RETRY%prices; replay with --to <topic>"
        )
        sent = _dlq("replay", "--namesrv", ns, "--group", "prices", "--all", "--to", "Quotes")
        assert sent.returncode == 0, sent.stderr
        # to any queue of the topic: offset 1 behind the dead one's original, else 0
        assert re.fullmatch(r"replayed \S+ \(Quotes\) to Quotes at offset [01]\n", sent.stdout)
        wait_for(lambda: listener.bodies() == [b"bad 1", b"bad 1"], 30, "the replayed quote")
    finally:
        runner.shutdown()


def test_on_a_cluster_each_broker_keeps_its_own_dead_letters(
    make_broker: Callable[..., BrokerProcess],  # noqa: F811
    tmp_path: Path,
) -> None:
    """A message's dead letter is written by the broker that held it, in a DLQ queue of
    that broker's: two brokers, two letters each at offsets 0 and 1. ``list`` names the
    broker; ``--from-offset`` alone is refused (offset 1 is two letters), and with
    ``--broker`` it replays that broker's letters only."""
    with NamesrvProcess(tmp_path / "namesrv") as ns_proc:
        ns = ns_proc.namesrv_addr
        for name in ("broker-a", "broker-b"):
            b = make_broker(namesrvAddr=ns, embeddedNamesrv="false", brokerName=name)
            with RawClient(b.broker_addr) as admin:
                assert admin.create_topic("Bills", 2).code == 0
        with Producer(ns, "bills") as producer:
            sent = [producer.send(OutMessage("Bills", f"bad {n}".encode())) for n in range(4)]
        assert sorted(r.queue.broker_name for r in sent) == ["broker-a"] * 2 + ["broker-b"] * 2
        runner = _runner(ns, "billing", Listener())
        runner.start()
        try:
            wait_for(lambda: len(dead_letters(ns, "billing")) == 4, 30, "four dead letters", 0.2)
        finally:
            runner.shutdown()
        listed = _dlq("list", "--namesrv", ns, "--group", "billing", "--json")
        rows = [json.loads(line) for line in listed.stdout.splitlines()]
        assert sorted((r["broker"], r["offset"]) for r in rows) == [
            ("broker-a", 0),
            ("broker-a", 1),
            ("broker-b", 0),
            ("broker-b", 1),
        ]
        by_id = {r["msg_id"]: r["broker"] for r in rows}
        assert by_id == {r.msg_id: r.queue.broker_name for r in sent}

        refused = _dlq("replay", "--namesrv", ns, "--group", "billing", "--from-offset", "1")
        assert (refused.returncode, refused.stdout) == (2, "")
        assert refused.stderr == (
            "idemp dlq: the dead letters of billing are on broker-a, broker-b, each broker "
            "with offsets of its own: give --broker NAME with --from-offset; nothing sent\n"
        )
        one = _dlq(
            "replay", "--namesrv", ns, "--group", "billing", "--from-offset", "1",
            "--broker", "broker-b",
        )  # fmt: skip
        assert one.returncode == 0, one.stderr
        [line] = one.stdout.splitlines()
        [b_at_1] = [r["msg_id"] for r in rows if (r["broker"], r["offset"]) == ("broker-b", 1)]
        assert line.startswith(f"replayed {b_at_1} (Bills) to %RETRY%billing at offset ")
        only_a = _dlq("list", "--namesrv", ns, "--group", "billing", "--broker", "broker-a")
        assert only_a.stdout.startswith("2 dead letters of billing on broker-a (%DLQ%billing)")
        assert only_a.stdout.count("\n  broker-a offset ") == 2

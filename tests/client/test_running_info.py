"""What RocketMQ's admin tools ask an online consumer through the broker, answered by
idemp's client. mqadmin consumerStatus (and the dashboard) parse the running info as
Java's ConsumerRunningInfo, whose queue table is a map keyed by MessageQueue objects (a
list there made their parser fail); queryMsgById -d has a message consumed directly.
Checked against mqadmin 4.9.7 by hand; here the answers' shapes, exactly."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from idemp import idempotent
from idemp.broker.process import BrokerProcess
from idemp.client import ClientSettings, ConsumeFrom, ConsumerSettings, OutMessage, Producer
from idemp.message import Message
from idemp.remoting import RemotingCommand, RequestCode, ResponseCode
from idemp.remoting.jsonlenient import ObjectKeyMap, loads_fastjson
from idemp.runners import ConcurrentRunner, OrderlyRunner
from idemp.strategies import UniqueKeyTable
from tests.broker.rawclient import RawClient
from tests.client.conftest import wait_for


def test_running_info_is_javas_consumer_running_info(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    broker = make_broker()
    seen: list[bytes] = []  # list.append is atomic: the consume threads need no lock
    producer = Producer(broker.namesrv_addr, "info-p").start()
    for i in range(4):
        producer.send(OutMessage("InfoT", f"m{i}".encode(), tags="TagA"))
    producer.shutdown()
    runner = OrderlyRunner(
        lambda msg: seen.append(msg.body),
        settings=ConsumerSettings(
            group="info-g", consume_from=ConsumeFrom.FIRST_OFFSET, consume_thread_count=3
        ),
        client=ClientSettings(namesrv_addr=broker.namesrv_addr),
    )
    runner.subscribe("InfoT", "TagA || TagB")
    before = int(time.time() * 1000)
    runner.start()
    try:
        wait_for(lambda: len(seen) == 4, 30, "the four messages")
        with RawClient(broker.broker_addr) as admin:
            ids = admin.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "info-g"})
            (client_id,) = json.loads(ids.body)["consumerIdList"]
            asked = {"consumerGroup": "info-g", "clientId": client_id, "jstackEnable": "true"}
            answers = []

            def settled() -> bool:
                # a batch's offset is taken in memory just after its listener returns
                answers.append(admin.request(RequestCode.GET_CONSUMER_RUNNING_INFO, asked))
                assert answers[-1].code == ResponseCode.SUCCESS, answers[-1].remark
                table = loads_fastjson(answers[-1].body)["mqTable"]
                return sum(v["commitOffset"] for k, v in table if k["topic"] == "InfoT") == 4

            wait_for(settled, 30, "the four offsets in the consumer's memory")
    finally:
        runner.shutdown()
    info = loads_fastjson(answers[-1].body)
    props = info["properties"]
    assert {k: props[k] for k in ("PROP_CONSUME_TYPE", "PROP_CONSUMEORDERLY")} == {
        "PROP_CONSUME_TYPE": "CONSUME_PASSIVELY",
        "PROP_CONSUMEORDERLY": "true",
    }
    assert (props["PROP_THREADPOOL_CORE_SIZE"], props["PROP_CLIENT_VERSION"]) == ("3", "V4_9_7")
    assert props["PROP_NAMESERVER_ADDR"] == broker.namesrv_addr
    assert before <= int(props["PROP_CONSUMER_START_TIMESTAMP"]) <= int(time.time() * 1000)
    assert (props["consumerGroup"], props["consumeFromWhere"]) == (
        "info-g",
        "CONSUME_FROM_FIRST_OFFSET",
    )
    subs = {s["topic"]: s["subString"] for s in info["subscriptionSet"]}
    assert subs == {"InfoT": "TagA || TagB", "%RETRY%info-g": "*"}
    table = info["mqTable"]
    assert isinstance(table, ObjectKeyMap)  # keys are MessageQueue objects, as fastjson's
    queues = {(k["topic"], k["queueId"]): v for k, v in table}
    assert sorted(q for q in queues if q[0] == "InfoT") == [("InfoT", q) for q in range(4)]
    assert [queues[("InfoT", q)]["cachedMsgCount"] for q in range(4)] == [0, 0, 0, 0]
    # an orderly consumer locks each queue at the broker before it pulls from it
    assert all(queues[("InfoT", q)]["locked"] for q in range(4))
    assert not any(v["droped"] for v in queues.values())
    assert all(v["lastPullTimestamp"] >= before for v in queues.values())
    assert info["statusTable"] == {}
    assert "MainThread" in info["jstack"]  # the Python threads' stacks, for jstackEnable


def test_a_message_consumed_directly_runs_the_listener_once_more_deduplicated(
    make_broker: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    """mqadmin queryMsgById -g G -d CLIENT (RocketMQ's dashboard: "resend message"): the
    broker sends the stored message to the client, which runs the listener on it and says
    how it went. A decorated listener takes it as any other delivery: a duplicate."""
    broker = make_broker()
    effects: list[str] = []

    @idempotent(key="keys", strategy=UniqueKeyTable(f"sqlite:///{tmp_path}/d.db"), name="direct")
    def listener(msg: Message) -> None:
        if msg.body == b"boom":
            raise ValueError("the handler failed")
        effects.append(msg.body.decode())

    producer = Producer(broker.namesrv_addr, "direct-p").start()
    sent = {
        body: producer.send(OutMessage("DirectT", body.encode(), keys=[f"k-{body}"]))
        for body in ("once", "boom")
    }
    producer.shutdown()
    runner = ConcurrentRunner(
        listener,
        settings=ConsumerSettings(
            group="direct-g", consume_from=ConsumeFrom.FIRST_OFFSET, max_reconsume_times=0
        ),
        client=ClientSettings(namesrv_addr=broker.namesrv_addr),
    )
    runner.subscribe("DirectT")
    runner.start()
    try:
        wait_for(lambda: effects == ["once"], 30, "the first delivery's effect")
        with RawClient(broker.broker_addr) as admin:
            # "boom" failed its one delivery and the runner sent it back (to the DLQ, no
            # retries): its claim is released, so the direct run below meets none
            wait_for(
                lambda: (
                    admin.request(
                        RequestCode.GET_MAX_OFFSET, {"topic": "%DLQ%direct-g", "queueId": 0}
                    ).ext_fields.get("offset")
                    == "1"
                ),
                30,
                "the failing message dead-lettered",
            )
            ids = admin.request(
                RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "direct-g"}
            )
            (client_id,) = json.loads(ids.body)["consumerIdList"]

            def direct(body: str, group: str = "direct-g") -> RemotingCommand:
                fields = {
                    "consumerGroup": group,
                    "clientId": client_id,
                    "msgId": sent[body].offset_msg_id,
                }
                return admin.request(RequestCode.CONSUME_MESSAGE_DIRECTLY, fields)

            again, failing, nobody = direct("once"), direct("boom"), direct("once", "no-g")
    finally:
        runner.shutdown()
    assert again.code == ResponseCode.SUCCESS, again.remark
    result = json.loads(again.body)
    assert {k: result[k] for k in ("order", "autoCommit", "consumeResult", "remark")} == {
        "order": False,
        "autoCommit": True,
        "consumeResult": "CR_SUCCESS",
        "remark": "DUPLICATE",  # acked without a second effect
    }
    assert effects == ["once"]
    failed = json.loads(failing.body)
    assert (failed["consumeResult"], failed["remark"]) == (
        "CR_LATER",
        "FAILED: ValueError: the handler failed",
    )
    # a group the client is not in: the broker answers before asking it, as RocketMQ's
    assert (nobody.code, nobody.remark) == (
        ResponseCode.SYSTEM_ERROR,
        f"The Consumer <no-g> <{client_id}> not online",
    )


def test_consumed_directly_by_a_plain_listener_that_raises_or_declines() -> None:
    """Without a decorator the runner reports what the listener did, in RocketMQ's
    CMResult names (pure mapping: no broker)."""
    msg = Message(topic="T", body=b"x", msg_id="M1")

    def run(listener: Callable[[Message], object]) -> tuple[str, str | None]:
        runner = ConcurrentRunner(listener, group="plain-g")
        runner.executor = ThreadPoolExecutor(1)
        try:
            return asyncio.run(runner.consume_directly(msg))
        finally:
            runner.executor.shutdown()

    def raises(m: Message) -> None:
        raise RuntimeError("no")

    assert run(lambda m: None) == ("CR_SUCCESS", None)
    assert run(lambda m: False) == ("CR_LATER", "RECONSUME_LATER")
    assert run(raises) == ("CR_THROW_EXCEPTION", "RuntimeError: no")

"""mqadmin consumerStatus (and RocketMQ's dashboard) ask an online consumer for its
running info through the broker; Java's tools parse the answer as ConsumerRunningInfo,
whose queue table is a map keyed by MessageQueue objects (a list there made their parser
fail). Checked against mqadmin 4.9.7 by hand; here the answer's shape, exactly."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

from idemp.broker.process import BrokerProcess
from idemp.client import ClientSettings, ConsumeFrom, ConsumerSettings, OutMessage, Producer
from idemp.message import Message
from idemp.remoting import RequestCode, ResponseCode
from idemp.remoting.jsonlenient import ObjectKeyMap, loads_fastjson
from idemp.runners import OrderlyRunner
from tests.broker.rawclient import RawClient
from tests.client.conftest import wait_for


def test_running_info_is_javas_consumer_running_info(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    broker = make_broker()
    seen: list[bytes] = []
    lock = threading.Lock()

    def listener(msg: Message) -> None:
        with lock:
            seen.append(msg.body)

    producer = Producer(broker.namesrv_addr, "info-p").start()
    for i in range(4):
        producer.send(OutMessage("InfoT", f"m{i}".encode(), tags="TagA"))
    producer.shutdown()
    runner = OrderlyRunner(
        listener,
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

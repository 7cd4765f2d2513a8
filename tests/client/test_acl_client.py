"""idemp's client against a broker with RocketMQ's plain ACL on (``aclEnable=true``): every
request signed as the Java client's AclClientRPCHook signs it, and a refusal of the
consumer's credentials or permissions raised at its start."""

from __future__ import annotations

import base64
import hashlib
import hmac
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from idemp import App
from idemp.broker.process import BrokerProcess
from idemp.client import (
    ClientSettings,
    ConsumeFrom,
    ConsumerSettings,
    OutMessage,
    Producer,
    ProducerSettings,
    SendStatus,
)
from idemp.client.instance import ClientInstance
from idemp.client.transport import ResponseError
from idemp.message import ConsumeResult, Message
from idemp.remoting import RemotingCommand
from idemp.remoting.acl import sign, signature
from idemp.runners import ConcurrentRunner, OrderlyRunner
from idemp.tools import admin
from tests.client.conftest import FAST_DELAYS, wait_for

SECRET = "acl-client-secret"
ACL_YML = f"""
accounts:
  - accessKey: billingAK
    secretKey: {SECRET}
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - Orders=PUB|SUB
      - Audit=SUB
    groupPerms:
      - billing=SUB
      - billing-orderly=SUB
  - accessKey: operatorAK
    secretKey: {SECRET}-ops
    admin: true
"""
FAST: dict[str, Any] = dict(rebalance_interval=1.0, persist_offset_interval=0.5)


@pytest.fixture
def acl_broker(make_broker: Callable[..., BrokerProcess], tmp_path: Path) -> BrokerProcess:
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL_YML, encoding="utf-8")
    return make_broker(
        aclEnable="true",
        aclPlainFile=str(path),
        autoCreateTopicEnable="false",
        messageDelayLevel=FAST_DELAYS,
    )


def client(
    broker: BrokerProcess, ak: str = "billingAK", sk: str = SECRET, **kw: object
) -> ClientSettings:
    return ClientSettings(
        namesrv_addr=broker.namesrv_addr,
        access_key=ak,
        secret_key=sk,
        **FAST,
        **kw,  # type: ignore[arg-type]
    )


def test_the_signature_is_the_java_hooks() -> None:
    """AclClientRPCHook signs the header fields' wire values (AccessKey and SecurityToken
    among them, sorted by name), then the body; the value was computed with RocketMQ
    4.9.7's AclUtils for these fields."""
    fields: dict[str, Any] = {"topic": "Orders", "queueId": 3, "flag": True}  # as Java's
    cmd = RemotingCommand(code=10, ext_fields=fields)
    cmd.body = b"hello"
    sign(cmd, "billingAK", SECRET, "tok")
    assert cmd.ext_fields["AccessKey"] == "billingAK"
    assert cmd.ext_fields["SecurityToken"] == "tok"
    content = b"billingAK" + b"tok" + b"true" + b"3" + b"Orders" + b"hello"  # sorted by key
    expected = base64.b64encode(hmac.new(SECRET.encode(), content, hashlib.sha1).digest())
    assert cmd.ext_fields["Signature"] == expected.decode()
    again = cmd.ext_fields["Signature"]
    sign(cmd, "billingAK", SECRET, "tok")  # a retried request signs the same
    assert cmd.ext_fields["Signature"] == again == signature(cmd, SECRET)


def test_settings_refuse_half_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="access_key is set but secret_key is not"):
        ClientSettings(namesrv_addr="x:1", access_key="billingAK")
    with pytest.raises(ValueError, match="secret_key is set but access_key is not"):
        ClientSettings(namesrv_addr="x:1", secret_key="s")
    with pytest.raises(ValueError, match="security_token is set without an access_key"):
        ClientSettings(namesrv_addr="x:1", security_token="t")
    monkeypatch.setenv("IDEMP_ACCESS_KEY", "envAK")
    monkeypatch.setenv("IDEMP_SECRET_KEY", "env-secret")
    settings = ClientSettings(namesrv_addr="x:1")
    assert (settings.access_key, settings.secret_key) == ("envAK", "env-secret")
    assert "env-secret" not in repr(settings) and "envAK" in repr(settings)


def test_producer_and_runners_work_signed(acl_broker: BrokerProcess) -> None:
    """With ACL on, the admin account creates the topic, the app account sends, consumes
    concurrently and orderly, and a failed message comes back through %RETRY%."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("IDEMP_ACCESS_KEY", "operatorAK")
        env.setenv("IDEMP_SECRET_KEY", f"{SECRET}-ops")
        admin.update_topic(acl_broker.broker_addr, "Orders", queues=4)
    with pytest.raises(RuntimeError, match="No accessKey is configured"):
        admin.update_topic(acl_broker.broker_addr, "Other", queues=4)  # unsigned
    with pytest.MonkeyPatch.context() as env:
        env.setenv("IDEMP_ACCESS_KEY", "billingAK")
        env.setenv("IDEMP_SECRET_KEY", SECRET)
        with pytest.raises(RuntimeError, match="Need admin permission for request code=17"):
            admin.update_topic(acl_broker.broker_addr, "Other", queues=4)

    producer = Producer(
        settings=ProducerSettings(group="billing-producer"), client=client(acl_broker)
    ).start()
    try:
        sent = [
            producer.send(OutMessage("Orders", f"o{i}".encode(), keys=[f"k{i}"])) for i in range(8)
        ]
        assert {s.status for s in sent} == {SendStatus.SEND_OK}
    finally:
        producer.shutdown()

    lock = threading.Lock()
    got: list[str] = []
    failed_once: set[str] = set()

    def listener(msg: Message) -> ConsumeResult:
        body = msg.body.decode()
        with lock:
            got.append(body)
            if body == "o5" and body not in failed_once:
                failed_once.add(body)
                return ConsumeResult.RECONSUME_LATER
        return ConsumeResult.SUCCESS

    settings = ConsumerSettings(group="billing", consume_from=ConsumeFrom.FIRST_OFFSET)
    runner = ConcurrentRunner(listener, settings=settings, client=client(acl_broker))
    runner.subscribe("Orders")
    runner.start()
    try:
        wait_for(lambda: got.count("o5") == 2 and len(got) == 9, 30, "8 messages and a retry")
    finally:
        runner.shutdown()
    assert sorted(got) == sorted([f"o{i}" for i in range(8)] + ["o5"])

    ordered: list[str] = []

    def in_order(m: Message) -> ConsumeResult:
        ordered.append(m.body.decode())
        return ConsumeResult.SUCCESS

    orderly = OrderlyRunner(
        in_order,
        settings=ConsumerSettings(group="billing-orderly", consume_from=ConsumeFrom.FIRST_OFFSET),
        client=client(acl_broker, instance_name="orderly"),
    )
    orderly.subscribe("Orders")
    orderly.start()
    try:
        wait_for(lambda: len(ordered) == 8, 30, "8 messages in order")
    finally:
        orderly.shutdown()
    assert sorted(ordered) == [f"o{i}" for i in range(8)]
    if isinstance(acl_broker, BrokerProcess):  # RocketMQ logs its ACL file, secrets and all
        assert SECRET not in acl_broker.log_path.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("ak", "sk", "group", "topic", "refusal"),
    [
        (
            "billingAK",
            "wrong",
            "billing",
            "Orders",
            "Check signature failed for accessKey=billingAK",
        ),
        ("nobodyAK", SECRET, "billing", "Orders", "No acl config for nobodyAK"),
        ("billingAK", SECRET, "intruders", "Orders", "No default permission for group:intruders"),
    ],
)
def test_a_refused_consumer_fails_at_start(
    acl_broker: BrokerProcess, ak: str, sk: str, group: str, topic: str, refusal: str
) -> None:
    """Wrong credentials or a group without permission: start() raises the broker's
    refusal, not a warning before every pull fails, and leaves nothing running."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("IDEMP_ACCESS_KEY", "operatorAK")
        env.setenv("IDEMP_SECRET_KEY", f"{SECRET}-ops")
        admin.update_topic(acl_broker.broker_addr, topic, queues=4)
    settings = ConsumerSettings(group=group, consume_from=ConsumeFrom.FIRST_OFFSET)
    runner = ConcurrentRunner(
        lambda m: ConsumeResult.SUCCESS, settings=settings, client=client(acl_broker, ak, sk)
    )
    runner.subscribe(topic)
    with pytest.raises(ResponseError, match=refusal) as refused:
        runner.start()
    assert f"the broker at {acl_broker.broker_addr} refused this client" in str(refused.value)
    assert not [k for k in ClientInstance._registry if k.endswith(acl_broker.namesrv_addr)]
    runner.shutdown()


def test_one_client_id_has_one_set_of_credentials(acl_broker: BrokerProcess) -> None:
    first = Producer(settings=ProducerSettings(group="p1"), client=client(acl_broker)).start()
    try:
        with pytest.raises(ValueError, match="already runs in this process with other ACL or TLS"):
            Producer(
                settings=ProducerSettings(group="p2"), client=client(acl_broker, "operatorAK", "x")
            ).start()
        other = Producer(
            settings=ProducerSettings(group="p3"),
            client=client(acl_broker, "operatorAK", f"{SECRET}-ops", instance_name="ops"),
        ).start()
        other.shutdown()
    finally:
        first.shutdown()


def test_an_app_signs_with_the_account_of_its_settings(
    acl_broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``IDEMP_ACCESS_KEY``/``IDEMP_SECRET_KEY`` (or the settings file) are the account of
    an App's listeners, as for ``idemp worker``; a wrong secret stops ``start()``."""
    monkeypatch.setenv("IDEMP_ACCESS_KEY", "operatorAK")
    monkeypatch.setenv("IDEMP_SECRET_KEY", f"{SECRET}-ops")
    admin.update_topic(acl_broker.broker_addr, "Orders", queues=4)
    monkeypatch.setenv("IDEMP_ACCESS_KEY", "billingAK")
    monkeypatch.setenv("IDEMP_SECRET_KEY", SECRET)
    producer = Producer(acl_broker.namesrv_addr, "billing-producer").start()
    for i in range(4):
        producer.send(OutMessage("Orders", f"a{i}".encode(), keys=[f"a{i}"]))
        producer.send(OutMessage("Orders", f"a{i}".encode(), keys=[f"a{i}"]))  # a retry
    producer.shutdown()

    applied: list[str] = []
    app = App("billing-app", namesrv_addr=acl_broker.namesrv_addr)
    backend = f"sqlite:///{tmp_path / 'dedup.db'}"

    @app.listener(
        "Orders", group="billing", strategy=backend, consume_from=ConsumeFrom.FIRST_OFFSET
    )
    def on_order(message: Message) -> None:
        applied.append(message.body.decode())

    app.start()
    try:
        wait_for(lambda: len(applied) == 4, 30, "4 effects")
    finally:
        app.stop()
    assert sorted(applied) == [f"a{i}" for i in range(4)]  # each once

    monkeypatch.setenv("IDEMP_SECRET_KEY", "not-the-secret")
    wrong = App("billing-app", namesrv_addr=acl_broker.namesrv_addr)
    wrong.listener("Orders", group="billing", strategy=backend)(on_order)
    with pytest.raises(ResponseError, match="Check signature failed for accessKey=billingAK"):
        wrong.start()
    wrong.stop()

"""A full disk seen by the official 5.x client (``idemp/broker/diskguard.py``): a send is
refused with the proxy's INTERNAL_SERVER_ERROR and the broker's remark (RocketMQ 5.3.3
measured the same way with its ratio at 35 % on a disk 38 % used), reads go on, and the
same producer sends again once the disk allows."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.broker.rawclient import RawClient
from tests.broker.test_disk_full import REFUSAL, _set_ratio

from .conftest import Client5, Endpoint5

PROXY = "org.apache.rocketmq.proxy.common.ProxyException: "


def test_a_full_disk_refuses_a_5x_send_and_recovers(
    broker5: Endpoint5,
    admin: RawClient,
    client5: Callable[[], Client5],
    names: Callable[[str], str],
) -> None:
    if broker5.real:  # RocketMQ 5.3 raises a ratio under 35 to 35; a test cannot fill the disk
        pytest.skip("needs a disk over 35 % used to refuse on RocketMQ")
    topic, group = names("DF"), names("G")
    assert admin.create_topic(topic, 1, attributes="+message.type=NORMAL").code == 0
    client = client5()
    client.ok("producer", name="p", topics=[topic])
    client.ok("simple", name="c", group=group, subs={topic: "*"}, **{"await": 5})
    client.ok("send", name="p", messages=[{"topic": topic, "body": "accepted"}])
    _set_ratio(admin, 0)
    refused = client.call("send", name="p", messages=[{"topic": topic, "body": "refused"}])
    assert (refused["ok"], refused["error"], refused["code"]) == (
        False,
        "InternalErrorException",
        50001,
    )
    code, _, message = refused["message"].partition(", ")
    assert code == "50001" and message.startswith(PROXY), refused["message"]
    assert REFUSAL.fullmatch(message[len(PROXY) :]), message
    _set_ratio(admin, 90)
    client.ok("send", name="p", messages=[{"topic": topic, "body": "later"}])
    got = client.receive_until(2, 30, invisible=broker5.invisible_s)
    assert sorted(m["body"] for m in got) == ["accepted", "later"]

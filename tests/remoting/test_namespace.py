"""How RocketMQ 5's proxy splits a 4.x client's namespaced names (NamespaceUtil)."""

from __future__ import annotations

import pytest

from idemp.remoting.codes import split_namespace, strip_namespace, wrap_namespace


@pytest.mark.parametrize(
    ("stored", "split"),
    [
        ("ns1%Orders", ("ns1", "Orders")),
        ("%RETRY%ns1%billing", ("ns1", "%RETRY%billing")),
        ("%DLQ%ns1%billing", ("ns1", "%DLQ%billing")),
        ("a%b%c", ("a", "b%c")),  # the first separator ends the namespace
        ("Orders", ("", "Orders")),
        ("%RETRY%billing", ("", "%RETRY%billing")),
        ("%Orders", ("", "%Orders")),  # nothing before the separator: no namespace
        ("", ("", "")),
        # the broker's own topics and groups never carry one
        ("rmq_sys_x%y", ("", "rmq_sys_x%y")),
        ("CID_RMQ_SYS_x%y", ("", "CID_RMQ_SYS_x%y")),
        ("SCHEDULE_TOPIC_XXXX", ("", "SCHEDULE_TOPIC_XXXX")),
    ],
)
def test_split_namespace(stored: str, split: tuple[str, str]) -> None:
    assert split_namespace(stored) == split


@pytest.mark.parametrize(
    ("name", "wire"),
    [
        ("Orders", "ns1%Orders"),
        ("%RETRY%billing", "%RETRY%ns1%billing"),
        ("%DLQ%billing", "%DLQ%ns1%billing"),
        ("ns1%Orders", "ns1%Orders"),  # already in it
        ("RMQ_SYS_TRACE_TOPIC", "RMQ_SYS_TRACE_TOPIC"),  # the broker's own
        ("TBW102", "TBW102"),
    ],
)
def test_wrap_and_strip_the_clients_namespace(name: str, wire: str) -> None:
    assert wrap_namespace("ns1", name) == wire
    assert wrap_namespace("", name) == name
    plain = name if name != "ns1%Orders" else "Orders"
    assert strip_namespace("ns1", wire) == plain
    assert strip_namespace("ns2", wire) == wire  # another namespace's name stays whole

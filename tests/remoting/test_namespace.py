"""How RocketMQ 5's proxy splits a 4.x client's namespaced names (NamespaceUtil)."""

from __future__ import annotations

import pytest

from idemp.remoting.codes import split_namespace


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

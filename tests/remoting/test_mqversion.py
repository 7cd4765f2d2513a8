"""MQVersion.Version rebuilt: the ordinals RocketMQ 4.9.7's enum gives its names."""

from __future__ import annotations

from idemp.remoting.mqversion import names, ordinal, version_desc


def test_ordinals_of_the_names_clients_and_brokers_use() -> None:
    assert [
        ordinal(name)
        for name in ("V3_0_0_FINAL", "V3_0_7_SNAPSHOT", "V3_1_8_SNAPSHOT", "V3_4_9", "V4_9_7")
    ] == [15, 28, 62, 121, 407]
    assert (len(names()), names()[-1]) == (613, "HIGHER_VERSION")


def test_a_version_past_the_enum_is_its_last_name() -> None:
    assert [version_desc(v) for v in (63, 401, 612, 613, 10_000)] == [
        "V3_1_8",
        "V4_9_4",
        "HIGHER_VERSION",
        "HIGHER_VERSION",
        "HIGHER_VERSION",
    ]

"""Business keys, namespaces, missing-key policies, fingerprints; settings and masking."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from idemp import Message, Outcome, idempotent
from idemp.config import IdempSettings, mask_url
from idemp.keys import (
    Missing,
    MissingKeyError,
    Namespace,
    describe,
    extractor,
    fingerprint_of,
)
from idemp.strategies import RedisFlag, UniqueKeyTable


class Order(BaseModel):
    order_id: int
    amount: float


BODY = b'{"order": {"id": 42, "items": [{"sku": "A-1"}]}, "order_id": 7, "amount": 1.5}'
M = Message("Orders", BODY, keys=("k1", "k2"), properties={"orderId": "p-9"}, consumer_group="g")


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("keys", "k1"),
        ("property:orderId", "p-9"),
        ("json:order.id", "42"),
        ("$.order.items[0].sku", "A-1"),
        ((Order, "order_id"), "7"),
        (lambda m: m.keys[1], "k2"),
    ],
)
def test_extractors(spec: Any, expected: str) -> None:
    assert extractor(spec).extract(M) == expected


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("property:nope", "no property 'nope'"),
        ("json:order.missing", "no 'order.missing'"),
        ("json:order", "not a scalar"),
        ((Order, "amount"), None),
    ],
)
def test_missing_keys_say_why(spec: Any, reason: str | None) -> None:
    found = extractor(spec).extract(Message("T", b'{"order": {"id": 1}}'))
    assert isinstance(found, Missing)
    if reason is not None:
        assert reason in found.reason


def test_namespace_defaults_to_group_and_original_topic() -> None:
    retry = Message("%RETRY%g", b"", properties={"RETRY_TOPIC": "Orders"}, consumer_group="g")
    assert Namespace().of(retry) == "g/Orders"
    assert Namespace(fixed="x").of(retry) == "x"
    with pytest.raises(ValueError, match="namespace"):
        Namespace().of(Message("Orders", b""))


def test_fingerprint_depends_on_body_only() -> None:
    a = fingerprint_of(Message("T", b"x", msg_id="1"))
    assert a == fingerprint_of(Message("T", b"x", msg_id="2"))
    assert a != fingerprint_of(Message("T", b"y"))


def test_missing_key_policies(tmp_path: Path) -> None:
    strategy = UniqueKeyTable(f"sqlite:///{tmp_path / 'k.db'}")
    bare = Message("Orders", b"{}", msg_id="MID-1", consumer_group="g")
    letters: list[str] = []

    def handler(m: Message) -> None:
        raise AssertionError("never called without a key")

    strict = idempotent(key="keys", strategy=strategy)(handler)
    with pytest.raises(MissingKeyError, match="MID-1"):
        strict(bare)
    skip = idempotent(key="keys", strategy=strategy, on_missing_key="skip")(handler)
    assert skip(bare).outcome is Outcome.SKIPPED
    dlq = idempotent(
        key="keys",
        strategy=strategy,
        on_missing_key="dead_letter",
        dead_letter=lambda m, why: letters.append(m.msg_id),
    )(handler)
    assert dlq(bare).outcome is Outcome.DEAD_LETTERED and letters == ["MID-1"]
    with pytest.raises(ValueError, match="dead_letter"):
        idempotent(key="keys", strategy=strategy, on_missing_key="dead_letter")(handler)
    strategy.close()


def test_settings_from_env_and_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "idemp.toml"
    path.write_text(
        'backend = "redis://:hunter2@127.0.0.1:1/0"\ndeadline_s = 5\n'
        '[listeners.orders]\nbackend = "sqlite:///o.db"\ntransactional = true\n'
    )
    settings = IdempSettings.from_toml(path)
    assert settings.deadline_s == 5.0 and "hunter2" not in repr(settings)
    assert settings.for_listener("orders")["transactional"] is True
    monkeypatch.setenv("IDEMP_DEADLINE_S", "9")
    monkeypatch.setenv("IDEMP_TABLE", "bad-name;drop")
    with pytest.raises(ValueError, match="table name"):
        IdempSettings.from_toml(path)
    monkeypatch.setenv("IDEMP_TABLE", "dedup_rows")
    settings = IdempSettings.from_toml(path)
    assert (settings.deadline_s, settings.table) == (9.0, "dedup_rows")


def test_backend_change_is_configuration_only(tmp_path: Path, redis_server: Any) -> None:
    sql = IdempSettings(backend=f"sqlite:///{tmp_path / 'a.db'}").strategy_for()
    red = IdempSettings(backend=redis_server.url).strategy_for()
    assert isinstance(sql, UniqueKeyTable) and isinstance(red, RedisFlag)
    sql.close()
    red.close()


def test_mask_url() -> None:
    assert (
        mask_url("postgresql+psycopg://app:s3cret@db:5432/x")
        == "postgresql+psycopg://app:***@db:5432/x"
    )
    assert mask_url("redis://:pw@h:6379/0") == "redis://:***@h:6379/0"
    assert mask_url("redis://h:6379/0?password=pw") == "redis://h:6379/0?password=***"
    assert mask_url("sqlite:///tmp/a.db") == "sqlite:///tmp/a.db"


@pytest.mark.parametrize("group", [None, "", "DEFAULT_CONSUMER"])
def test_a_host_without_a_consumer_group_fails_when_built(
    group: str | None, tmp_path: Path
) -> None:
    """The group is the default dedup namespace: a runner or adapter without one fails
    when it is built, naming the option, not on every message (issue 12 §6)."""
    from idemp.adapters.official import callback
    from idemp.client import ConsumerSettings
    from idemp.runners import ConcurrentRunner, OrderlyRunner

    @idempotent(key="keys", strategy=f"sqlite:///{tmp_path / 'dedup.db'}")
    def handle(message: Message) -> None:
        return None

    for runner in (ConcurrentRunner, OrderlyRunner):
        with pytest.raises(
            ValueError, match=rf"^{runner.__name__}: no consumer group: pass group="
        ):
            runner(handle, group=group, namesrv_addr="127.0.0.1:9876")
        with pytest.raises(ValueError, match="pass group="):
            runner(handle, settings=ConsumerSettings(group=group or ""))
    if group != "DEFAULT_CONSUMER":
        with pytest.raises(ValueError, match="pass the PushConsumer's consumer group"):
            callback(handle, group=group)


def test_json_paths_of_one_body_parse_it_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import idemp.keys as keys

    parsed: list[bytes] = []
    real = keys.json.loads

    def counting(body: Any) -> Any:
        parsed.append(body)
        return real(body)

    monkeypatch.setattr(keys.json, "loads", counting)
    entity, target = extractor("json:$.order"), extractor("json:state")
    first = Message("T", b'{"order": "o-1", "state": "paid"}')
    same_text = Message("T", bytes(bytearray(first.body)))  # equal, another object
    big = Message("T", b'{"order": "o-2", "pad": "' + b"x" * (64 * 1024) + b'"}')
    assert (entity.extract(first), target.extract(first), entity.extract(first)) == (
        "o-1",
        "paid",
        "o-1",
    )
    assert entity.extract(same_text) == "o-1"
    assert (entity.extract(big), entity.extract(big)) == ("o-2", "o-2")
    # one parse per body object; a body over 64 KiB is parsed each time, not kept
    assert [len(b) for b in parsed] == [len(first.body), len(first.body)] + [len(big.body)] * 2
    assert parsed[1] is same_text.body
    broken = Message("T", b"{not json")
    assert isinstance(entity.extract(broken), Missing)
    assert isinstance(entity.extract(broken), Missing)


def test_a_message_is_described_with_its_queues_broker() -> None:
    """Where to find it: on a cluster, queue 0 of broker-a is not queue 0 of broker-b."""
    clustered = Message("T", b"", keys=("k",), msg_id="M1", queue_id=0, queue_offset=7,
                        broker_name="broker-b")  # fmt: skip
    assert describe(clustered) == "topic=T msg_id=M1 queue=broker-b:0 offset=7 keys=['k']"
    assert describe(Message("T", b"", queue_id=2, queue_offset=3)) == (
        "topic=T msg_id=? queue=2 offset=3 keys=[]"
    )

"""Decorated listeners fed bad input: malformed bodies, missing keys, wrong types, huge
payloads, on real stores (SQLite unique-key table, plain and transactional; Redis flag).

For every bad message the configured policy is applied (``raise`` → reconsume later,
``skip``, ``dead_letter``), one log line names the message (msgId and topic), nothing is
left claimed, and the good messages around it take effect exactly once, redeliveries and
producer retries included. Messages go through ``adapters.runner.listener``, the wrapper
idemp's runners use, so the results are what a runner would act on.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest
import sqlalchemy as sa

from adapters.runner import listener as runner_listener
from idemp import Context, Message, idempotent
from idemp.message import ConsumeResult
from idemp.strategies import Strategy
from tests.idempotency.specs import IN_TRANSACTION, effects_table

GROUP = "bad-group"
TOPIC = "Orders"
SUCCESS, LATER = ConsumeResult.SUCCESS, ConsumeResult.RECONSUME_LATER
HUGE = 4 * 1024 * 1024  # the broker's default maximum message size


class Order(pydantic.BaseModel):
    id: str
    amount: int


def msg(body: bytes, msg_id: str, keys: tuple[str, ...] = ()) -> Message:
    return Message(TOPIC, body, keys=keys, msg_id=msg_id, queue_id=1, queue_offset=7)


def order(key: str, amount: Any = 5, **extra: Any) -> bytes:
    return json.dumps({"order": {"id": key}, "amount": amount, **extra}).encode()


def _raises(message: Message) -> str:
    return str(message.json()["order"]["id"])  # KeyError / ValueError on a bad body


# name, key spec, message: every one of these has no usable business key.
NO_KEY: list[tuple[str, Any, Message]] = [
    ("no KEYS", "keys", msg(order("o-1"), "M-nokeys")),
    ("empty KEYS", "keys", msg(order("o-1"), "M-emptykeys", keys=("",))),
    ("body not JSON", "json:$.order.id", msg(b"{order: o-1", "M-notjson")),
    ("body not UTF-8", "json:$.order.id", msg(b"\xff\xfe\xfa{", "M-binary")),
    ("empty body", "json:$.order.id", msg(b"", "M-empty")),
    ("JSON is a list", "json:$.order.id", msg(b"[1, 2]", "M-list")),
    ("id is an object", "json:$.order.id", msg(b'{"order": {"id": {"a": 1}}}', "M-obj")),
    ("id is a list", "json:$.order.id", msg(b'{"order": {"id": [1]}}', "M-idlist")),
    ("id is a bool", "json:$.order.id", msg(b'{"order": {"id": true}}', "M-bool")),
    ("id is null", "json:$.order.id", msg(b'{"order": {"id": null}}', "M-null")),
    ("id is empty", "json:$.order.id", msg(b'{"order": {"id": ""}}', "M-idempty")),
    ("deeply nested", "json:$.order.id", msg(b"[" * 200_000, "M-deep")),
    ("model: wrong type", (Order, "id"), msg(b'{"id": "o-1", "amount": "lots"}', "M-type")),
    ("model: huge garbage", (Order, "id"), msg(b"\x00" * HUGE, "M-hugegarbage")),
    ("callable raises", _raises, msg(b'{"order": {}}', "M-callable")),
    ("key with NUL", "json:$.order.id", msg(b'{"order": {"id": "a\\u0000b"}}', "M-nul")),
    ("key not encodable", "json:$.order.id", msg(b'{"order": {"id": "\\ud800"}}', "M-surr")),
]


class Effects:
    """The business table (no unique key: a doubled effect is two rows), SQLite."""

    def __init__(self, kind: str, url: str, tmp_path: Path, name: str) -> None:
        self.transactional = kind in IN_TRANSACTION
        self.table = effects_table(f"{name}_effects")
        own = url if kind.startswith("sqlite") else f"sqlite:///{tmp_path / 'effects.db'}"
        self.engine = sa.create_engine(own)
        self.table.metadata.create_all(self.engine)

    def apply(self, ctx: Context) -> None:
        row = {"business_key": ctx.key, "worker": "t"}
        if self.transactional:
            ctx.connection.execute(sa.insert(self.table), row)
        else:
            with self.engine.begin() as conn:
                conn.execute(sa.insert(self.table), row)

    def counts(self) -> Counter[str]:
        with self.engine.connect() as conn:
            return Counter(r[0] for r in conn.execute(sa.select(self.table.c.business_key)))


@pytest.fixture(params=["sqlite", "sqlite_tx", "redis"])
def store(
    request: pytest.FixtureRequest, make_strategy: Callable[..., Any], tmp_path: Path
) -> Iterator[tuple[Strategy, Effects]]:
    strategy, spec = make_strategy(request.param, deadline_s=60.0)
    effects = Effects(request.param, spec["url"], tmp_path, spec["name"])
    yield strategy, effects
    effects.engine.dispose()


def build(
    store: tuple[Strategy, Effects],
    key: Any,
    policy: str,
    letters: list[tuple[str, str]] | None = None,
    fingerprint: bool = False,
) -> Callable[[Message], ConsumeResult]:
    strategy, effects = store

    def sink(message: Message, reason: str) -> None:
        assert letters is not None
        letters.append((message.msg_id, reason))

    @idempotent(
        key=key,
        strategy=strategy,
        group=GROUP,
        on_missing_key=policy,
        dead_letter=sink if policy == "dead_letter" else None,
        fingerprint=fingerprint,
        name="bad",
    )
    def handle(message: Message, ctx: Context) -> None:
        body = json.loads(message.body)  # a malformed body fails here: reconsume later
        if int(body["amount"]) <= 0:  # a wrong type fails here
            raise ValueError("amount must be positive")
        effects.apply(ctx)

    return runner_listener(handle, group=GROUP)


def names_message(caplog: pytest.LogCaptureFixture, message: Message, level: int) -> bool:
    """One log record at ``level`` or above names the message's msgId and topic."""
    for record in caplog.records:
        if record.levelno < level:
            continue
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += f" {record.exc_info[1]}"
        if message.msg_id in text and f"topic={message.topic}" in text:
            return True
    return False


@pytest.mark.parametrize("policy", ["raise", "skip", "dead_letter"])
@pytest.mark.parametrize(("case", "key", "message"), NO_KEY, ids=[c[0] for c in NO_KEY])
def test_a_message_without_a_usable_key_gets_the_policy(
    store: tuple[Strategy, Effects],
    caplog: pytest.LogCaptureFixture,
    policy: str,
    case: str,
    key: Any,
    message: Message,
) -> None:
    letters: list[tuple[str, str]] = []
    deliver = build(store, key, policy, letters)
    good = msg(order("good-1", id="good-1"), "M-good", keys=("good-1",))  # any extractor
    caplog.set_level(logging.INFO)
    results = [deliver(message), deliver(message)]  # at least once: it comes twice
    expected = LATER if policy == "raise" else SUCCESS
    assert results == [expected, expected]
    assert names_message(caplog, message, logging.WARNING)
    if policy == "dead_letter":
        assert [m for m, _ in letters] == [message.msg_id, message.msg_id]
        assert all(
            "no business key" in why and f"msg_id={message.msg_id}" in why for _, why in letters
        )
    else:
        assert letters == []
    assert store[1].counts() == Counter()  # no effect from the bad message
    assert [deliver(good), deliver(good)] == [SUCCESS, SUCCESS]  # the next one is fine
    assert store[1].counts() == Counter({"good-1": 1})


def test_missing_key_log_line_when_raising(
    store: tuple[Strategy, Effects], caplog: pytest.LogCaptureFixture
) -> None:
    """The raise policy: the runner sees the failure, and the log says which message."""
    deliver = build(store, "keys", "raise")
    message = msg(order("o-1"), "M-raise-log")
    caplog.set_level(logging.WARNING)
    assert deliver(message) == LATER
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("idemp")]
    assert any("M-raise-log" in line and "topic=Orders" in line for line in lines), lines


@pytest.mark.parametrize(
    ("case", "body"),
    [
        ("malformed JSON", b'{"amount": 5'),
        ("wrong type", order("o-1", amount="five")),
        ("field missing", b'{"order": {"id": "o-1"}}'),
        ("invalid value", order("o-1", amount=-3)),
        ("not UTF-8", b"\xff\xfe\x00"),
    ],
)
def test_a_handler_failing_on_a_bad_body_comes_back_and_holds_no_claim(
    store: tuple[Strategy, Effects], caplog: pytest.LogCaptureFixture, case: str, body: bytes
) -> None:
    deliver = build(store, "keys", "raise")
    first = msg(body, "M-bad-1", keys=("o-1",))
    caplog.set_level(logging.INFO)
    # Each delivery runs the handler again (the claim was released, never IN_PROGRESS).
    assert [deliver(first), deliver(first), deliver(first)] == [LATER, LATER, LATER]
    failures = [r for r in caplog.records if "event=failed" in r.getMessage()]
    assert len(failures) == 3
    assert all(
        "msg_id=M-bad-1" in r.getMessage() and "topic=Orders" in r.getMessage() for r in failures
    )
    assert store[1].counts() == Counter()
    # The producer fixes it and sends it again (same key, new msgId): applied once.
    fixed = msg(order("o-1"), "M-fixed", keys=("o-1",))
    assert [deliver(fixed), deliver(fixed)] == [SUCCESS, SUCCESS]
    assert store[1].counts() == Counter({"o-1": 1})


def test_huge_payloads_and_keys_take_effect_exactly_once(store: tuple[Strategy, Effects]) -> None:
    deliver = build(store, "json:$.order.id", "raise", fingerprint=True)
    big_body = order("big-1", pad="x" * HUGE)
    long_a, long_b = "k" * 10_000 + "a", "k" * 10_000 + "b"  # differ after 10,000 chars
    messages = [
        msg(big_body, "M-big-1"),
        msg(big_body, "M-big-1"),  # broker redelivery
        msg(big_body, "M-big-2"),  # producer retry
        msg(order(long_a), "M-long-a"),
        msg(order(long_b), "M-long-b"),
        msg(order(long_a), "M-long-a2"),
        msg(order("ünïcødé-✓"), "M-uni"),
        msg(order("ünïcødé-✓"), "M-uni2"),
    ]
    assert [deliver(m) for m in messages] == [SUCCESS] * len(messages)
    assert store[1].counts() == Counter({"big-1": 1, long_a: 1, long_b: 1, "ünïcødé-✓": 1})


def test_a_stream_mixing_good_and_bad_messages(
    store: tuple[Strategy, Effects], caplog: pytest.LogCaptureFixture
) -> None:
    """Every good message once, every bad one dead-lettered on each delivery, the handler
    failures back for redelivery, all twice delivered."""
    letters: list[tuple[str, str]] = []
    deliver = build(store, "json:$.order.id", "dead_letter", letters)
    stream: list[tuple[Message, ConsumeResult]] = []
    good: list[str] = []
    for i in range(30):
        if i % 3 == 0:
            stream.append((msg(b"garbage %d" % i, f"M-g{i}"), SUCCESS))  # dead-lettered
        elif i % 5 == 0:
            stream.append((msg(order(f"o-{i}", amount="?"), f"M-t{i}"), LATER))  # handler fails
        else:
            stream.append((msg(order(f"o-{i}"), f"M-{i}"), SUCCESS))
            good.append(f"o-{i}")
    caplog.set_level(logging.WARNING)
    for message, expected in stream + stream:
        assert deliver(message) == expected, message.msg_id
    assert store[1].counts() == Counter(dict.fromkeys(good, 1))
    dead = [m.msg_id for m, _ in stream if m.body.startswith(b"garbage")]
    assert [m for m, _ in letters] == dead + dead

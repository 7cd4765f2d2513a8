"""The transaction check rounds on a real store (no network): 5.x clients' halves are
asked about on RocketMQ 5.3.3's cadence (30 s), 4.x halves on 4.9.7's (60 s). A whole
broker would need a minute to show the difference; here the rounds are run directly."""

from __future__ import annotations

import asyncio
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from idemp.broker.clients import ClientManager
from idemp.broker.config import BrokerConfig
from idemp.broker.halfcheck import CHECK_GROUP, TransactionCheckService
from idemp.broker.store import MessageStore
from idemp.remoting import MessageExt
from idemp.remoting.codes import TRANS_HALF_TOPIC, MessageSysFlag, Prop


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[TransactionCheckService, list[str]]]:
    """A check service over a fresh store whose halves are all old enough to ask about
    (transactionTimeOut 0), and the transaction ids its 5.x checker was asked about (no
    4.x producer is online: a 4.x half is put back and asked of no one)."""
    config = BrokerConfig(
        storePathRootDir=str(tmp_path / "store"),
        transactionTimeOut=0,
        transactionCheckInterval=60_000,
        grpcTransactionCheckInterval=100,
    )
    store = MessageStore(config)
    server = types.SimpleNamespace(config=config, store=store, clients=ClientManager())
    checks = TransactionCheckService(server)
    asked: list[str] = []

    def checker(half: MessageExt, transaction_id: str) -> bool:
        if Prop.TRANSACTION_ID not in half.properties:
            return False
        asked.append(transaction_id)
        return True

    checks.checkers.append(checker)
    yield checks, asked
    store.close()


def _half(checks: TransactionCheckService, uniq: str, *, v5: bool) -> None:
    """A half as the send paths store it; a 5.x client's names its transaction."""
    props = {
        Prop.REAL_TOPIC: "T",
        Prop.REAL_QID: "0",
        Prop.PGROUP: "PG" if not v5 else "T",
        Prop.UNIQ_KEY: uniq,
        Prop.TRAN_MSG: "true",
    }
    if v5:
        props[Prop.TRANSACTION_ID] = uniq
    store = checks.server.store
    assert store is not None
    half = MessageExt(
        topic=TRANS_HALF_TOPIC,
        queue_id=0,
        body=b"x",
        properties=props,
        sys_flag=MessageSysFlag.TRANSACTION_NOT_TYPE,
        born_timestamp=int(time.time() * 1000) - 1000,
    )
    # stored a second ago: a round skips what was stored since it started
    store.put(half, keep_wait=True, store_timestamp=half.born_timestamp)


def _later() -> None:
    """A round skips copies stored since it started, by the millisecond clock; a round
    right after another would find its copies in the same millisecond."""
    time.sleep(0.002)


def _round_offset(checks: TransactionCheckService) -> int | None:
    store = checks.server.store
    assert store is not None
    return store.offsets.query(CHECK_GROUP, TRANS_HALF_TOPIC, 0)


def _run_rounds(
    checks: TransactionCheckService, for_s: float, until: Callable[[list[bool]], bool]
) -> list[bool]:
    """Run the service's rounds until ``until`` holds of the rounds run so far (polled
    every 20 ms, the rounds being 0.1 s apart) or ``for_s`` seconds passed; return them
    (True: a round of 5.x halves only)."""
    calls: list[bool] = []
    original = checks.check_once

    def counted(only_v5: bool = False) -> int:
        calls.append(only_v5)
        return original(only_v5)

    checks.check_once = counted  # type: ignore[method-assign]

    async def rounds() -> None:
        task = asyncio.ensure_future(checks.run())
        deadline = time.monotonic() + for_s
        while not until(calls) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        task.cancel()

    asyncio.run(rounds())
    return calls


def test_a_5x_round_asks_about_5x_halves_only_and_stops_its_offset_at_a_4x_one(
    service: tuple[TransactionCheckService, list[str]],
) -> None:
    checks, asked = service
    _half(checks, "V5A", v5=True)
    _half(checks, "X4", v5=False)  # offset 1: no live 4.x producer, asked by no one
    _half(checks, "V5B", v5=True)
    assert checks.check_once(only_v5=True) == 2
    assert asked == ["V5A", "V5B"]
    # the 5.x halves were put back as copies (offsets 3, 4); the 4.x one waits at 1
    assert _round_offset(checks) == 1
    assert sorted(checks.pending) == [1, 3, 4]
    _later()
    # the next full round asks about all three, each once: the 4.x half where it was,
    # the 5.x ones by their copies, not by the originals the 5.x round passed
    assert checks.check_once() == 3
    assert asked == ["V5A", "V5B", "V5A", "V5B"]
    assert _round_offset(checks) == 5
    assert sorted(checks.pending) == [5, 6, 7]


def test_a_5x_round_before_any_4x_half_moves_the_offset_as_a_full_one(
    service: tuple[TransactionCheckService, list[str]],
) -> None:
    checks, asked = service
    _half(checks, "V5A", v5=True)
    assert checks.check_once(only_v5=True) == 1
    assert _round_offset(checks) == 1  # past the original; its copy is the next round's
    _later()
    assert checks.check_once(only_v5=True) == 1
    assert asked == ["V5A", "V5A"]
    assert _round_offset(checks) == 2


def test_the_rounds_run_on_both_cadences(
    service: tuple[TransactionCheckService, list[str]],
) -> None:
    """With full rounds a minute apart and 5.x rounds every 0.1 s, a 5.x half is asked
    about within the first rounds, and a 4.x half is not: no full round ran, so the half
    topic is not a topic yet (RocketMQ creates it in its first round)."""
    checks, asked = service
    _half(checks, "X4", v5=False)
    _half(checks, "V5A", v5=True)
    store = checks.server.store
    assert store is not None
    calls = _run_rounds(checks, 5.0, lambda calls: len(asked) >= 2)
    assert calls[:2] == [True, True]
    assert asked[:2] == ["V5A", "V5A"]
    assert 0 in checks.pending and len(checks.pending) == 2  # the 4.x half, not asked
    assert store.topics.get(TRANS_HALF_TOPIC) is None


def test_no_5x_round_runs_while_no_5x_half_is_pending(
    service: tuple[TransactionCheckService, list[str]],
) -> None:
    """Without 5.x halves the 5.x cadence reads nothing: the round's offset and its
    group's gets stay as 4.9.7 leaves them until the full round."""
    checks, _ = service
    _half(checks, "X4", v5=False)
    assert _run_rounds(checks, 0.55, lambda calls: bool(calls)) == []  # five 5.x periods
    assert _round_offset(checks) is None


def test_a_full_round_serves_the_5x_halves_too(
    service: tuple[TransactionCheckService, list[str]],
) -> None:
    """With both cadences equal every round is a full one: the 5.x halves are not asked
    about a second time by a 5.x round right after it."""
    checks, asked = service
    checks.server.config.transactionCheckInterval = 100
    _half(checks, "V5A", v5=True)
    calls = _run_rounds(checks, 5.0, lambda calls: len(calls) >= 3)
    assert calls[:3] == [False, False, False]
    assert asked[:3] == ["V5A", "V5A", "V5A"]

"""No secret in any log line or error: URLs with passwords reach the strategies' and the
configuration's error paths, and table names from configuration are validated."""

from __future__ import annotations

import logging
import socket
import traceback
from collections.abc import Callable
from typing import Any

import pytest

from idemp.config import build_strategy, mask_url
from idemp.strategies import (
    OptimisticVersion,
    PessimisticRowLock,
    RedisFlag,
    RedissonLock,
    UniqueKeyTable,
)

SECRET = "PW-s3cr3t-zz"


def _closed_port() -> int:
    """A loopback port nothing listens on (bound then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pg(port: int) -> str:
    return f"postgresql+psycopg://user:{SECRET}@127.0.0.1:{port}/db?connect_timeout=2"


CASES: dict[str, Callable[[int], Any]] = {
    "unique_key": lambda port: UniqueKeyTable(_pg(port)),
    "optimistic": lambda port: OptimisticVersion(_pg(port)),
    "pessimistic": lambda port: PessimisticRowLock(_pg(port)),
    "build_strategy_sql": lambda port: build_strategy(_pg(port)),
    "wrong_scheme_redis": lambda port: build_strategy(
        f"redis://:{SECRET}@127.0.0.1:{port}/0", strategy="unique_key"
    ),
    "wrong_scheme_sql": lambda port: build_strategy(_pg(port), strategy="redis_flag"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_connection_failures_never_show_the_password(
    case: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(Exception) as info:
        CASES[case](_closed_port())
    text = "".join(traceback.format_exception(info.value))  # the whole chain, as logged
    assert SECRET not in text
    assert SECRET not in caplog.text


@pytest.mark.parametrize(
    "make",
    [
        lambda port: RedisFlag(f"redis://:{SECRET}@127.0.0.1:{port}/0"),
        lambda port: RedissonLock(f"redis://user:{SECRET}@127.0.0.1:{port}/0"),
    ],
)
def test_redis_strategies_repr_hides_the_password(make: Callable[[int], Any]) -> None:
    assert SECRET not in repr(make(_closed_port()))


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        (f"redis://:{SECRET}@h:6379/0", "redis://:***@h:6379/0"),
        (f"postgresql://u:{SECRET}@h/db", "postgresql://u:***@h/db"),
        (f"postgresql://u@h/db?password={SECRET}&x=1", "postgresql://u@h/db?password=***&x=1"),
        ("redis://h:6379/0", "redis://h:6379/0"),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked


@pytest.mark.parametrize(
    "table", ["x; drop table y", "a b", "1abc", 't"q', "", "a" * 64, "schema.table"]
)
def test_table_names_from_configuration_are_validated(table: str) -> None:
    with pytest.raises(ValueError, match="not a valid SQL table name"):
        UniqueKeyTable("sqlite://", table=table)


def test_a_valid_table_name_is_used() -> None:
    assert UniqueKeyTable("sqlite://", table="idemp_Dedup_2").table.name == "idemp_Dedup_2"

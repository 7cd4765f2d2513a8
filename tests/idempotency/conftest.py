"""Fixtures: a fresh strategy spec per test on real SQLite, PostgreSQL and Redis."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from idemp.strategies import Strategy
from tests.idempotency.specs import build
from tests.servers import PostgresServer, RedisServer

Spec = dict[str, Any]


@pytest.fixture
def make_spec(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., Spec]:
    """``make_spec(kind, **options)``: a spec whose table / key prefix is new to this test.
    Servers start only when a test asks for their kind."""

    def factory(kind: str, **options: Any) -> Spec:
        name = f"t_{uuid.uuid4().hex[:12]}"
        if kind.startswith("sqlite"):
            url = f"sqlite:///{tmp_path / (name + '.db')}"
        elif kind.startswith("pg"):
            pg: PostgresServer = request.getfixturevalue("postgres_server")
            url = pg.url
        elif kind in ("redis", "redisson"):
            redis: RedisServer = request.getfixturevalue("redis_server")
            url = redis.url
        else:
            raise ValueError(kind)
        return {"kind": kind, "url": url, "name": name, **options}

    return factory


@pytest.fixture
def make_strategy(make_spec: Callable[..., Spec]) -> Iterator[Callable[..., tuple[Strategy, Spec]]]:
    """``make_strategy(kind, **options)`` → (strategy, spec); closed at teardown."""
    made: list[Strategy] = []

    def factory(kind: str, **options: Any) -> tuple[Strategy, Spec]:
        spec = make_spec(kind, **options)
        strategy = build(spec)
        made.append(strategy)
        return strategy, spec

    yield factory
    for strategy in made:
        strategy.close()


@pytest.fixture
def sql_url(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str]:
    """``sql_url("sqlite")``: a database file of the test; ``sql_url("pg")``: the
    session's PostgreSQL (started on first use)."""

    def url(kind: str) -> str:
        if kind == "sqlite":
            return f"sqlite:///{tmp_path / 'around.db'}"
        return str(request.getfixturevalue("postgres_server").url)

    return url

"""Broker fixtures: idemp's broker as a real child process on free loopback ports."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from idemp.broker.config import BrokerConfig
from idemp.broker.metadata import TopicConfig
from idemp.broker.process import BrokerProcess
from idemp.broker.store import MessageStore
from tests.realbroker import start_broker


@pytest.fixture(scope="session", autouse=True)
def _official_client_home() -> Iterator[None]:
    """The official C++ client fixes its log directory ($HOME/logs/rocketmq-cpp) at the
    first start() of the process, so HOME is set once for the whole session."""
    old = os.environ.get("HOME")
    with tempfile.TemporaryDirectory(prefix="idemp-client-home-") as home:
        os.environ["HOME"] = home
        try:
            yield
        finally:
            if old is not None:
                os.environ["HOME"] = old


@pytest.fixture
def make_broker(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., BrokerProcess]]:
    """Factory: ``make_broker(**broker_conf_keys)`` starts a broker on a fresh store
    (or ``store=`` an existing one); every broker started is stopped at the end. With
    IDEMP_4X_REAL set, RocketMQ 4.9.7 (tests/realbroker.py)."""
    started: list[BrokerProcess] = []

    def factory(store: Path | None = None, **props: object) -> BrokerProcess:
        store = store or tmp_path / f"store{len(started)}"
        properties = {k: str(v) for k, v in props.items()}
        broker = start_broker(store, properties, request.path)
        started.append(broker)
        return broker

    yield factory
    for broker in started:
        broker.stop()


@pytest.fixture
def broker(make_broker: Callable[..., BrokerProcess]) -> BrokerProcess:
    return make_broker()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MessageStore]:
    """A broker's store with topic T (one queue), no broker around it."""
    s = MessageStore(BrokerConfig(storePathRootDir=str(tmp_path / "store")))
    s.topics.put(TopicConfig("T", 1, 1))
    yield s
    s.close()

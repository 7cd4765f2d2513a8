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
from tests.realbroker import RealBroker, real_home


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Against real RocketMQ (IDEMP_4X_REAL), what looks inside idemp's broker is skipped."""
    if real_home() is None:
        return
    skip = pytest.mark.skip(reason="looks inside idemp's own broker; IDEMP_4X_REAL is set")
    for item in items:
        if "idemp_only" in item.keywords:
            item.add_marker(skip)


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
    IDEMP_4X_REAL set, a test of tests/broker gets RocketMQ 4.9.7 (tests/realbroker.py);
    the RocketMQ 5 tests that share this fixture have their own switch (IDEMP_V5_REAL)."""
    started: list[BrokerProcess] = []
    home = real_home() if request.path.parent == Path(__file__).parent else None

    def factory(store: Path | None = None, **props: object) -> BrokerProcess:
        store = store or tmp_path / f"store{len(started)}"
        properties = {k: str(v) for k, v in props.items()}
        if home is not None:
            real = RealBroker(home, store, properties).start()
            started.append(real)  # type: ignore[arg-type]
            return real  # type: ignore[return-value]
        broker = BrokerProcess(store, properties=properties)
        broker.start()
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

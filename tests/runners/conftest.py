"""Runner tests reuse the client fixtures (broker child process, consume processes)."""

from __future__ import annotations

import threading

from idemp.guards import CallableStateStore
from tests.client.conftest import broker, consumers, make_broker  # noqa: F401


def memory_states() -> tuple[dict[str, str], CallableStateStore]:
    """A guard's state store in a dict: an entity moves only from the state it is in."""
    states: dict[str, str] = {}
    lock = threading.Lock()

    def save(entity: str, source: str | None, target: str) -> bool:
        with lock:
            if states.get(entity) != source:
                return False
            states[entity] = target
            return True

    return states, CallableStateStore(load=states.get, save=save)

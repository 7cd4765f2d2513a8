"""idemp: exactly-once effects and per-key order for RocketMQ consumers.

Everything a service needs is importable from here (a flat surface, as redis-py's):
the decorators and what they hand a handler, the strategies, the key specs, the guard's
state machine, the runners and the settings. All but the message model are imported on
first use (PEP 562): ``idemp broker`` and the codec start without paying for SQLAlchemy
and redis-py.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from idemp.message import ConsumeResult, Message, ReconsumeLater, ack_of, consume_result_of

# Eager on purpose: the submodule idemp.stats shares the function's name, and a lazy
# import would leave the package attribute bound to the module.
from idemp.stats import stats

if TYPE_CHECKING:
    from idemp.app import App
    from idemp.config import IdempSettings, ListenerSettings, strategy_from_url
    from idemp.guards import StateMachine, Transition
    from idemp.keys import Callback, JsonPath, MessageKeys, Missing, ModelField, Property
    from idemp.outcome import BatchResult, Outcome, Result
    from idemp.pipeline import Context, guarded, idempotent
    from idemp.runners import ConcurrentRunner, OrderlyRunner
    from idemp.strategies import (
        OptimisticVersion,
        PessimisticRowLock,
        RedisFlag,
        RedissonLock,
        UniqueKeyTable,
    )

try:  # one source: pyproject's version, as installed (the wheel, `idemp --version` agree)
    __version__ = version("idemp")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
_LAZY = {
    "App": "idemp.app",
    "BatchResult": "idemp.outcome",
    "Outcome": "idemp.outcome",
    "Result": "idemp.outcome",
    "Context": "idemp.pipeline",
    "guarded": "idemp.pipeline",
    "idempotent": "idemp.pipeline",
    "UniqueKeyTable": "idemp.strategies",
    "RedisFlag": "idemp.strategies",
    "OptimisticVersion": "idemp.strategies",
    "PessimisticRowLock": "idemp.strategies",
    "RedissonLock": "idemp.strategies",
    "MessageKeys": "idemp.keys",
    "Property": "idemp.keys",
    "JsonPath": "idemp.keys",
    "ModelField": "idemp.keys",
    "Callback": "idemp.keys",
    "Missing": "idemp.keys",
    "StateMachine": "idemp.guards",
    "Transition": "idemp.guards",
    "ConcurrentRunner": "idemp.runners",
    "OrderlyRunner": "idemp.runners",
    "IdempSettings": "idemp.config",
    "ListenerSettings": "idemp.config",
    "strategy_from_url": "idemp.config",
}
__all__ = [  # the order of the API page
    "App",
    "ConsumeResult",
    "ReconsumeLater",
    "Message",
    "ack_of",
    "consume_result_of",
    "stats",
    "BatchResult",
    "Outcome",
    "Result",
    "Context",
    "guarded",
    "idempotent",
    "UniqueKeyTable",
    "RedisFlag",
    "OptimisticVersion",
    "PessimisticRowLock",
    "RedissonLock",
    "MessageKeys",
    "Property",
    "JsonPath",
    "ModelField",
    "Callback",
    "Missing",
    "StateMachine",
    "Transition",
    "ConcurrentRunner",
    "OrderlyRunner",
    "IdempSettings",
    "ListenerSettings",
    "strategy_from_url",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'idemp' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value

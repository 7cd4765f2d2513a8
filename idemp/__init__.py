"""idemp: exactly-once effects and per-key order for RocketMQ consumers.

The decorators pull in SQLAlchemy and redis-py, so they are imported on first use
(PEP 562): ``idemp broker`` and the codec start without paying for them.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from idemp.message import ConsumeResult, Message, ack_of

# Eager on purpose: the submodule idemp.stats shares the function's name, and a lazy
# import would leave the package attribute bound to the module.
from idemp.stats import stats

if TYPE_CHECKING:
    from idemp.outcome import BatchResult, Outcome, Result
    from idemp.pipeline import Context, guarded, idempotent

try:  # one source: pyproject's version, as installed (the wheel, `idemp --version` agree)
    __version__ = version("idemp")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
__all__ = [
    "BatchResult",
    "ConsumeResult",
    "Context",
    "Message",
    "Outcome",
    "Result",
    "ack_of",
    "guarded",
    "idempotent",
    "stats",
]

_LAZY = {
    "BatchResult": "idemp.outcome",
    "Outcome": "idemp.outcome",
    "Result": "idemp.outcome",
    "Context": "idemp.pipeline",
    "guarded": "idemp.pipeline",
    "idempotent": "idemp.pipeline",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'idemp' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value

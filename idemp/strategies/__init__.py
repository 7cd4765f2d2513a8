"""Dedup strategies: one interface (``base.Strategy``), one module per strategy.

Claim-based (CONSUMING/CONSUMED records): ``UniqueKeyTable`` (SQL), ``RedisFlag`` (Redis).
Around the handler: ``OptimisticVersion`` and ``PessimisticRowLock`` (SQL, on the
business row), ``RedissonLock`` (Redis). Each is built from a URL or an existing
engine/client.
"""

from idemp.strategies.base import (
    CONSUMED,
    CONSUMING,
    BatchSession,
    ClaimAheadSession,
    ClaimLost,
    ClaimStrategy,
    Job,
    Record,
    StoreError,
    Strategy,
    Ticket,
    Verdict,
)
from idemp.strategies.optimistic import OptimisticVersion, VersionConflict, Versioned
from idemp.strategies.pessimistic import Locked, PessimisticRowLock
from idemp.strategies.redis_flag import RedisFlag
from idemp.strategies.redisson import DistributedLock, LeaseLost, LockHandle, RedissonLock
from idemp.strategies.unique_key import UniqueKeyTable

__all__ = [
    "CONSUMED",
    "CONSUMING",
    "BatchSession",
    "ClaimAheadSession",
    "ClaimLost",
    "ClaimStrategy",
    "DistributedLock",
    "Job",
    "LeaseLost",
    "LockHandle",
    "Locked",
    "OptimisticVersion",
    "PessimisticRowLock",
    "Record",
    "RedisFlag",
    "RedissonLock",
    "StoreError",
    "Strategy",
    "Ticket",
    "UniqueKeyTable",
    "Verdict",
    "VersionConflict",
    "Versioned",
]

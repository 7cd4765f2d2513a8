"""The one interface every dedup strategy implements.

Modelled on aws-lambda-powertools' ``BasePersistenceLayer``: one small interface, many
backends, the protocol kept outside them. A strategy answers three questions for the
pipeline (``idemp.pipeline``), which owns the protocol, the handler call and the counters:

* ``begin(job)``: may this message's handler run now? Claim-based strategies (unique-key
  table, Redis flag) claim the key (new → CONSUMING with a deadline; CONSUMED → duplicate;
  CONSUMING before its deadline → in progress; past it → taken over by compare-and-set).
  "Around" strategies (optimistic version, pessimistic row lock, Redisson-style lock)
  read a version, open a transaction and lock a row, or take a lock. The answer is a
  :class:`Ticket` whose ``verdict`` says run or not, and whose ``handle`` is what the
  handler receives as ``ctx.handle`` (a SQL connection, a fencing token, a version).
* ``commit(ticket)``: the handler succeeded: mark CONSUMED / commit the transaction /
  check the fencing token and unlock. Raises :class:`StoreError` on store failure.
* ``abort(ticket, error)``: the handler failed or declined: release the claim (owner
  only) / roll back / unlock, so the redelivery can run.

Plus, with working defaults: ``begin_many``/``commit_many``/``abort_many`` (override to
claim a batch in one round trip), ``session(jobs)`` (a :class:`BatchSession`: the
runner's batch of per-message handlers in one transaction or one round trip per step),
``retry_on``/``max_attempts`` (the pipeline re-runs
``begin`` + handler when the handler raises one of these, e.g. an optimistic version
conflict) and ``classify(error)`` (map a strategy's own exception to an :class:`Outcome`:
a lock wait timeout → IN_PROGRESS, an exhausted version conflict → DROPPED, …).

Strategies import only their stores and this module: never the pipeline.
"""

from __future__ import annotations

import itertools
import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

from idemp._fastinit import fast_frozen_init
from idemp.message import Message
from idemp.outcome import Outcome

CONSUMING = "CONSUMING"
CONSUMED = "CONSUMED"


class StoreError(RuntimeError):
    """The dedup store failed (connection refused or dropped, timeout, read-only…).

    Strategies wrap their driver's exceptions in it so the pipeline, which never imports
    a driver, maps every store failure to reconsume-later.
    """


class Verdict(Enum):
    """What ``begin`` decided for one job."""

    RUN = "run"  # new key (or new lock/transaction): run the handler
    TAKEOVER = "takeover"  # a claim past its deadline was taken over: run the handler
    DUPLICATE = "duplicate"  # already CONSUMED within the retention: ack, do not run
    IN_PROGRESS = "in_progress"  # held by someone else: reconsume later, never ack
    PAYLOAD_CONFLICT = "payload_conflict"  # same key, another fingerprint: report
    STALE = "stale"  # the strategy knows this message is outdated: drop

    @property
    def runs(self) -> bool:
        return self is Verdict.RUN or self is Verdict.TAKEOVER


@fast_frozen_init
@dataclass(frozen=True, slots=True)
class Job:
    """One message to decide on: its namespaced business key and optional fingerprint."""

    namespace: str
    key: str
    message: Message
    fingerprint: str | None = None


@dataclass(slots=True)
class Ticket:
    """``begin``'s answer, handed back to ``commit``/``abort`` unchanged.

    ``atomic`` says the handler's own writes commit together with the record (a SQL
    transaction): then a failed commit means no effect and the message must come back;
    otherwise the effect stands and the message is acked even if the record could not be
    marked CONSUMED.
    """

    job: Job
    verdict: Verdict
    token: str = ""  # the owner token written with the claim (compare-and-set)
    handle: Any = None  # given to the handler as ctx.handle
    atomic: bool = False
    attempts: int = 1  # how many times this key has been claimed (1 = first)
    detail: str = ""  # e.g. the stored fingerprint on a conflict
    private: Any = field(default=None, repr=False)  # the strategy's own state


@dataclass(frozen=True, slots=True)
class Record:
    """A dedup record as stored (for tests, tooling and reconciliation)."""

    namespace: str
    key: str
    status: str  # CONSUMING or CONSUMED
    owner: str
    fingerprint: str | None
    attempts: int
    deadline_ms: int | None  # CONSUMING: when a takeover becomes allowed
    expires_ms: int | None  # when the record stops counting


_TOKENS = itertools.count(1)
_PREFIX = ""


def _new_prefix() -> None:
    """A random per-process prefix and the pid, made again in a forked child (so no
    ``getpid`` system call per token)."""
    global _PREFIX
    _PREFIX = f"{os.urandom(6).hex()}-{os.getpid()}-"


_new_prefix()
os.register_at_fork(after_in_child=_new_prefix)


def new_token() -> str:
    """A unique owner token: a random per-process prefix, the pid and a counter.

    Cheaper than uuid4 on the hot path, and unique across processes and forks (the pid
    and the random part differ; the counter makes it unique within one process)."""
    return f"{_PREFIX}{next(_TOKENS)}"


class Strategy(ABC):
    """The interface. Subclasses: one module each under ``idemp.strategies``."""

    name: ClassVar[str] = "strategy"
    #: Handler exceptions after which the pipeline aborts and runs begin + handler again.
    retry_on: tuple[type[BaseException], ...] = ()
    #: Total attempts (first included) for ``retry_on`` exceptions.
    max_attempts: int = 1

    @abstractmethod
    def begin(self, job: Job) -> Ticket:
        """Decide whether the handler runs; raise :class:`StoreError` on store failure."""

    @abstractmethod
    def commit(self, ticket: Ticket) -> None:
        """The handler succeeded: make it stick; raise :class:`StoreError` on failure."""

    @abstractmethod
    def abort(self, ticket: Ticket, error: BaseException | None) -> None:
        """The handler failed (``error``) or declined (None): let the redelivery run."""

    def begin_many(self, jobs: Sequence[Job]) -> list[Ticket]:
        """One ticket per job, in order. Override to claim in one round trip."""
        return [self.begin(job) for job in jobs]

    def commit_many(self, tickets: Sequence[Ticket]) -> None:
        for ticket in tickets:
            self.commit(ticket)

    def abort_many(self, tickets: Sequence[Ticket], error: BaseException | None) -> None:
        for ticket in tickets:
            self.abort(ticket, error)

    def classify(self, error: BaseException) -> Outcome | None:
        """Map one of this strategy's exceptions to an outcome; None → FAILED."""
        return None

    def session(self, jobs: Sequence[Job]) -> BatchSession | None:
        """A batch session for these jobs (a runner's batch, in message order), or None
        when this strategy has none (the pipeline then runs them one by one)."""
        return None

    def close(self) -> None:
        """Release connections/pools this strategy created (not those it was given)."""
        return None


class BatchSession(ABC):
    """A runner's batch of messages, each with its own handler call, on one strategy.

    The pipeline calls ``begin``/``commit``/``abort`` per message in message order, as
    on the strategy itself, then ``finish`` once (make the batch's work stick: one
    commit, one round trip) and ``close`` always. Per-message semantics hold: a failed
    handler's ``abort`` undoes only its own message (a savepoint, a release); a key seen
    twice in one batch is decided after its first copy. Until ``finish`` returns nothing
    committed is final: when it raises :class:`StoreError`, the atomic tickets' work is
    gone (their messages come back) and the others' effects stand (acked, counted as
    commit errors), exactly as a failed ``commit`` of one message.
    """

    @abstractmethod
    def begin(self, job: Job) -> Ticket: ...

    @abstractmethod
    def commit(self, ticket: Ticket) -> None: ...

    @abstractmethod
    def abort(self, ticket: Ticket, error: BaseException | None) -> None: ...

    @abstractmethod
    def finish(self) -> None:
        """Make every committed ticket's work stick; raise :class:`StoreError`."""

    @abstractmethod
    def close(self) -> None:
        """Give back what the session holds; what ``finish`` did not make stick is undone."""

    def connection(self) -> Any:
        """The SQL connection whose transaction the batch runs in, if there is one (a
        guard's state store then loads the batch's states in it at once)."""
        return None

    def refused(self) -> Sequence[tuple[Ticket, BaseException]]:
        """After ``finish`` (also one that raised): the committed tickets refused one by
        one, each with the error its own ``commit`` would have raised alone (a lock's
        lease found lost when the batch's releases ran); those messages fail as they
        would alone."""
        return ()


class ClaimStrategy(Strategy):
    """Base of the claim-based strategies: CONSUMING/CONSUMED records with a deadline.

    ``deadline_s``: how long a claim holder may take before another consumer may take
    the key over. ``retention_s``: how long a CONSUMED record keeps absorbing duplicates.
    """

    def __init__(self, *, deadline_s: float = 60.0, retention_s: float = 7 * 86400.0) -> None:
        if deadline_s <= 0 or retention_s <= 0:
            raise ValueError("deadline_s and retention_s must be positive")
        self.deadline_ms = int(deadline_s * 1000)
        self.retention_ms = int(retention_s * 1000)

    @abstractmethod
    def get(self, namespace: str, key: str) -> Record | None:
        """The stored record of one key, or None (expired records may still be seen)."""


def verdict_of_existing(
    status: str, fingerprint: str | None, job: Job, *, deadline_passed: bool
) -> Verdict:
    """The shared decision table for a key that already has a record (no takeover yet:
    a ``TAKEOVER`` here means "try the compare-and-set")."""
    if status == CONSUMED:
        if (
            job.fingerprint is not None
            and fingerprint is not None
            and fingerprint != job.fingerprint
        ):
            return Verdict.PAYLOAD_CONFLICT
        return Verdict.DUPLICATE
    return Verdict.TAKEOVER if deadline_passed else Verdict.IN_PROGRESS


class ClaimLost(StoreError):
    """At commit, the claim was no longer ours (taken over past the deadline, or gone).

    A non-atomic handler's effect has happened anyway: the pipeline acks and reports it.
    """


class ClaimAheadSession(BatchSession):
    """For claim strategies whose claims stand alone (the autocommit unique-key table,
    the Redis flag): the batch's distinct keys claimed in one ``begin_many`` (one
    statement, one script call) before the first handler runs, each claim visible to
    other consumers at once as a single claim is; the successes marked CONSUMED in one
    ``commit_many`` at the end. A failed handler releases its own claim at once; claims
    of messages never started are released at close. A second copy of a key whose first
    copy succeeded is a duplicate."""

    def __init__(self, strategy: ClaimStrategy, jobs: Sequence[Job]) -> None:
        self.strategy = strategy
        firsts: dict[tuple[str, str], Job] = {}
        for job in jobs:
            firsts.setdefault((job.namespace, job.key), job)
        self.ahead: dict[int, Ticket] = {}
        try:
            tickets = strategy.begin_many(list(firsts.values()))
        except StoreError:
            tickets = []  # each message then claims on its own (and says what failed)
        for ticket in tickets:
            self.ahead[id(ticket.job)] = ticket
        self.done: set[tuple[str, str]] = set()
        self.pending: list[Ticket] = []

    def begin(self, job: Job) -> Ticket:
        ticket = self.ahead.pop(id(job), None)
        if ticket is not None:
            return ticket
        if (job.namespace, job.key) in self.done:
            return Ticket(job, Verdict.DUPLICATE, detail="repeated within the batch")
        return self.strategy.begin(job)

    def commit(self, ticket: Ticket) -> None:
        self.pending.append(ticket)
        self.done.add((ticket.job.namespace, ticket.job.key))

    def abort(self, ticket: Ticket, error: BaseException | None) -> None:
        self.strategy.abort(ticket, error)

    def finish(self) -> None:
        pending, self.pending = self.pending, []
        if pending:
            self.strategy.commit_many(pending)

    def close(self) -> None:
        unstarted = [t for t in self.ahead.values() if t.verdict.runs]
        self.ahead.clear()
        if unstarted:
            try:
                self.strategy.abort_many(unstarted, None)
            except StoreError:
                pass  # the claims stay until their deadline; the redeliveries wait that long

"""``@idempotent``: key → strategy.begin → handler → commit / abort, for every message.

The protocol lives here, once, for every strategy (``idemp.strategies.base`` explains the
interface): a failed handler never leads to an ack; its claim is released and the
message comes back. A store failure before the handler means "come back later"; after a
successful handler it depends on whether the handler's writes committed with the record
(``Ticket.atomic``): if they did, nothing happened and the message comes back; if not,
the effect stands and the message is acked (redoing it would double it), reported as a
commit error.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import logging
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, cast

from idemp._fastinit import fast_frozen_init
from idemp.guards import (
    AHEAD,
    Entered,
    Guard,
    GuardDrop,
    GuardGiveUp,
    GuardHold,
    NoClaim,
    StateMachine,
    StateStore,
    Transition,
)
from idemp.keys import (
    Fingerprinter,
    KeyExtractor,
    KeySpec,
    Missing,
    MissingKeyError,
    MissingKeyPolicy,
    Namespace,
    describe,
    extractor,
    fingerprint_of,
    unusable,
)
from idemp.message import ConsumeResult, Message, ReconsumeLater, ack_of, consume_result_of
from idemp.outcome import BatchResult, Outcome, Result
from idemp.strategies.base import BatchSession, Job, StoreError, Strategy, Ticket, Verdict

# The module, never the ``idemp.stats`` *function* that ``idemp/__init__`` re-exports
# under the same name (which one ``from idemp import stats`` finds depends on import order).
_stats = importlib.import_module("idemp.stats")
_log = logging.getLogger("idemp.pipeline")

__all__ = [
    "AsyncIdempotentListener",
    "Context",
    "IdempotentBatchListener",
    "IdempotentListener",
    "guarded",
    "idempotent",
]

DeadLetterSink = Callable[[Message, str], None]

_VERDICT_OUTCOME = {
    Verdict.DUPLICATE: Outcome.DUPLICATE,
    Verdict.IN_PROGRESS: Outcome.IN_PROGRESS,
    Verdict.PAYLOAD_CONFLICT: Outcome.PAYLOAD_CONFLICT,
    Verdict.STALE: Outcome.DROPPED,
}
_LEVEL = {
    Outcome.PROCESSED: logging.DEBUG,
    Outcome.DUPLICATE: logging.INFO,
    Outcome.IN_PROGRESS: logging.INFO,
    Outcome.PAYLOAD_CONFLICT: logging.ERROR,
    Outcome.SKIPPED: logging.WARNING,
    Outcome.DEAD_LETTERED: logging.WARNING,
    Outcome.DROPPED: logging.INFO,
    Outcome.HELD: logging.INFO,
    Outcome.FAILED: logging.WARNING,
    Outcome.STORE_ERROR: logging.ERROR,
}


@fast_frozen_init
@dataclass(frozen=True, slots=True)
class Context:
    """What a handler that takes a second argument (``def handle(message, ctx)``) receives.

    ``ctx.connection`` is a SQLAlchemy 2 ``Connection`` inside the transaction that also
    commits the dedup record (``UniqueKeyTable(..., transactional=True)``), the version row
    (``OptimisticVersion``), the locked row (``PessimisticRowLock``) or, under ``@guarded``
    on SQL, the entity's state: write with ``ctx.connection.execute(...)`` (``sa.text``
    or Core statements) and never commit or roll it back yourself; idemp commits it after
    the handler returns and rolls it back if the handler raises. Other strategies have no
    such transaction, and reading ``ctx.connection`` raises ``RuntimeError`` naming the
    ones that do.

    Also: ``key`` (the business key), ``namespace`` (group/topic, or the decorator's),
    ``takeover`` (True when a claim whose holder overran its deadline was taken over:
    the first run may have had partial effects), ``attempt``, ``handle`` (the strategy's
    own: a fencing token for ``RedissonLock``), ``transition`` under ``@guarded``.
    """

    message: Message
    namespace: str
    key: str
    takeover: bool
    attempt: int  # 1, or more when the strategy re-runs the handler (retry_on)
    handle: Any  # the strategy's: SQL connection (transactional), fencing token, …
    transition: Transition | None = None  # @guarded: the transition being applied
    guard_connection: Any = None  # @guarded: the state store's transaction, if SQL

    @property
    def connection(self) -> Any:
        """The SQL connection whose transaction also commits the dedup record (or the
        strategy's row, or the guard's state)."""
        conn = _connection_of(self.handle) or self.guard_connection
        if conn is None:
            raise RuntimeError(
                "this strategy gives the handler no connection: use UniqueKeyTable(..., "
                "transactional=True), OptimisticVersion or PessimisticRowLock to write in "
                "the strategy's transaction"
            )
        return conn


def _connection_of(handle: Any) -> Any:
    if hasattr(handle, "execute"):  # the SQL connection itself (UniqueKeyTable)
        return handle
    return getattr(handle, "connection", None)  # Versioned, Locked


def _wants_context(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = 0
    for p in params:
        if p.kind is p.VAR_POSITIONAL:
            return True
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            positional += 1
    return positional >= 2


def _resolve_strategy(strategy: Strategy | str) -> Strategy:
    if isinstance(strategy, Strategy):
        return strategy
    if isinstance(strategy, str):
        from idemp.config import strategy_from_url  # config builds strategies from URLs

        return strategy_from_url(strategy)
    raise TypeError(
        f"strategy must be a Strategy, a backend URL or a configured name, not {strategy!r}"
    )


# Steps are made several times per message and never kept: not frozen, whose __init__
# costs twice as much (object.__setattr__ per field).
@dataclass(slots=True)
class _Do:
    """A step of the protocol: a blocking store call (a worker thread for async)."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]


@dataclass(slots=True)
class _Call:
    """A step of the protocol: the user's handler, called or awaited."""

    args: tuple[Any, ...]


Step = _Do | _Call


class _Core:
    """Configuration and the steps shared by the sync, async and batch listeners."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        key: KeySpec,
        strategy: Strategy | str,
        namespace: str | None,
        group: str | None,
        fingerprint: bool | Fingerprinter,
        on_missing_key: MissingKeyPolicy | str,
        dead_letter: DeadLetterSink | None,
        name: str | None,
        pass_context: bool | None,
        guard: Guard | None = None,
    ) -> None:
        self.fn = fn
        self.guard = guard
        self.extractor: KeyExtractor = extractor(key)
        self.strategy = _resolve_strategy(strategy)
        self.namespace = Namespace(fixed=namespace, group=group)
        self.fingerprinter: Fingerprinter | None = None
        self.fingerprint = bool(fingerprint)
        if callable(fingerprint):
            self.fingerprinter = fingerprint
        self.policy = MissingKeyPolicy(on_missing_key)
        if self.policy is MissingKeyPolicy.DEAD_LETTER and dead_letter is None:
            raise ValueError(
                "on_missing_key='dead_letter' needs a dead_letter=sink(message, reason)"
            )
        self.dead_letter = dead_letter
        self.name = name or f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"
        self.pass_context = _wants_context(fn) if pass_context is None else pass_context

    # -- steps ------------------------------------------------------------------------
    def prepare(self, message: Message) -> Job | Result:
        job = self.job_of(message)
        return self.missing(message, job) if isinstance(job, str) else job

    def job_of(self, message: Message) -> Job | str:
        """The message's job, or why it has no usable key (no side effect: the batch
        driver reads every key of a batch before it runs any)."""
        found = self.extractor.extract(message)
        if isinstance(found, Missing):
            return found.reason
        bad = unusable(found)
        if bad is not None:
            return bad
        fp = fingerprint_of(message, self.fingerprinter) if self.fingerprint else None
        return Job(self.namespace.of(message), found, message, fp)

    def missing(self, message: Message, reason: str) -> Result:
        what = self.extractor.description
        text = f"no business key ({what}) in message {describe(message)}: {reason}"
        if self.policy is MissingKeyPolicy.RAISE:
            _stats.log_event(
                logging.WARNING,
                "missing_key",
                listener=self.name,
                msg_id=message.msg_id,
                topic=message.topic,
                detail=f"{text}; raising (reconsume later)",
            )
            raise MissingKeyError(f"{self.name}: {text}")
        if self.policy is MissingKeyPolicy.SKIP:
            return self.done(Outcome.SKIPPED, message, None, detail=text)
        assert self.dead_letter is not None
        try:
            self.dead_letter(message, text)
        except Exception as exc:  # the sink failed: the message must come back
            return self.done(
                Outcome.FAILED, message, None, error=exc, detail="dead-letter sink failed"
            )
        return self.done(Outcome.DEAD_LETTERED, message, None, detail=text)

    def context(self, ticket: Ticket, attempt: int, entered: Entered | None = None) -> Context:
        job = ticket.job
        return Context(
            job.message,
            job.namespace,
            job.key,
            ticket.verdict is Verdict.TAKEOVER,
            attempt,
            ticket.handle,
            None if entered is None else entered.transition,
            None if entered is None else entered.tx.connection,
        )

    def arguments(
        self, message: Message, ticket: Ticket, attempt: int, entered: Entered | None
    ) -> tuple[Any, ...]:
        """The handler's arguments: the message, and its context if it takes one."""
        if not self.pass_context:
            return (message,)
        return (message, self.context(ticket, attempt, entered))

    def steps(self, message: Message) -> Generator[Step, Any, Result]:
        """The protocol for one message, written once for sync and ``async def``
        listeners: it yields what to do (a blocking store call, or the handler) and is
        sent the answer or thrown the exception; ``_drive`` and ``_drive_async`` do it."""
        prepared = self.prepare(message)
        if isinstance(prepared, Result):
            return prepared
        return (yield from self.job_steps(prepared, self.strategy))

    def job_steps(
        self, job: Job, store: Strategy | BatchSession, *, hold_later: bool = False
    ) -> Generator[Step, Any, Result]:
        """The protocol for one prepared job on the strategy, or on a batch session.
        ``hold_later``: a hold is returned uncounted and unlogged (the batch driver may
        still apply it, and counts the holds that stay)."""
        message = job.message
        strategy = self.strategy
        attempt = 0
        while True:
            attempt += 1
            try:
                ticket = yield _Do(store.begin, (job,))
            except StoreError as exc:
                return self.store_error(message, job, exc)
            if not ticket.verdict.runs:
                return self.not_run(ticket)
            try:
                value = yield from self.handler_steps(message, ticket, attempt)
                ok = ack_of(value)
            except BaseException as exc:
                yield _Do(self.abort, (ticket, exc, store))
                if _fatal(exc) or isinstance(exc, asyncio.CancelledError):
                    raise
                if strategy.retry_on and isinstance(exc, strategy.retry_on):
                    if attempt < strategy.max_attempts:
                        continue
                if hold_later and isinstance(exc, AHEAD):  # decided by the batch driver
                    return Result(Outcome.HELD, message, job.key, error=exc, detail=str(exc))
                return self.failed(ticket, exc)
            if not ok:
                return (yield _Do(self.declined, (ticket, value, store)))
            return (yield _Do(self.committed, (ticket, value, store)))

    def handler_steps(
        self, message: Message, ticket: Ticket, attempt: int
    ) -> Generator[Step, Any, Any]:
        """The handler, inside the guard if any (its state load and save are store calls)."""
        guard = self.guard
        if guard is None:
            return (yield _Call(self.arguments(message, ticket, attempt, None)))
        entered = yield _Do(guard.enter, (message, _connection_of(ticket.handle)))
        try:
            value = yield _Call(self.arguments(message, ticket, attempt, entered))
        except BaseException:
            yield _Do(guard.abandon, (entered,))
            raise
        yield _Do(guard.leave, (entered, value))
        return value

    def abort(
        self, ticket: Ticket, error: BaseException | None, store: Strategy | BatchSession
    ) -> None:
        try:
            store.abort(ticket, error)
        except Exception as exc:  # the claim stays until its deadline; the redelivery waits
            _stats.incr(self.name, "store_errors")
            _stats.log_event(
                logging.ERROR, "release_failed", exc=exc, listener=self.name, key=ticket.job.key
            )

    def failed(self, ticket: Ticket, error: BaseException) -> Result:
        if isinstance(error, (GuardDrop, GuardHold, GuardGiveUp)):
            return self.guard_said(ticket.job, error)
        outcome = self.strategy.classify(error) or Outcome.FAILED
        return self.done(
            outcome, ticket.job.message, ticket.job, error=error, detail=type(error).__name__
        )

    def guard_said(self, job: Job, error: GuardDrop | GuardHold | GuardGiveUp) -> Result:
        if isinstance(error, GuardGiveUp):
            return self.done(
                Outcome.DEAD_LETTERED, job.message, job, detail=str(error), to_dlq=True
            )
        if isinstance(error, GuardDrop):
            return self.done(Outcome.DROPPED, job.message, job, detail=str(error))
        assert self.guard is not None
        retry = self.guard.hold_retry
        return self.done(Outcome.HELD, job.message, job, detail=str(error), retry=retry)

    def committed(self, ticket: Ticket, value: Any, store: Strategy | BatchSession) -> Result:
        """After a successful handler: commit, and decide what a commit failure means.
        In a batch session the commit is final only at ``finish``: the batch driver
        counts what it made stick."""
        job = ticket.job
        try:
            store.commit(ticket)
        except StoreError as exc:
            if ticket.atomic:  # the handler's writes rolled back with the record
                return self.done(
                    Outcome.STORE_ERROR, job.message, job, error=exc, detail="commit failed"
                )
            _stats.incr(self.name, "commit_errors")
            _stats.log_event(
                logging.ERROR,
                "commit_failed",
                exc=exc,
                listener=self.name,
                key=job.key,
                detail="effect applied; acked to avoid redoing it",
            )
        except Exception as exc:  # e.g. a fencing token refused at commit
            return self.failed(ticket, exc)
        else:
            if self.guard is not None and store is not self.strategy:
                self.guard.settled(_connection_of(ticket.handle))
        takeover = ticket.verdict is Verdict.TAKEOVER
        if takeover:
            _stats.incr(self.name, "takeovers")
        return self.done(
            Outcome.PROCESSED,
            job.message,
            job,
            value=value,
            takeover=takeover,
            count=store is self.strategy,
        )

    def declined(self, ticket: Ticket, value: Any, store: Strategy | BatchSession) -> Result:
        self.abort(ticket, None, store)
        if consume_result_of(value) is ConsumeResult.DEAD_LETTER:
            job = ticket.job
            return self.done(
                Outcome.DEAD_LETTERED,
                job.message,
                job,
                value=value,
                detail="listener asked to dead-letter",
                to_dlq=True,
            )
        return self.done(
            Outcome.FAILED,
            ticket.job.message,
            ticket.job,
            value=value,
            detail="listener asked to reconsume",
        )

    def done(
        self,
        outcome: Outcome,
        message: Message,
        job: Job | None,
        *,
        value: Any = None,
        error: BaseException | None = None,
        takeover: bool = False,
        detail: str = "",
        count: bool = True,
        to_dlq: bool = False,
        retry: ReconsumeLater | None = None,
    ) -> Result:
        """Count (unless the caller counts a whole batch at once), log, and build the
        result of one message."""
        if count:
            _stats.incr(self.name, outcome.value)
        level = _LEVEL[outcome]
        if _stats.logger.isEnabledFor(level):
            _stats.log_event(
                level,
                outcome.name.lower(),
                exc=error if outcome is Outcome.FAILED else None,
                listener=self.name,
                namespace=job.namespace if job else None,
                key=job.key if job else None,
                msg_id=message.msg_id,
                topic=message.topic,
                reconsume_times=message.reconsume_times,
                takeover=takeover or None,
                error=repr(error) if error is not None else None,
                detail=detail,
            )
        key = job.key if job else None
        return Result(outcome, message, key, value, error, takeover, detail, to_dlq, retry)

    def not_run(self, ticket: Ticket) -> Result:
        job = ticket.job
        return self.done(_VERDICT_OUTCOME[ticket.verdict], job.message, job, detail=ticket.detail)

    def store_error(self, message: Message, job: Job, exc: BaseException) -> Result:
        return self.done(Outcome.STORE_ERROR, message, job, error=exc, detail="claim failed")


def _fatal(exc: BaseException) -> bool:
    return isinstance(exc, (KeyboardInterrupt, SystemExit))


def _held(result: Result | ConsumeResult) -> bool:
    return isinstance(result, Result) and result.outcome is Outcome.HELD


def _applied(result: Result | ConsumeResult) -> bool:
    return isinstance(result, Result) and result.outcome is Outcome.PROCESSED


def _drive(core: _Core, message: Message) -> Result:
    """Run ``core.steps`` synchronously: store calls and the handler in this thread."""
    return _run_steps(core, core.steps(message))


def _run_steps(core: _Core, gen: Generator[Step, Any, Result]) -> Result:
    reply: Any = None
    error: BaseException | None = None
    fn = core.fn
    while True:
        try:
            step = gen.send(reply) if error is None else gen.throw(error)
        except StopIteration as stop:
            result: Result = stop.value
            return result
        try:
            reply = step.fn(*step.args) if type(step) is _Do else fn(*step.args)
            error = None
        except BaseException as exc:
            reply, error = None, exc


async def _drive_async(core: _Core, message: Message) -> Result:
    """Run ``core.steps`` for an ``async def`` handler: store calls are synchronous
    (redis-py, SQLAlchemy) and run in the default executor, so the event loop never
    blocks on a round trip; the handler is awaited."""
    gen = core.steps(message)
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = gen.send(reply) if error is None else gen.throw(error)
        except StopIteration as stop:
            result: Result = stop.value
            return result
        try:
            if type(step) is _Do:
                reply = await asyncio.to_thread(step.fn, *step.args)
            else:
                reply = await core.fn(*step.args)
            error = None
        except BaseException as exc:
            reply, error = None, exc


class _Wrapped:
    """What every wrapped listener exposes: its strategy and name (counters, logs)."""

    def __init__(self, core: _Core) -> None:
        self._core = core
        functools.update_wrapper(cast(Any, self), core.fn)  # subclasses define __call__

    @property
    def strategy(self) -> Strategy:
        return self._core.strategy

    @property
    def name(self) -> str:
        return self._core.name


class IdempotentListener(_Wrapped):
    """A sync listener wrapped by ``@idempotent``: ``listener(message) -> Result``; the
    runners hand it their batches through ``consume_batch``."""

    def __call__(self, message: Message) -> Result:
        return _drive(self._core, message)

    def consume_batch(
        self,
        messages: Sequence[Message],
        *,
        stop_on_failure: bool = False,
        stopping: Callable[[], bool] | None = None,
    ) -> list[Result | ConsumeResult]:
        """A runner's batch: the handler runs once per message, as ``listener(message)``
        would, but the store's work for the whole batch is one transaction (or one round
        trip per step) where the strategy has a batch session (:meth:`Strategy.session`).
        One result per message tried, in order; with ``stop_on_failure`` (orderly queues)
        the list ends at the first message not acked, and once ``stopping()`` is true no
        further message is started (the rest come back from the committed offset)."""
        core = self._core
        found: list[Job | str | Exception] = []
        for message in messages:
            try:
                found.append(core.job_of(message))
            except Exception as exc:  # a key function that raised: at its turn, as alone
                found.append(exc)
        session: BatchSession | None = None
        if len(messages) > 1:
            try:
                session = core.strategy.session([j for j in found if isinstance(j, Job)])
            except StoreError as exc:  # e.g. SQLite's write lock not had: one by one
                _stats.log_event(logging.INFO, "batch_session_failed", exc=exc, listener=core.name)
        if session is None:
            return self._each(messages, found, core.strategy, stop_on_failure, stopping)
        store = _Recording(session)
        guard = core.guard
        conn = session.connection() if guard is not None else None
        if guard is not None and conn is not None:
            guard.preload(messages, conn)
        try:
            out = self._each(messages, found, store, stop_on_failure, stopping)
            return self._finish(store, out)
        finally:
            if guard is not None and conn is not None:
                guard.unload(conn)
            session.close()

    def _each(
        self,
        messages: Sequence[Message],
        found: list[Job | str | Exception],
        store: Strategy | BatchSession,
        stop_on_failure: bool,
        stopping: Callable[[], bool] | None,
    ) -> list[Result | ConsumeResult]:
        redrive = self._core.guard is not None and not stop_on_failure and len(messages) > 1
        out: list[Result | ConsumeResult] = []
        for message, job in zip(messages, found):
            if stopping is not None and stopping():
                break
            result = self._one(message, job, store, redrive)
            out.append(result)
            if stop_on_failure and consume_result_of(result) is not ConsumeResult.SUCCESS:
                break
        if redrive:
            self._redrive(messages, found, store, stopping, out)
        return out

    def _one(
        self,
        message: Message,
        job: Job | str | Exception,
        store: Strategy | BatchSession,
        hold_later: bool,
    ) -> Result | ConsumeResult:
        core = self._core
        try:
            if isinstance(job, Exception):
                raise job
            if isinstance(job, str):
                return core.missing(message, job)
            return _run_steps(core, core.job_steps(job, store, hold_later=hold_later))
        except Exception:  # what the runner does when a listener raises
            _log.exception("listener raised on %s (reconsume later)", message.msg_id)
            return ConsumeResult.RECONSUME_LATER

    def _redrive(
        self,
        messages: Sequence[Message],
        found: list[Job | str | Exception],
        store: Strategy | BatchSession,
        stopping: Callable[[], bool] | None,
        out: list[Result | ConsumeResult],
    ) -> None:
        """Holds resolved inside a concurrent batch. A transition held because its
        predecessor was not applied yet is tried again once a *later* message of the
        batch applied a transition of the same entity (events sent out of order that
        arrived together), in message order, until a round applies nothing. Sent back
        instead, it would return only after the group's retry delay (RocketMQ's first:
        10 s) and cost a send-back and a redelivery. A message past ``max_holds`` waits
        for the batch too before it is dead-lettered (or dropped). Orderly batches stop at
        their first hold instead (``stop_on_failure``). What stays is counted here."""
        core = self._core
        guard = core.guard
        assert guard is not None
        held = [i for i, r in enumerate(out) if _held(r)]
        if held:

            def entity_of(message: Message) -> str | None:
                try:  # a user's key function already ran once for this message
                    found = guard.entity.extract(message)
                except Exception:
                    return None  # not tried again: it stays held
                return found if isinstance(found, str) else None

            entity = {i: e for i in held if (e := entity_of(messages[i])) is not None}
            wanted = set(entity.values())
            advanced: dict[str, int] = {}  # entity -> when it last moved (a try's index)
            for j, r in enumerate(out):
                if _applied(r):
                    e = entity_of(messages[j])
                    if e is not None and e in wanted:
                        advanced[e] = j
            tried = {i: i for i in held}
            clock = len(out)
            while held:
                ready = [i for i in entity if advanced.get(entity[i], -1) > tried[i]]
                if not ready or (stopping is not None and stopping()):
                    break
                for i in ready:
                    tried[i] = clock
                    result = self._one(messages[i], found[i], store, True)
                    out[i] = result
                    if _applied(result):
                        advanced[entity[i]] = clock
                    clock += 1
                held = [i for i in held if _held(out[i])]
                entity = {i: entity[i] for i in held if i in entity}
            reordered = sum(1 for i in tried if _applied(out[i]))
            if reordered:
                _stats.incr(core.name, "reordered", reordered)
        for i in held:  # what the guard said at the last try: held, dead-lettered, dropped
            r, job = out[i], found[i]
            assert isinstance(r, Result) and isinstance(job, Job)
            assert isinstance(r.error, (GuardDrop, GuardHold, GuardGiveUp))
            out[i] = core.guard_said(job, r.error)

    def _finish(
        self, store: _Recording, out: list[Result | ConsumeResult]
    ) -> list[Result | ConsumeResult]:
        """Make the batch stick; count what did. If it could not: atomic work is gone
        (those messages come back), other effects stand (acked, commit errors)."""
        core = self._core
        try:
            store.session.finish()
        except StoreError as exc:
            error: StoreError | None = exc
        else:
            error = None
        refused = {id(t.job.message): exc for t, exc in store.session.refused()}
        processed = 0
        lost_commits = 0
        for i, result in enumerate(out):
            if not isinstance(result, Result) or result.outcome is not Outcome.PROCESSED:
                continue
            ticket = store.committed.get(id(result.message))
            if ticket is not None and id(result.message) in refused:
                out[i] = core.failed(ticket, refused[id(result.message)])
                continue
            if error is not None and ticket is not None and ticket.atomic:
                job = ticket.job
                out[i] = core.done(
                    Outcome.STORE_ERROR, job.message, job, error=error, detail="batch commit failed"
                )
                continue
            if error is not None:
                lost_commits += 1
            processed += 1
        if processed:
            _stats.incr(core.name, Outcome.PROCESSED.value, processed)
        if lost_commits:
            _stats.incr(core.name, "commit_errors", lost_commits)
            _stats.log_event(
                logging.ERROR,
                "commit_failed",
                exc=error,
                listener=core.name,
                detail=f"{lost_commits} effects applied; acked to avoid redoing them",
            )
        return out


class _Recording(BatchSession):
    """A batch session that remembers which ticket each committed message had."""

    def __init__(self, session: BatchSession) -> None:
        self.session = session
        self.committed: dict[int, Ticket] = {}

    def begin(self, job: Job) -> Ticket:
        return self.session.begin(job)

    def commit(self, ticket: Ticket) -> None:
        self.session.commit(ticket)
        self.committed[id(ticket.job.message)] = ticket

    def abort(self, ticket: Ticket, error: BaseException | None) -> None:
        self.session.abort(ticket, error)

    def finish(self) -> None:
        self.session.finish()

    def refused(self) -> Sequence[tuple[Ticket, BaseException]]:
        return self.session.refused()

    def close(self) -> None:
        self.session.close()

    def connection(self) -> Any:
        return self.session.connection()


class AsyncIdempotentListener(_Wrapped):
    """An ``async def`` listener wrapped by ``@idempotent``: ``await listener(message)``.

    Store calls are synchronous (redis-py, SQLAlchemy) and run in the default executor,
    so the event loop never blocks on a round trip.
    """

    async def __call__(self, message: Message) -> Result:
        return await _drive_async(self._core, message)


class IdempotentBatchListener(_Wrapped):
    """A batch listener (``fn(messages)`` or ``fn(messages, contexts)``) for the
    concurrent runner: the whole batch is claimed in one round trip where the strategy
    allows, the handler sees only the messages it owns, and those are committed together.

    The handler is all-or-nothing: if it raises, every claim it held is released and the
    batch comes back (the duplicates in it are absorbed again, cheaply).
    """

    def __call__(self, messages: Sequence[Message]) -> BatchResult:
        core = self._core
        results: list[Result | None] = [None] * len(messages)
        jobs: list[Job] = []
        slots: list[int] = []  # index in messages of each job
        first_of: dict[tuple[str, str], int] = {}  # (namespace, key) → index in jobs
        echoes: list[tuple[int, int]] = []  # (message index, job index) of in-batch repeats
        for i, message in enumerate(messages):
            prepared = core.prepare(message)
            if isinstance(prepared, Result):
                results[i] = prepared
                continue
            ident = (prepared.namespace, prepared.key)
            if ident in first_of:
                echoes.append((i, first_of[ident]))
                continue
            first_of[ident] = len(jobs)
            jobs.append(prepared)
            slots.append(i)
        job_results = self._run(jobs)
        for j, result in enumerate(job_results):
            results[slots[j]] = result
        for i, j in echoes:
            first = job_results[j]
            outcome = Outcome.DUPLICATE if first.outcome is Outcome.PROCESSED else first.outcome
            job = jobs[j]
            results[i] = core.done(outcome, messages[i], job, detail="repeated within the batch")
        final = [r for r in results if r is not None]
        assert len(final) == len(messages)
        return BatchResult(final)

    def _run(self, jobs: list[Job]) -> list[Result]:
        core = self._core
        if not jobs:
            return []
        try:
            tickets = core.strategy.begin_many(jobs)
        except StoreError as exc:
            return [core.store_error(job.message, job, exc) for job in jobs]
        runs = [t.verdict.runs for t in tickets]
        owned = [t for t, r in zip(tickets, runs) if r]
        out: dict[int, Result] = {}
        for n, ticket in enumerate(tickets):
            if not runs[n]:
                out[n] = core.not_run(ticket)
        if owned:
            batch = [t.job.message for t in owned]
            try:
                if core.pass_context:
                    value = core.fn(batch, [core.context(t, 1) for t in owned])
                else:
                    value = core.fn(batch)
                ok = ack_of(value)
            except BaseException as exc:
                self._abort_all(owned, exc)
                if _fatal(exc):
                    raise
                for n, ticket in enumerate(tickets):
                    if ticket.verdict.runs:
                        out[n] = core.failed(ticket, exc)
                return [out[n] for n in range(len(tickets))]
            if not ok:
                self._abort_all(owned, None)
                for n, ticket in enumerate(tickets):
                    if ticket.verdict.runs:
                        out[n] = core.done(
                            Outcome.FAILED,
                            ticket.job.message,
                            ticket.job,
                            detail="listener asked to reconsume",
                        )
                return [out[n] for n in range(len(tickets))]
            self._commit_all(tickets, runs, owned, value, out)
        return [out[n] for n in range(len(tickets))]

    def _abort_all(self, owned: list[Ticket], error: BaseException | None) -> None:
        try:
            self._core.strategy.abort_many(owned, error)
        except Exception as exc:
            _stats.incr(self._core.name, "store_errors")
            _stats.log_event(logging.ERROR, "release_failed", exc=exc, listener=self._core.name)

    def _commit_all(
        self,
        tickets: list[Ticket],
        runs: list[bool],
        owned: list[Ticket],
        value: Any,
        out: dict[int, Result],
    ) -> None:
        core = self._core
        error: StoreError | None = None
        try:
            core.strategy.commit_many(owned)
        except StoreError as exc:
            error = exc
        processed = 0  # counted once for the batch: one counter update, not one per message
        done = core.done
        for n, ticket in enumerate(tickets):
            if not runs[n]:
                continue
            job = ticket.job
            if error is not None and ticket.atomic:
                out[n] = done(
                    Outcome.STORE_ERROR, job.message, job, error=error, detail="commit failed"
                )
                continue
            if error is not None:
                _stats.incr(core.name, "commit_errors")
            takeover = ticket.verdict is Verdict.TAKEOVER
            if takeover:
                _stats.incr(core.name, "takeovers")
            processed += 1
            out[n] = done(
                Outcome.PROCESSED, job.message, job, value=value, takeover=takeover, count=False
            )
        if processed:
            _stats.incr(core.name, Outcome.PROCESSED.value, processed)
        if error is not None and not any(t.atomic for t in owned):
            _stats.log_event(
                logging.ERROR, "commit_failed", exc=error, listener=core.name, detail="batch acked"
            )


def _core_options(
    key: KeySpec,
    strategy: Strategy | str,
    namespace: str | None,
    group: str | None,
    fingerprint: bool | Fingerprinter,
    on_missing_key: MissingKeyPolicy | str,
    dead_letter: DeadLetterSink | None,
    name: str | None,
    pass_context: bool | None,
) -> dict[str, Any]:
    """The ``_Core`` options of ``@idempotent`` and ``@idempotent.batch`` (one place)."""
    return dict(
        key=key,
        strategy=_resolve_strategy(strategy),
        namespace=namespace,
        group=group,
        fingerprint=fingerprint,
        on_missing_key=on_missing_key,
        dead_letter=dead_letter,
        name=name,
        pass_context=pass_context,
    )


class _Idempotent:
    """``@idempotent(key=..., strategy=...)`` and ``@idempotent.batch(...)``.

    Options: ``key`` (an extractor, a callable, ``(Model, "field")``, ``"keys"``,
    ``"property:NAME"``, ``"json:PATH"``), ``strategy`` (a Strategy, a backend URL, or
    a name configured in the settings: ``"orders"`` → ``IDEMP_LISTENERS__orders__…``),
    ``namespace`` (fixed) or ``group`` (default namespace ``<group>/<topic>``),
    ``fingerprint`` (True, or ``fn(message) -> bytes``), ``on_missing_key`` (``"raise"``,
    ``"skip"``, ``"dead_letter"`` with ``dead_letter=sink(message, reason)``), ``name``
    (for counters and logs), ``pass_context`` (default: when the handler takes 2 args).
    """

    def __call__(
        self,
        *,
        key: KeySpec,
        strategy: Strategy | str,
        namespace: str | None = None,
        group: str | None = None,
        fingerprint: bool | Fingerprinter = False,
        on_missing_key: MissingKeyPolicy | str = MissingKeyPolicy.RAISE,
        dead_letter: DeadLetterSink | None = None,
        name: str | None = None,
        pass_context: bool | None = None,
    ) -> Callable[[Callable[..., Any]], Any]:
        options = _core_options(
            key,
            strategy,
            namespace,
            group,
            fingerprint,
            on_missing_key,
            dead_letter,
            name,
            pass_context,
        )

        def wrap(fn: Callable[..., Any]) -> IdempotentListener | AsyncIdempotentListener:
            core = _Core(fn, **options)
            if inspect.iscoroutinefunction(fn):
                return AsyncIdempotentListener(core)
            return IdempotentListener(core)

        return wrap

    def batch(
        self,
        *,
        key: KeySpec,
        strategy: Strategy | str,
        namespace: str | None = None,
        group: str | None = None,
        fingerprint: bool | Fingerprinter = False,
        on_missing_key: MissingKeyPolicy | str = MissingKeyPolicy.RAISE,
        dead_letter: DeadLetterSink | None = None,
        name: str | None = None,
        pass_context: bool | None = None,
    ) -> Callable[[Callable[..., Any]], IdempotentBatchListener]:
        """The batch form: the handler takes a list of messages (and a list of contexts)."""
        options = _core_options(
            key,
            strategy,
            namespace,
            group,
            fingerprint,
            on_missing_key,
            dead_letter,
            name,
            pass_context,
        )

        def wrap(fn: Callable[..., Any]) -> IdempotentBatchListener:
            if inspect.iscoroutinefunction(fn):
                raise TypeError("idempotent.batch wraps sync handlers only")
            return IdempotentBatchListener(_Core(fn, **options))

        return wrap


idempotent = _Idempotent()


def guarded(
    machine: StateMachine,
    *,
    entity: KeySpec,
    target: KeySpec,
    store: StateStore,
    strategy: Strategy | str | None = None,
    key: KeySpec | None = None,
    max_holds: int = 16,
    after_holds: str = "dead_letter",
    hold_retry: ReconsumeLater | None = None,
    namespace: str | None = None,
    group: str | None = None,
    name: str | None = None,
    pass_context: bool | None = None,
) -> Callable[[Callable[..., Any]], IdempotentListener | AsyncIdempotentListener]:
    """``@guarded(machine, entity=…, target=…, store=…)``: apply only allowed transitions.

    ``entity``/``target`` extract the entity id and target state (like ``key=``);
    ``store`` loads and saves states (:class:`idemp.guards.SqlStateStore` or
    :class:`~idemp.guards.CallableStateStore`); ``strategy`` (optional) claims or locks
    around the guard, with ``key`` defaulting to ``<entity>-><target>``. Dropped →
    ``Outcome.DROPPED`` (acked); ahead → ``Outcome.HELD`` (reconsume later) while
    ``message.reconsume_times < max_holds``, then ``after_holds``: ``"dead_letter"``
    (``Outcome.DEAD_LETTERED``: the runner puts it in the group's ``%DLQ%`` for an
    operator to replay; nothing is lost), ``"reconsume"`` (held until the broker's own
    retry limit dead-letters it) or ``"drop"`` (acked and lost: an explicit choice).
    The default ``max_holds`` (16) is RocketMQ's maximum reconsume times. A held message
    comes back on the group's retry schedule (RocketMQ's first: 10 s) unless
    ``hold_retry`` says when (:class:`~idemp.message.ReconsumeLater`: a delay level for
    the concurrent runner, ``after`` seconds for the orderly one). The handler's
    context carries ``ctx.transition``; with a SQL store, ``ctx.connection`` writes in
    the state's transaction. An ``async def`` handler is awaited (``await
    listener(message)``); the state's load and save, like the strategy's calls, run in
    the default executor.
    """
    guard = Guard(
        machine,
        store=store,
        entity=entity,
        target=target,
        max_holds=max_holds,
        after_holds=after_holds,
        hold_retry=hold_retry,
    )
    resolved = NoClaim() if strategy is None else _resolve_strategy(strategy)

    def wrap(fn: Callable[..., Any]) -> IdempotentListener | AsyncIdempotentListener:
        core = _Core(
            fn,
            key=key if key is not None else guard.key(),
            strategy=resolved,
            # The machine's name scopes the claims unless the caller scopes them.
            namespace=machine.name if namespace is None and group is None else namespace,
            group=group,
            fingerprint=False,
            on_missing_key=MissingKeyPolicy.RAISE,
            dead_letter=None,
            name=name,
            pass_context=pass_context,
            guard=guard,
        )
        if inspect.iscoroutinefunction(fn):
            return AsyncIdempotentListener(core)
        return IdempotentListener(core)

    return wrap

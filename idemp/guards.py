"""State-machine guards: a message moves an entity to a target state; only allowed
transitions are applied, each once, in order.

``StateMachine`` declares the states, the allowed transitions and the terminal states and
decides, for the entity's current state and a message's target:

* APPLY: an allowed transition (or an initial state for a new entity);
* DUPLICATE / STALE / DISALLOWED: dropped (``Outcome.DROPPED``), counted, never applied:
  the target is the current state, is behind it, or is not reachable from it at all;
* AHEAD: the target is reachable but not yet (its predecessor has not arrived): held
  (``Outcome.HELD`` → reconsume later) while ``message.reconsume_times < max_holds``,
  then the ``after_holds`` policy: ``"dead_letter"`` (the default: the message goes to
  the group's ``%DLQ%``, where an operator sees and replays it), ``"reconsume"`` (keep
  holding and let the broker's own retry limit dead-letter it) or ``"drop"`` (ack it:
  the transition is lost, only a counter says so).

A state store loads the current state and saves the new one by compare-and-set, in one
transaction with the handler's writes when it can: :class:`SqlStateStore` (its own
transaction, the entity row locked, or the strategy's transaction when the strategy gives
the handler a connection to the same database) or :class:`CallableStateStore`.

Guards run inside the strategy's claim or lock (``@guarded(..., strategy=…)``), so they
compose with every strategy; ``idemp.pipeline`` maps :class:`GuardDrop` and
:class:`GuardHold` to outcomes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from idemp._fastinit import fast_frozen_init
from idemp.keys import KeyExtractor, KeyResult, KeySpec, Missing, extractor
from idemp.message import Message, ReconsumeLater, ack_of
from idemp.strategies._entity_batch import BatchRows
from idemp.strategies._sql import (
    DriverStatement,
    Savepoints,
    busy,
    close_quietly,
    insert_ignore,
    install_sqlite_begin,
    make_engine,
    set_lock_timeout,
    valid_identifier,
)
from idemp.strategies.base import Job, StoreError, Strategy, Ticket, Verdict


class Decision(Enum):
    APPLY = "apply"
    DUPLICATE = "duplicate"  # already in the target state
    STALE = "stale"  # the target is behind the current state
    DISALLOWED = "disallowed"  # not reachable from the current state (or terminal)
    AHEAD = "ahead"  # reachable, but a predecessor is missing


class GuardDrop(Exception):
    """The transition is not applied, ever: the message is acked and counted as dropped."""


class GuardHold(Exception):
    """The transition comes too early: the message comes back later."""


class GuardGiveUp(Exception):
    """Held ``max_holds`` times: the message goes to the group's dead-letter queue."""


class GuardDropAhead(GuardDrop):
    """Held ``max_holds`` times with ``after_holds="drop"``: acked, counted as dropped."""


#: The guard's answers that a predecessor applied meanwhile would change (a batch driver
#: may try such a message again once a later message of its batch moved the entity).
AHEAD = (GuardHold, GuardGiveUp, GuardDropAhead)


AFTER_HOLDS = ("dead_letter", "reconsume", "drop")


class GuardConflict(RuntimeError):
    """The entity's state changed between load and save (a concurrent transition)."""


@fast_frozen_init
@dataclass(frozen=True, slots=True)
class Transition:
    entity: str
    source: str | None  # None: a new entity
    target: str


class StateMachine:
    """``StateMachine("order", {"created": ["driver_assigned"], …}, initial="created")``;
    ``terminal`` defaults to the states without outgoing transitions."""

    def __init__(
        self,
        name: str,
        transitions: Mapping[str, Iterable[str]],
        *,
        initial: str | Iterable[str],
        terminal: Iterable[str] | None = None,
    ) -> None:
        self.name = name
        self.transitions: dict[str, frozenset[str]] = {
            src: frozenset(dsts) for src, dsts in transitions.items()
        }
        states = set(self.transitions)
        for dsts in self.transitions.values():
            states |= dsts
        self.initial = frozenset([initial] if isinstance(initial, str) else initial)
        states |= self.initial
        self.states = frozenset(states)
        if terminal is None:
            terminal = [s for s in states if not self.transitions.get(s)]
        self.terminal = frozenset(terminal)
        unknown = (self.initial | self.terminal) - self.states
        if unknown:
            raise ValueError(f"{name}: unknown states {sorted(unknown)}")
        leaving = [s for s in self.terminal if self.transitions.get(s)]
        if leaving:
            raise ValueError(f"{name}: terminal states with transitions: {sorted(leaving)}")
        self._reach = {s: self._reachable_from(s) for s in self.states}

    def _reachable_from(self, state: str) -> frozenset[str]:
        seen: set[str] = set()
        todo = list(self.transitions.get(state, ()))
        while todo:
            s = todo.pop()
            if s not in seen:
                seen.add(s)
                todo.extend(self.transitions.get(s, ()))
        return frozenset(seen)

    def allowed(self, source: str | None, target: str) -> bool:
        if source is None:
            return target in self.initial
        return target in self.transitions.get(source, ())

    def decide(self, current: str | None, target: str) -> Decision:
        if target not in self.states:
            return Decision.DISALLOWED
        if current == target:
            return Decision.DUPLICATE
        if self.allowed(current, target):
            return Decision.APPLY
        if current is None:
            ahead = any(target in self._reach[i] for i in self.initial)
            return Decision.AHEAD if ahead else Decision.DISALLOWED
        if current not in self.states or current in self.terminal:
            return Decision.DISALLOWED
        if target in self._reach[current]:
            return Decision.AHEAD
        if current in self._reach[target]:
            return Decision.STALE
        return Decision.DISALLOWED


#: The ride-hailing order, the first shipped machine.
RIDE_HAILING_ORDER = StateMachine(
    "ride_hailing_order",
    {
        "created": ["driver_assigned"],
        "driver_assigned": ["driver_departed"],
        "driver_departed": ["driver_arrived"],
        "driver_arrived": ["passenger_picked_up"],
        "passenger_picked_up": ["arrived"],
    },
    initial="created",
)


# -- state stores ------------------------------------------------------------------------


class StateTx(Protocol):
    """One entity's state inside one unit of work."""

    state: str | None
    connection: Any  # the SQL connection the handler may write through, or None

    def save(self, transition: Transition) -> None: ...

    def finish(self, ok: bool) -> None: ...


class StateStore(Protocol):
    def open(self, entity: str, connection: Any) -> StateTx: ...

    # optional, for a runner's batch (SqlStateStore has them): preload(entities,
    # connection) loads the batch's states in its transaction, unload(connection) forgets
    # them, settled(connection) says the last transition saved on it committed


class _SqlTx:
    def __init__(self, store: SqlStateStore, conn: Connection, own: bool, entity: str) -> None:
        self.store, self.connection, self.own, self.entity = store, conn, own, entity
        self.state: str | None = None

    def save(self, transition: Transition) -> None:
        store = self.store
        stmt = store._set_from_none if transition.source is None else store._set_from
        done = stmt.run(
            self.connection,
            {"b_entity": self.entity, "b_source": transition.source, "b_target": transition.target},
        ).rowcount
        if not self.own:  # a batch's transaction: what its next transition may start from
            store._saved(self.connection, self.entity, transition.target if done == 1 else None)
        if done != 1:
            raise GuardConflict(f"{self.entity!r} left {transition.source!r} concurrently")

    def finish(self, ok: bool) -> None:
        if not self.own:
            return  # the strategy's transaction: the strategy commits or rolls back
        try:
            if ok:
                self.connection.commit()
        except SQLAlchemyError as exc:
            raise StoreError(f"state commit failed: {exc}") from exc
        finally:
            close_quietly(self.connection)


class SqlStateStore:
    """Entity states in a table (``id``, ``state``; created if missing). ``open`` locks the
    entity's row (``SELECT … FOR UPDATE``; SQLite: ``BEGIN IMMEDIATE``) in its own
    transaction, or joins the strategy's transaction on the same database."""

    def __init__(
        self,
        engine: str | Engine,
        *,
        table: str = "idemp_entity_state",
        id_column: str = "id",
        state_column: str = "state",
        lock_timeout_s: float = 5.0,
        create: bool = True,
    ) -> None:
        self._owns_engine = isinstance(engine, str)
        if isinstance(engine, str):
            engine = make_engine(engine, lock_timeout_s, 8)
        self.engine: Engine = engine
        install_sqlite_begin(engine)
        self.id_column, self.state_column = id_column, state_column
        self.table = sa.Table(
            valid_identifier(table),
            sa.MetaData(),
            sa.Column(id_column, sa.String(255), primary_key=True),
            sa.Column(state_column, sa.String(64), nullable=True),
        )
        if create:
            self.table.metadata.create_all(engine, checkfirst=True)
        self.lock_timeout_ms = int(lock_timeout_s * 1000)
        t = self.table
        self._lock = DriverStatement(
            sa.select(t.c[state_column])
            .where(t.c[id_column] == sa.bindparam("id"))
            .with_for_update(),
            engine,
        )
        insert = insert_ignore(t, engine.dialect.name)
        self._insert_one = None if insert is None else DriverStatement(insert, engine, [id_column])
        self._rows = BatchRows(t, id_column, engine, lock=True)
        # a batch's preloaded states, by the batch transaction's connection (one batch
        # per connection at a time; each runner thread has its own)
        self._preloaded: dict[int, dict[str, str | None]] = {}
        # a batch's last saved transition, until its message's commit went through
        self._unsettled: dict[int, tuple[str, str]] = {}
        # The compare-and-set statements are built and compiled once and run on the
        # driver's cursor: SQLAlchemy's per-execution work cost more than the UPDATE.
        entity_is = t.c[id_column] == sa.bindparam("b_entity")
        new_state: dict[str, Any] = {state_column: sa.bindparam("b_target")}
        self._set_from = DriverStatement(
            sa.update(t)
            .where(entity_is, t.c[state_column] == sa.bindparam("b_source"))
            .values(new_state),
            engine,
        )
        self._set_from_none = DriverStatement(
            sa.update(t).where(entity_is, t.c[state_column].is_(None)).values(new_state),
            engine,
        )

    def _joins(self, connection: Any) -> bool:
        return (
            isinstance(connection, Connection)
            and (connection.engine is self.engine or connection.engine.url == self.engine.url)
            and connection.in_transaction()
        )

    def preload(self, entities: Sequence[str], connection: Any) -> None:
        """A batch's entity rows created and locked in the batch's transaction, in id
        order, in two statements (in a savepoint: a row held elsewhere undoes only this);
        ``open`` then hands each entity its state without a statement. A second
        transition of the same entity in the batch starts from the state the first saved
        once the pipeline says that message's commit went through (:meth:`settled`; the
        row is the batch's until its COMMIT); a save not settled, or refused, makes the
        next transition read the row again."""
        entities = sorted(set(entities))
        if len(entities) < 2 or not self._joins(connection) or self._rows.insert is None:
            return

        def create_and_read() -> dict[Any, Any]:
            self._rows.create(connection, entities)
            return self._rows.read(connection, entities)

        try:
            rows = Savepoints(connection).attempt("idemp_states", create_and_read) or {}
        except StoreError:
            return  # the batch's transaction is broken: each message will say so
        column = self.state_column
        self._preloaded[id(connection)] = {e: row[column] for e, row in rows.items()}

    def unload(self, connection: Any) -> None:
        self._preloaded.pop(id(connection), None)
        self._unsettled.pop(id(connection), None)

    def _saved(self, connection: Any, entity: str, state: str | None) -> None:
        ahead = self._preloaded.get(id(connection))
        if ahead is None:
            return
        if state is None:  # refused: someone else's state, read it at the next turn
            ahead.pop(entity, None)
        else:
            self._unsettled[id(connection)] = (entity, state)

    def settled(self, connection: Any) -> None:
        """The message that saved a transition in this batch's transaction committed
        (into the batch): its state is where the entity's next transition starts."""
        saved = self._unsettled.pop(id(connection), None)
        ahead = self._preloaded.get(id(connection))
        if saved is not None and ahead is not None:
            ahead[saved[0]] = saved[1]

    def open(self, entity: str, connection: Any) -> StateTx:
        joined = self._joins(connection)
        if joined:
            ahead = self._preloaded.get(id(connection))
            stale = self._unsettled.pop(id(connection), None)
            if stale is not None and ahead is not None:  # saved, then maybe undone
                ahead.pop(stale[0], None)
            if ahead is not None and entity in ahead:
                tx = _SqlTx(self, connection, False, entity)
                tx.state = ahead[entity]
                return tx
        conn: Connection = connection if joined else None  # type: ignore[assignment]
        try:
            if conn is None:
                conn = self.engine.connect()
                conn.begin()
                set_lock_timeout(conn, self.lock_timeout_ms)
            tx = _SqlTx(self, conn, not joined, entity)
            row = self._lock.run(conn, {"id": entity}).fetchone()
            if row is None and self._insert_one is not None:  # lock a new entity too
                self._insert_one.run(conn, {self.id_column: entity})
                row = self._lock.run(conn, {"id": entity}).fetchone()
        except SQLAlchemyError as exc:
            if conn is not None and not joined:
                close_quietly(conn)
            if busy(exc):
                raise GuardHold(f"{entity!r} is being transitioned elsewhere") from exc
            raise StoreError(f"state load of {entity!r} failed: {exc}") from exc
        tx.state = None if row is None else row[0]
        return tx

    def states(self) -> dict[str, str | None]:
        with self.engine.connect() as conn:
            return {r[0]: r[1] for r in conn.execute(sa.select(self.table))}

    def close(self) -> None:
        if self._owns_engine:
            self.engine.dispose()


class _CallableTx:
    connection = None

    def __init__(self, store: CallableStateStore, entity: str, state: str | None) -> None:
        self.store, self.entity, self.state = store, entity, state

    def save(self, transition: Transition) -> None:
        if self.store.saver(self.entity, transition.source, transition.target) is False:
            raise GuardConflict(f"{self.entity!r} left {transition.source!r} concurrently")

    def finish(self, ok: bool) -> None:
        return None


class CallableStateStore:
    """``CallableStateStore(load=fn(entity) -> state | None,
    save=fn(entity, source, target) -> bool | None)``; ``save`` returning False means the
    state was no longer ``source`` (compare-and-set failed)."""

    def __init__(
        self,
        load: Callable[[str], str | None],
        save: Callable[[str, str | None, str], bool | None],
    ) -> None:
        self.loader, self.saver = load, save

    def open(self, entity: str, connection: Any) -> StateTx:
        return _CallableTx(self, entity, self.loader(entity))


# -- the guard ----------------------------------------------------------------------------


class Guard:
    """Decides and records one message's transition around the handler."""

    def __init__(
        self,
        machine: StateMachine,
        *,
        store: StateStore,
        entity: KeySpec,
        target: KeySpec,
        max_holds: int = 16,
        after_holds: str = "dead_letter",
        hold_retry: ReconsumeLater | None = None,
    ) -> None:
        if after_holds not in AFTER_HOLDS:
            raise ValueError(
                f"after_holds={after_holds!r}: expected one of {', '.join(AFTER_HOLDS)}"
            )
        if max_holds < 0:
            raise ValueError(f"max_holds={max_holds}: expected 0 or more")
        if hold_retry is not None and not isinstance(hold_retry, ReconsumeLater):
            raise TypeError(
                f"hold_retry={hold_retry!r}: expected ReconsumeLater(delay_level=..., after=...)"
            )
        self.machine = machine
        self.store = store
        self.entity = extractor(entity)
        self.target = extractor(target)
        self.max_holds = max_holds
        self.after_holds = after_holds
        self.hold_retry = hold_retry

    def key(self) -> KeyExtractor:
        """The default business key of a transition message: ``<entity>-><target>``."""
        return _TransitionKey(self)

    def enter(self, message: Message, connection: Any) -> Entered:
        """Load the state and decide: raise GuardDrop/GuardHold (the state's transaction
        already finished), or return the open transaction and the transition to apply.

        Split from :meth:`leave` so that the pipeline runs the handler in between, sync or
        awaited, with one copy of the guard's steps."""
        entity, target = self.entity.extract(message), self.target.extract(message)
        if isinstance(entity, Missing) or isinstance(target, Missing):
            what = entity if isinstance(entity, Missing) else target
            assert isinstance(what, Missing)
            raise GuardDrop(f"no entity or target state: {what.reason}")
        tx = self.store.open(entity, connection)
        try:
            decision = self.machine.decide(tx.state, target)
            if decision is Decision.AHEAD:
                holds = message.reconsume_times
                if holds < self.max_holds or self.after_holds == "reconsume":
                    raise GuardHold(f"{entity}: {tx.state} -> {target} is ahead (held {holds}x)")
                gave_up = f"{entity}: {tx.state} -> {target} still ahead after {holds} holds"
                if self.after_holds == "drop":
                    raise GuardDropAhead(gave_up)
                raise GuardGiveUp(gave_up)
            if decision is not Decision.APPLY:
                raise GuardDrop(f"{entity}: {tx.state} -> {target} is {decision.value}")
        except BaseException:
            tx.finish(False)
            raise
        return Entered(tx, Transition(entity, tx.state, target))

    def preload(self, messages: Sequence[Message], connection: Any) -> None:
        """A runner's batch: let the store load its entities' states at once, in the
        batch's transaction. Best effort: what is not loaded is loaded at its turn."""
        preload = getattr(self.store, "preload", None)
        if preload is None:
            return
        entities = [self.entity.extract(m) for m in messages]
        try:
            preload([e for e in entities if isinstance(e, str)], connection)
        except Exception:  # a store of the user's: each message loads its own state
            return

    def unload(self, connection: Any) -> None:
        unload = getattr(self.store, "unload", None)
        if unload is not None:
            unload(connection)

    def settled(self, connection: Any) -> None:
        """A batch's message committed (into the batch): a store that preloaded states
        may start the entity's next transition from the one it saved."""
        settled = getattr(self.store, "settled", None)
        if settled is not None and connection is not None:
            settled(connection)

    @staticmethod
    def leave(entered: Entered, value: Any) -> None:
        """After a handler that returned ``value``: save the transition if it acked, and
        finish the state's transaction (committed only if saved)."""
        ok = False
        try:
            if ack_of(value):
                entered.tx.save(entered.transition)
                ok = True
        finally:
            entered.tx.finish(ok)

    @staticmethod
    def abandon(entered: Entered) -> None:
        """The handler raised: nothing is saved, the state's transaction rolls back."""
        entered.tx.finish(False)

    def run(self, message: Message, connection: Any, call: Callable[[Transition, Any], Any]) -> Any:
        """Enter, run ``call`` (the handler, given the transition and the store's
        connection), leave: for callers without the pipeline."""
        entered = self.enter(message, connection)
        try:
            value = call(entered.transition, entered.tx.connection)
        except BaseException:
            self.abandon(entered)
            raise
        self.leave(entered, value)
        return value


@fast_frozen_init
@dataclass(frozen=True, slots=True)
class Entered:
    """A guard passed: the state's open transaction and the transition to apply."""

    tx: StateTx
    transition: Transition


class _TransitionKey(KeyExtractor):
    def __init__(self, guard: Guard) -> None:
        self.guard = guard
        self.description = f"{guard.entity.description} -> {guard.target.description}"

    def extract(self, message: Message) -> KeyResult:
        entity = self.guard.entity.extract(message)
        if isinstance(entity, Missing):
            return entity
        target = self.guard.target.extract(message)
        if isinstance(target, Missing):
            return target
        return f"{entity}->{target}"


class NoClaim(Strategy):
    """For ``@guarded`` without a strategy: the guard alone decides."""

    name = "none"

    def begin(self, job: Job) -> Ticket:
        return Ticket(job, Verdict.RUN)

    def commit(self, ticket: Ticket) -> None:
        return None

    def abort(self, ticket: Ticket, error: BaseException | None) -> None:
        return None

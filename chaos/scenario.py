"""The chaos run's plan: what is sent, and which faults are injected when. Pure and seeded.

Three topics, one consumer group each, one strategy each:

* ``ChaosPay`` (concurrent): payments, one business key each; unique-key table on
  PostgreSQL in transactional mode (dedup row and effect row in one transaction).
* ``ChaosSeq`` (orderly, sharding key = stream): numbered events of a stream; Redis flag.
  The effect's own transaction also advances the stream's cursor, so a repeat that the
  flag cannot see (a SIGKILL between effect and flag commit, a Redis restart without
  persistence) is caught by the business data; an event applied ahead of its
  predecessor is recorded as a gap: an order violation the verdict counts.
* ``ChaosRides`` (concurrent): ride-hailing order transitions; ``@guarded`` by the ride
  state machine with the optimistic-version strategy (version row, state row and effect
  row in one PostgreSQL transaction).
* ``ChaosPay5``: payments consumed by RocketMQ 5's official client (a PushConsumer in a
  process of its own, POP over the broker's gRPC endpoint), sent by the same 4.x
  producer; unique-key table on PostgreSQL in transactional mode. Its process is among
  those the consumer kills pick.

Faults are placed at points of the consumption progress (share of expected effects
applied), so the same seed gives the same faults in the same order, whatever the speed.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

PAY_TOPIC = "ChaosPay"
SEQ_TOPIC = "ChaosSeq"
RIDES_TOPIC = "ChaosRides"
PAY_GROUP = "chaos-pay"
SEQ_GROUP = "chaos-seq"
RIDES_GROUP = "chaos-rides"
PAY5_TOPIC = "ChaosPay5"
PAY5_GROUP = "chaos-pay5"

RIDE_STATES: tuple[str, ...] = (
    "created",
    "driver_assigned",
    "driver_departed",
    "driver_arrived",
    "passenger_picked_up",
    "arrived",
)

KILL = "kill_consumer"
BROKER = "restart_broker"
REDIS = "restart_redis"
POSTGRES = "restart_postgres"
ADD = "add_consumer"
REMOVE = "remove_consumer"


@dataclass(frozen=True, slots=True)
class Send:
    topic: str
    key: str
    body: bytes
    sharding: str | None  # orderly topic: the sharding key
    duplicate: bool = False  # a producer retry: same key and body, new msgId


@dataclass(frozen=True, slots=True)
class Fault:
    at: float  # share of the expected effects applied when it fires
    kind: str
    target: int  # kill: which running consumer (index modulo the running ones)


@dataclass
class Plan:
    seed: int
    pay: list[Send] = field(default_factory=list)
    seq: list[Send] = field(default_factory=list)
    rides: list[Send] = field(default_factory=list)
    pay5: list[Send] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    streams: int = 0
    orders: int = 0

    @property
    def lanes(self) -> list[list[Send]]:
        """One producer thread per topic: a lane's sends go out in this order."""
        return [self.pay, self.seq, self.rides, self.pay5]

    @property
    def messages(self) -> int:
        """Distinct business messages (each must take effect exactly once)."""
        return sum(1 for lane in self.lanes for s in lane if not s.duplicate)

    @property
    def duplicates(self) -> int:
        return sum(1 for lane in self.lanes for s in lane if s.duplicate)

    def count(self, kind: str) -> int:
        return sum(1 for f in self.faults if f.kind == kind)


def _body(**fields: object) -> bytes:
    return json.dumps(fields, separators=(",", ":")).encode()


def make_plan(
    messages: int,
    *,
    seed: int,
    kills: int,
    broker_restarts: int,
    redis_restarts: int,
    postgres_restarts: int,
    duplicate_rate: float = 0.02,
    stream_length: int = 40,
) -> Plan:
    """``messages`` business messages: 30 % payments, 10 % payments for the 5.x consumer,
    30 % stream events, 30 % ride transitions (rounded to whole streams and orders),
    ``duplicate_rate`` of them sent twice."""
    if messages < 100:
        raise ValueError("at least 100 messages")
    rng = random.Random(seed)
    plan = Plan(seed)
    n_pay5 = messages // 10
    n_pay = messages * 4 // 10 - n_pay5
    plan.streams = max(4, (messages * 3 // 10) // stream_length)
    plan.orders = max(
        4, (messages - n_pay - n_pay5 - plan.streams * stream_length) // len(RIDE_STATES)
    )

    def emit(lane: list[Send], send: Send) -> None:
        lane.append(send)
        if rng.random() < duplicate_rate:
            lane.append(Send(send.topic, send.key, send.body, send.sharding, duplicate=True))

    for i in range(n_pay):
        key = f"pay-{i}"
        emit(plan.pay, Send(PAY_TOPIC, key, _body(id=key, cents=rng.randint(1, 99_999)), None))
    for i in range(n_pay5):
        key = f"pay5-{i}"
        emit(plan.pay5, Send(PAY5_TOPIC, key, _body(id=key, cents=rng.randint(1, 99_999)), None))
    # Streams interleaved at random, each stream's events in order.
    cursors = [0] * plan.streams
    live = list(range(plan.streams))
    while live:
        s = rng.choice(live)
        n = cursors[s]
        stream = f"stream-{s}"
        emit(plan.seq, Send(SEQ_TOPIC, f"{stream}#{n}", _body(stream=stream, n=n), stream))
        cursors[s] += 1
        if cursors[s] == stream_length:
            live.remove(s)
    # Ride orders interleaved too, each order's transitions in the machine's order.
    steps = [0] * plan.orders
    live = list(range(plan.orders))
    while live:
        o = rng.choice(live[:8])  # a few orders in flight at a time, as in real traffic
        order = f"ride-{o}"
        state = RIDE_STATES[steps[o]]
        emit(
            plan.rides,
            Send(RIDES_TOPIC, f"{order}->{state}", _body(order=order, state=state), None),
        )
        steps[o] += 1
        if steps[o] == len(RIDE_STATES):
            live.remove(o)

    kinds = (
        [KILL] * kills
        + [BROKER] * broker_restarts
        + [REDIS] * redis_restarts
        + [POSTGRES] * postgres_restarts
        + [ADD, REMOVE]
    )
    rng.shuffle(kinds)
    points = sorted(rng.uniform(0.05, 0.85) for _ in kinds)
    # The consumer added is removed later: swap them if the shuffle put them the wrong way.
    if kinds.index(REMOVE) < kinds.index(ADD):
        a, r = kinds.index(ADD), kinds.index(REMOVE)
        kinds[a], kinds[r] = kinds[r], kinds[a]
    plan.faults = [Fault(at, kind, rng.randrange(1 << 16)) for at, kind in zip(points, kinds)]
    return plan

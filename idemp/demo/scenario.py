"""The demo's event stream: ride-hailing orders and the faults injected into it.

Pure and deterministic (a seed): the same options always give the same sends, so a
test can assert exact figures. Half of the orders (even numbers) go to the
*dispatch* topic, consumed concurrently; the other half to the *trips* topic, sent
orderly by order id and consumed by the OrderlyRunner.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

#: The states of an order, in the only order the guard applies them.
STATES: tuple[str, ...] = (
    "created",
    "driver_assigned",
    "driver_departed",
    "driver_arrived",
    "passenger_picked_up",
    "arrived",
)

POISON_ORDER = "order-poison"


@dataclass(frozen=True, slots=True)
class Event:
    order: str
    state: str
    fare: str = "12.50"

    @property
    def key(self) -> str:
        """The business key (message KEYS): one per transition."""
        return f"{self.order}->{self.state}"

    def body(self) -> bytes:
        return json.dumps({"order": self.order, "state": self.state, "fare": self.fare}).encode()


@dataclass
class Plan:
    orders: int
    dispatch: list[Event] = field(default_factory=list)  # concurrent topic, in send order
    trips: list[Event] = field(default_factory=list)  # orderly topic, in send order
    dispatch_orders: int = 0
    trips_orders: int = 0
    producer_retries: int = 0  # extra sends: same key and body, new msgId
    shuffled_orders: int = 0  # dispatch orders whose events were sent out of order
    poison: int = 0

    @property
    def expected_effects(self) -> int:
        return self.orders * len(STATES)

    @property
    def messages(self) -> int:
        return len(self.dispatch) + len(self.trips)


def make_plan(
    orders: int, *, seed: int = 7, retry_rate: float = 0.02, shuffle_rate: float = 0.05
) -> Plan:
    from idemp.guards import RIDE_HAILING_ORDER  # SQLAlchemy: not at `idemp` start-up

    if not all(RIDE_HAILING_ORDER.allowed(a, b) for a, b in zip(STATES, STATES[1:])):
        raise AssertionError("STATES must follow idemp.guards.RIDE_HAILING_ORDER")
    rng = random.Random(seed)
    plan = Plan(orders)
    for i in range(orders):
        order = f"order-{i}"
        events = [Event(order, s) for s in STATES]
        dispatch = i % 2 == 0
        if dispatch:
            plan.dispatch_orders += 1
            if rng.random() < shuffle_rate:
                shuffled = events[:]
                while shuffled == events:
                    rng.shuffle(shuffled)
                events = shuffled
                plan.shuffled_orders += 1
        else:
            plan.trips_orders += 1
        out = plan.dispatch if dispatch else plan.trips
        for ev in events:
            out.append(ev)
            if rng.random() < retry_rate:  # the ack was "lost": the producer sends again
                out.append(ev)
                plan.producer_retries += 1
    # A poison message: a valid transition of its own order, with a fare no handler
    # can parse. It fails on every delivery and ends in %DLQ% after the retries. Its 17
    # deliveries are at least a retry delay apart (1 s in the demo, RocketMQ's shortest
    # delay level), ~20 s in all: sent first, the chain runs beside the consumption.
    # (Sent a third in, it outlasted the takeover by seconds; 5 % in, a copy the killed
    # worker had not committed restarted the chain in the takeover from an early step.)
    plan.dispatch.insert(0, Event(POISON_ORDER, "created", "free!!"))
    plan.poison = 1
    return plan

"""Ride-hailing order states: the state-machine guard.

created → driver_assigned → driver_departed → driver_arrived → passenger_picked_up →
arrived. Events arrive shuffled and duplicated; the guard applies only allowed
transitions, in order: a stale or repeated one is dropped (acked, counted), one that
comes before its predecessor is held (reconsume later) until the predecessor is applied.

    python examples/ride_hailing_states.py
"""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

from _embedded import broker, producer, send, settings, wait_until

from idemp import Message, guarded, stats
from idemp.guards import RIDE_HAILING_ORDER, SqlStateStore
from idemp.runners import ConcurrentRunner

TOPIC, GROUP = "RideOrderEvents", "ride-states"
STATES = [
    "created",
    "driver_assigned",
    "driver_departed",
    "driver_arrived",
    "passenger_picked_up",
    "arrived",
]
ORDERS = 10


def main() -> int:
    rng = random.Random(3)
    applied: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp, broker() as namesrv:
        store = SqlStateStore(f"sqlite:///{Path(tmp) / 'rides.db'}")

        @guarded(
            RIDE_HAILING_ORDER,
            entity="json:$.order",
            target="json:$.state",
            store=store,
            name="ride-states",
        )
        def on_event(message: Message) -> None:
            event = message.json()
            applied.append((event["order"], event["state"]))  # e.g. notify the passenger

        p = producer(namesrv)
        for i in range(ORDERS):
            events = [{"order": f"ride-{i}", "state": s} for s in STATES]
            rng.shuffle(events)  # out of order
            events.append(events[0])  # and one duplicate
            for e in events:
                send(p, TOPIC, json.dumps(e), f"ride-{i}:{e['state']}")
        p.shutdown()
        consumer, client = settings(namesrv, GROUP)
        consumer.consume_thread_count = 1  # applied[] is appended without a lock
        runner = ConcurrentRunner(on_event, settings=consumer, client=client)
        runner.subscribe(TOPIC)
        runner.start()
        try:
            wait_until(lambda: len(applied) == ORDERS * len(STATES), 90, "every transition")
        finally:
            runner.shutdown()
        final = store.states()
        store.close()
    in_order = all([s for o, s in applied if o == f"ride-{i}"] == STATES for i in range(ORDERS))
    c = stats("ride-states")
    print(
        f"applied {len(applied)} transitions, every order in the machine's order: {in_order}; "
        f"final states {sorted(set(final.values()), key=str)}; held {c['held']}, "
        f"dropped {c['guard_drops']}"
    )
    return 0 if in_order and set(final.values()) == {"arrived"} else 1


if __name__ == "__main__":
    raise SystemExit(main())

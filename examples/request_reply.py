"""Request-reply (RocketMQ's ``producer.request``): a fare service answers quotes.

The requester sends a quote request and waits for its reply; the service consumes the
request topic like any other and answers with ``create_reply(message, body)``, which the
broker pushes straight back to the waiting requester. The quote's side effect (recording
that the quote was given) sits behind ``@idempotent``, so a redelivered request is not
recorded twice; each request still gets its answer.

    python examples/request_reply.py
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from _embedded import broker, producer, send, settings

from idemp import Message, idempotent, stats
from idemp.client import OutMessage, Producer, create_reply
from idemp.runners import ConcurrentRunner
from idemp.strategies import UniqueKeyTable

TOPIC, GROUP = "FareQuotes", "fare-service"
RIDES = 5


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp, broker() as namesrv:
        strategy = UniqueKeyTable(f"sqlite:///{Path(tmp) / 'quotes.db'}")
        service_out = producer(namesrv)
        send(service_out, TOPIC, "{}", "warm-up")  # the topic exists before the service starts

        @idempotent(key="json:$.ride", strategy=strategy, name="quotes")
        def record(message: Message) -> None:
            pass  # the quote's own effect (a row, an event) goes here, once per ride

        def quote(message: Message) -> None:
            request = message.json()
            if "ride" not in request:
                return  # the warm-up message is no request
            record(message)
            fare = {"ride": request["ride"], "cents": 250 + 120 * request["km"]}
            service_out.send(create_reply(message, json.dumps(fare).encode()))

        consumer, client = settings(namesrv, GROUP)
        runner = ConcurrentRunner(quote, settings=consumer, client=client)
        runner.subscribe(TOPIC)
        runner.start()
        requester = Producer(namesrv, "fare-requester").start()
        try:
            fares = []
            for ride in range(RIDES):
                body = json.dumps({"ride": f"r-{ride}", "km": ride + 1}).encode()
                reply = requester.request(OutMessage(TOPIC, body), timeout=30)
                fares.append(reply.json())
        finally:
            requester.shutdown()
            runner.shutdown()
            service_out.shutdown()
    own = [f["ride"] for f in fares] == [f"r-{i}" for i in range(RIDES)]
    print(
        f"quotes {len(fares)} answered, each by its own reply: {own}; "
        f"fares {[f['cents'] for f in fares]}; recorded {stats('quotes')['processed']}"
    )
    return 0 if own else 1


if __name__ == "__main__":
    raise SystemExit(main())

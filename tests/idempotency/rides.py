"""The ride-hailing order machine as the guard tests drive it: one transition per
message (a JSON body with the order and its target state), guarded by order."""

from __future__ import annotations

import json
import uuid
from typing import Any

from idemp import Message, guarded
from idemp.guards import RIDE_HAILING_ORDER, StateStore


def order_msg(order: str, state: str) -> Message:
    body = json.dumps({"order": order, "state": state}).encode()
    return Message("Orders", body, msg_id=uuid.uuid4().hex)


def ride_guarded(store: StateStore, **options: Any) -> Any:
    """``@guarded`` by the ride-hailing machine, the entity and target read from
    :func:`order_msg`'s body; ``options`` are each test's own (strategy, holds, name)."""
    return guarded(
        RIDE_HAILING_ORDER, entity="json:order", target="json:state", store=store, **options
    )

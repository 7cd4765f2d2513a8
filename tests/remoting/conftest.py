"""Fixtures for the remoting codec tests (golden capture lookups)."""

from __future__ import annotations

from typing import Any

import pytest

from idemp.remoting import decode_properties

from .golden import FRAMES


@pytest.fixture(scope="session")
def golden_frames() -> list[dict[str, Any]]:
    return FRAMES


@pytest.fixture(scope="session")
def send_msg_ids() -> dict[str, str]:
    """UNIQ_KEY of each SEND_MESSAGE request -> the msgId in the broker's response.

    Requests and responses are paired by (connection, opaque), as the client does.
    """
    requests = {
        (f["conn"], f["header"]["opaque"]): f
        for f in FRAMES
        if f["header"]["code"] == 10 and not f["header"]["flag"] & 1
    }
    out: dict[str, str] = {}
    for f in FRAMES:
        h = f["header"]
        req = requests.get((f["conn"], h["opaque"]))
        if req is not None and h["flag"] & 1:
            uniq = decode_properties(req["header"]["extFields"]["properties"])["UNIQ_KEY"]
            out[uniq] = h["extFields"]["msgId"]
    return out


@pytest.fixture(scope="session")
def send_requests() -> dict[str, dict[str, Any]]:
    """UNIQ_KEY -> the SEND_MESSAGE request frame that carried it."""
    return {
        decode_properties(f["header"]["extFields"]["properties"])["UNIQ_KEY"]: f
        for f in FRAMES
        if f["header"]["code"] == 10 and not f["header"]["flag"] & 1
    }

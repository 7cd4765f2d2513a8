"""The golden capture: frames exchanged by the official C++ client and RocketMQ 4.9.7.

``data/golden_frames.jsonl`` holds one JSON object per frame as it crossed the wire
(``header_raw`` is the exact header text, ``body_hex`` the exact body).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data" / "golden_frames.jsonl"


def load_frames() -> list[dict[str, Any]]:
    with DATA.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


FRAMES = load_frames()


def body(frame: dict[str, Any]) -> bytes:
    return bytes.fromhex(frame["body_hex"])


def wire(frame: dict[str, Any]) -> bytes:
    """``int32 len | int32 serType<<24|hdrLen | header | body``, rebuilt from the capture."""
    header = frame["header_raw"].encode("utf-8")
    payload = body(frame)
    return (
        struct.pack(">ii", 4 + len(header) + len(payload), (frame["serType"] << 24) | len(header))
        + header
        + payload
    )


def is_message_body(frame: dict[str, Any]) -> bool:
    """A PULL response or CHECK_TRANSACTION_STATE body: stored records (magic DAA320A7)."""
    raw = body(frame)
    return len(raw) >= 8 and raw[4:8] == bytes.fromhex("DAA320A7")

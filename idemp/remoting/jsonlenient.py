"""JSON as fastjson writes it for RocketMQ: map keys may be bare integers (``{0:"a"}``).

Python's ``json`` rejects that, so bare integer keys are quoted first. Strings are
skipped over exactly, so their content is never touched.
"""

from __future__ import annotations

import json
import re
from typing import Any

_BARE_KEY = re.compile(r"([{,]\s*)(-?\d+)(\s*:)")


def loads(text: str | bytes) -> Any:
    if isinstance(text, (bytes, bytearray, memoryview)):
        text = bytes(text).decode("utf-8")
    try:
        return json.loads(text)
    except ValueError:
        pass
    return json.loads(_quote_bare_keys(text))


def _quote_bare_keys(text: str) -> str:
    out: list[str] = []
    i = 0
    n = len(text)
    start = 0
    while i < n:
        c = text[i]
        if c == '"':
            out.append(_BARE_KEY.sub(r'\1"\2"\3', text[start:i]))
            j = i + 1
            while j < n:
                if text[j] == "\\":
                    j += 2
                    continue
                if text[j] == '"':
                    break
                j += 1
            out.append(text[i : j + 1])
            i = j + 1
            start = i
            continue
        i += 1
    out.append(_BARE_KEY.sub(r'\1"\2"\3', text[start:]))
    return "".join(out)


class ObjectKeyMap(list[tuple[dict[str, Any], Any]]):
    """A map whose keys are objects (a MessageQueue), as fastjson writes one:
    ``{{"brokerName":"b","queueId":0,"topic":"t"}:{...}}``. Not JSON, but what Java's
    admin tools parse (``TopicStatsTable``, ``ConsumeStats``, ``ResetOffsetBody``)."""


def dumps(value: Any) -> str:
    """JSON as fastjson writes it: keys sorted, no spaces, ObjectKeyMap keys as objects."""
    if isinstance(value, ObjectKeyMap):
        items = (f"{dumps(k)}:{dumps(v)}" for k, v in value)
        return "{" + ",".join(items) + "}"
    if isinstance(value, dict):
        items = (f"{json.dumps(str(k))}:{dumps(v)}" for k, v in sorted(value.items()))
        return "{" + ",".join(items) + "}"
    if isinstance(value, (list, tuple, set, frozenset)):
        seq = sorted(value) if isinstance(value, (set, frozenset)) else value
        return "[" + ",".join(dumps(v) for v in seq) + "]"
    return json.dumps(value, separators=(",", ":"))


def mq(topic: str, broker_name: str, queue_id: int) -> dict[str, Any]:
    """A MessageQueue as its JSON object."""
    return {"brokerName": broker_name, "queueId": queue_id, "topic": topic}

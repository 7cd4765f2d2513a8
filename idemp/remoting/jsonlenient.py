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


def loads_fastjson(text: str | bytes) -> Any:
    """Parse what fastjson writes, object keys included: a map whose keys are objects
    comes back as an :class:`ObjectKeyMap` of (key dict, value) pairs; bare integer
    keys as strings, as :func:`loads` has them."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        text = bytes(text).decode("utf-8")
    parser = _Parser(text)
    value = parser.value()
    parser.skip()
    if parser.i != len(text):
        raise ValueError(f"extra data at {parser.i}")
    return value


class _Parser:
    _LITERALS = {"true": True, "false": False, "null": None}

    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0
        self.decoder = json.JSONDecoder()

    def skip(self) -> None:
        while self.i < len(self.text) and self.text[self.i] in " \t\r\n":
            self.i += 1

    def value(self) -> Any:
        self.skip()
        if self.i >= len(self.text):
            raise ValueError("unexpected end")
        c = self.text[self.i]
        if c == "{":
            return self.obj()
        if c == "[":
            self.i += 1
            items: list[Any] = []
            self.skip()
            if self.text.startswith("]", self.i):
                self.i += 1
                return items
            while True:
                items.append(self.value())
                self.skip()
                if self.text.startswith(",", self.i):
                    self.i += 1
                    continue
                if self.text.startswith("]", self.i):
                    self.i += 1
                    return items
                raise ValueError(f"expected , or ] at {self.i}")
        for word, literal in self._LITERALS.items():
            if self.text.startswith(word, self.i):
                self.i += len(word)
                return literal
        parsed, end = self.decoder.raw_decode(self.text, self.i)  # a string or number
        self.i = end
        return parsed

    def obj(self) -> Any:
        self.i += 1  # {
        plain: dict[str, Any] = {}
        pairs = ObjectKeyMap()
        self.skip()
        if self.text.startswith("}", self.i):
            self.i += 1
            return plain
        while True:
            self.skip()
            c = self.text[self.i]
            if c == "{":
                key: Any = self.obj()
            elif c == '"':
                key, self.i = self.decoder.raw_decode(self.text, self.i)
            else:  # a bare number key
                start = self.i
                while self.i < len(self.text) and self.text[self.i] not in ":":
                    self.i += 1
                key = self.text[start : self.i].strip()
            self.skip()
            if not self.text.startswith(":", self.i):
                raise ValueError(f"expected : at {self.i}")
            self.i += 1
            val = self.value()
            if isinstance(key, dict):
                pairs.append((key, val))
            else:
                plain[str(key)] = val
            self.skip()
            if self.text.startswith(",", self.i):
                self.i += 1
                continue
            if self.text.startswith("}", self.i):
                self.i += 1
                return pairs if pairs else plain
            raise ValueError(f"expected , or }} at {self.i}")

"""Business keys: where a message's idempotency key comes from, and what if it has none.

The key is never the msgId alone: a producer retry sends the same business message with
a new msgId. Extractors return ``None`` (with a reason) when the key is absent; the
listener's missing-key policy then decides: raise (default), skip, or dead-letter.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from idemp.message import Message

RETRY_TOPIC_PREFIX = "%RETRY%"
RETRY_TOPIC_PROPERTY = "RETRY_TOPIC"  # the original topic of a %RETRY% redelivery


class MissingKeyError(LookupError):
    """A message has no business key and the listener's policy is to raise."""


class MissingKeyPolicy(str, Enum):
    RAISE = "raise"
    SKIP = "skip"
    DEAD_LETTER = "dead_letter"


class Missing:
    """Why an extractor found no key (kept for the error message and the log)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


KeyResult = str | Missing


class KeyExtractor:
    """Base of the extractors: ``extract(message)`` → the key or a :class:`Missing`."""

    description = "key"

    def extract(self, message: Message) -> KeyResult:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.description}>"


class MessageKeys(KeyExtractor):
    """The message's ``KEYS`` (space-separated); by default the first one."""

    def __init__(self, index: int = 0) -> None:
        self.index = index
        self.description = f"message keys[{index}]"

    def extract(self, message: Message) -> KeyResult:
        keys = message.keys
        if len(keys) > self.index and keys[self.index]:
            return keys[self.index]
        return Missing(f"the message has no key at index {self.index} (keys={list(keys)})")


class Property(KeyExtractor):
    """A user property of the message: ``Property("orderId")`` (``key="property:orderId"``)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.description = f"property {name!r}"

    def extract(self, message: Message) -> KeyResult:
        value = message.properties.get(self.name)
        if value:
            return value
        return Missing(f"the message has no property {self.name!r}")


_PATH_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _parse_path(path: str) -> list[str | int]:
    text = path[2:] if path.startswith("$.") else path.lstrip("$")
    parts: list[str | int] = []
    pos = 0
    for match in _PATH_PART.finditer(text):
        gap = text[pos : match.start()]
        if gap not in ("", "."):
            raise ValueError(f"bad JSON path {path!r} near {gap!r}")
        parts.append(int(match.group(2)) if match.group(2) is not None else match.group(1))
        pos = match.end()
    if not parts or text[pos:]:
        raise ValueError(f"bad JSON path {path!r}")
    return parts


def _scalar_key(value: Any) -> str | None:
    if isinstance(value, bool) or value is None or isinstance(value, (dict, list)):
        return None
    text = str(value)
    return text or None


_PARSED = threading.local()  # this thread's recently parsed bodies
_PARSED_BODIES = 64  # a runner's batch, and its messages' extractors after it
_PARSED_SIZE = 64 * 1024  # larger bodies are parsed again rather than kept


def _json_of(body: bytes) -> Any:
    """A body parsed once for all its JSON paths: ``@guarded`` reads the entity and the
    target of every message, and the entities of a batch ahead of it (three parses of
    each body, ~7 % of a SQLite batch message's CPU). By the body's identity, per thread;
    the parsed value is only read."""
    cache: dict[int, tuple[bytes, Any]] | None = getattr(_PARSED, "bodies", None)
    if cache is None:
        cache = _PARSED.bodies = {}
    hit = cache.get(id(body))
    if hit is not None and hit[0] is body:
        return hit[1]
    node = json.loads(body)
    if len(body) <= _PARSED_SIZE:
        if len(cache) >= _PARSED_BODIES:
            cache.clear()
        cache[id(body)] = (body, node)
    return node


class JsonPath(KeyExtractor):
    """A path into a JSON body: ``order.id``, ``$.items[0].sku``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.parts = _parse_path(path)
        self.description = f"JSON path {path!r}"

    def extract(self, message: Message) -> KeyResult:
        try:
            node: Any = _json_of(message.body)
        except ValueError as exc:
            return Missing(f"the body is not JSON ({exc})")
        except RecursionError:  # a hostile body: [[[[... nested past the stack
            return Missing("the body is JSON nested too deeply to parse")
        for part in self.parts:
            try:
                node = node[part]
            except (KeyError, IndexError, TypeError):
                return Missing(f"the JSON body has no {self.path!r}")
        key = _scalar_key(node)
        return key if key is not None else Missing(f"{self.path!r} is not a scalar: {node!r}")


class ModelField(KeyExtractor):
    """A field of a pydantic model validated from the JSON body."""

    def __init__(self, model: Any, field: str) -> None:
        if not hasattr(model, "model_validate_json"):
            raise TypeError(f"{model!r} is not a pydantic v2 model")
        if field not in model.model_fields:
            raise ValueError(f"{model.__name__} has no field {field!r}")
        self.model = model
        self.field = field
        self.description = f"{model.__name__}.{field}"

    def extract(self, message: Message) -> KeyResult:
        try:
            instance = self.model.model_validate_json(message.body)
        except ValueError as exc:  # pydantic.ValidationError is a ValueError
            first = str(exc).splitlines()[0]
            return Missing(f"the body is not a valid {self.model.__name__}: {first}")
        key = _scalar_key(getattr(instance, self.field))
        return key if key is not None else Missing(f"{self.description} is empty")


class Callback(KeyExtractor):
    """Any ``fn(message) -> str | None``."""

    def __init__(self, fn: Callable[[Message], Any]) -> None:
        self.fn = fn
        self.description = f"callable {getattr(fn, '__qualname__', fn)!r}"

    def extract(self, message: Message) -> KeyResult:
        try:
            value = self.fn(message)
        except Exception as exc:  # a body it cannot read: the missing-key policy decides
            return Missing(f"{self.description} raised {type(exc).__name__}: {exc}")
        if value is None or value == "":
            return Missing(f"{self.description} returned {value!r}")
        return str(value)


KeySpec = KeyExtractor | Callable[[Message], Any] | str | tuple[Any, str]


def extractor(spec: KeySpec) -> KeyExtractor:
    """Normalise ``key=``: an extractor, a callable, a ``(Model, "field")`` pair, or a
    string: ``"keys"``, ``"property:NAME"``, ``"json:PATH"`` (also ``"$.PATH"``)."""
    if isinstance(spec, KeyExtractor):
        return spec
    if isinstance(spec, tuple):
        model, name = spec
        return ModelField(model, name)
    if isinstance(spec, str):
        if spec in ("keys", "key"):
            return MessageKeys()
        if spec.startswith("property:"):
            return Property(spec.split(":", 1)[1])
        if spec.startswith("json:"):
            return JsonPath(spec.split(":", 1)[1])
        if spec.startswith("$"):
            return JsonPath(spec)
        raise ValueError(
            f"unknown key spec {spec!r}: use 'keys', 'property:NAME', 'json:PATH' or '$.PATH'"
        )
    if callable(spec):
        return Callback(spec)
    raise TypeError(f"cannot extract a key with {spec!r}")


def unusable(key: str) -> str | None:
    """Why a stored key could not hold ``key`` (then the missing-key policy applies),
    or None: stores take UTF-8 text without NUL (PostgreSQL refuses NUL in text)."""
    if "\x00" in key:
        return f"the key {key[:80]!r} contains a NUL character"
    if key.isascii():  # the common case, without encoding a copy
        return None
    try:
        key.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"the key {key[:80]!r} is not valid Unicode text ({exc.reason})"
    return None


def original_topic(message: Message) -> str:
    """The topic a message was produced to, also for a ``%RETRY%group`` redelivery."""
    if message.topic.startswith(RETRY_TOPIC_PREFIX):
        return message.properties.get(RETRY_TOPIC_PROPERTY) or message.topic
    return message.topic


@dataclass(frozen=True, slots=True)
class Namespace:
    """Stored keys are namespaced so that two consumer groups (or topics) sharing a
    store each process a business key once. Default: ``<consumer group>/<topic>``."""

    fixed: str | None = None
    group: str | None = None

    def of(self, message: Message) -> str:
        if self.fixed is not None:
            return self.fixed
        group = self.group or message.consumer_group
        if not group:
            raise ValueError(
                "no namespace for the dedup records: pass namespace= or group= to the "
                "decorator, or deliver messages with Message.consumer_group set (the "
                "adapters do)"
            )
        return f"{group}/{original_topic(message)}"


def describe(message: Message) -> str:
    """Enough to find a message in the broker: topic, msgId, queue (with its broker: a
    queue id repeats on every broker of a cluster) and offset, keys."""
    queue = f"{message.broker_name}:{message.queue_id}" if message.broker_name else message.queue_id
    return (
        f"topic={message.topic} msg_id={message.msg_id or '?'} queue={queue} "
        f"offset={message.queue_offset} keys={list(message.keys)}"
    )


Fingerprinter = Callable[[Message], bytes | str]


def fingerprint_of(message: Message, source: Fingerprinter | None = None) -> str:
    """A short stable hash of the body (or of what ``source`` picks from the message)."""
    data: bytes | str = message.body if source is None else source(message)
    raw = data.encode() if isinstance(data, str) else data
    return hashlib.blake2b(raw, digest_size=16).hexdigest()

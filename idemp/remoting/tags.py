"""Tag hashing and subscription expressions, as the broker filters them."""

from __future__ import annotations

SUB_ALL = "*"


def java_string_hash(text: str) -> int:
    """Java ``String.hashCode`` over UTF-16 code units, as a signed int32."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def tags_code(tags: str | None) -> int:
    return java_string_hash(tags) if tags else 0


def parse_subscription(expression: str | None) -> tuple[frozenset[str], frozenset[int]] | None:
    """``None`` means "every message"; otherwise (tags, their hash codes).

    ``"*"`` and ``""`` match all; ``"a || b"`` is split on ``||`` and trimmed.
    """
    if expression is None:
        return None
    expr = expression.strip()
    if expr in ("", SUB_ALL):
        return None
    tags = frozenset(t.strip() for t in expr.split("||") if t.strip())
    if not tags:
        return None
    return tags, frozenset(java_string_hash(t) for t in tags)

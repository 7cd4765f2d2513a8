"""Tag hashing and subscription expressions, as the broker filters them."""

from __future__ import annotations

from .javahash import java_string_hash

SUB_ALL = "*"


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

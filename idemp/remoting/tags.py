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


class SubscriptionSplitError(ValueError):
    """FilterAPI's "subString split error": the expression splits into no pieces."""


def tag_subscription(sub_string: str | None) -> tuple[frozenset[str], frozenset[int]] | None:
    """A TAG expression as the broker's FilterAPI.buildSubscriptionData reads it: None
    (every message) only for null, ``""`` and exactly ``"*"``; otherwise the pieces
    between ``||``, each trimmed, the empty ones dropped, which may leave no tag at all
    (``" "``, ``"|| ||"``: a subscription nothing matches). Java's split drops trailing
    empty pieces, so ``"||"`` has none: SubscriptionSplitError."""
    if sub_string is None or sub_string in ("", SUB_ALL):
        return None
    pieces = sub_string.split("||")
    while pieces and pieces[-1] == "":
        pieces.pop()
    if not pieces:
        raise SubscriptionSplitError("subString split error")
    tags = frozenset(p.strip() for p in pieces if p.strip())
    return tags, frozenset(java_string_hash(t) for t in tags)

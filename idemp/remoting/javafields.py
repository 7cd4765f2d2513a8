"""A JSON value as fastjson sets it into a Java bean's int or boolean field.

RocketMQ reads request bodies such as a subscription group's config with fastjson,
which converts what it can (``"3"`` and ``3.7`` into 3, ``0`` into false) and refuses
the rest. Kept as given, a string or a float would fail later, per message, far from
the request that brought it.
"""

from __future__ import annotations

import math
import re
from typing import Any

_INT = re.compile(r"[+-]?\d+")  # Integer.parseInt's syntax
_TRAILING_ZEROS = re.compile(r"\.0*$")  # TypeUtils' NUMBER_WITH_TRAILING_ZEROS_PATTERN
_NULLS = ("", "null", "NULL")
# TypeUtils.castToBoolean: (any case, exact) for true, then for false
_TRUE = (("true", "y"), ("1", "T"))
_FALSE = (("false", "f"), ("0", "N"))


def int_field(value: Any, name: str) -> int | None:
    """None (the field keeps its default) for null and empty; else a 32-bit int or
    ValueError in fastjson's words."""
    if value is None:
        return None
    number: int | None = None
    if isinstance(value, bool):
        number = int(value)
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float) and math.isfinite(value):
        number = int(value)
    elif isinstance(value, str):
        if value in _NULLS:
            return None
        text = _TRAILING_ZEROS.sub("", value.replace(",", ""))
        if _INT.fullmatch(text):
            number = int(text)
    if number is None or not -(2**31) <= number < 2**31:
        raise ValueError(f"parseInt error, field : {name}")
    return number


def bool_field(value: Any, name: str) -> bool | None:
    """None for null and empty; a number is true when it is 1; the strings of
    TypeUtils.castToBoolean; anything else ValueError in fastjson's words."""
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value)):
        return int(value) == 1
    if isinstance(value, str):
        if value in _NULLS:
            return None
        for (any_case, exact), result in ((_TRUE, True), (_FALSE, False)):
            if value.lower() in any_case or value in exact:
                return result
    raise ValueError(f"parseBoolean error, field : {name}")

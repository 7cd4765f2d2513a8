"""Java's number parsing, as RocketMQ reads header fields and properties, and the words of
what it throws.

Python's ``int`` takes what Java's ``Integer.parseInt`` refuses (blanks around the digits,
``1_000``, digits of other scripts) and has no 32-bit limit, so a field RocketMQ refuses
would be taken here. An exception in a RocketMQ processor is answered SYSTEM_ERROR with
``RemotingHelper.exceptionSimpleDesc``: the exception, then its first stack frame (the
texts below were measured on RocketMQ 4.9.7 under JDK 17).
"""

from __future__ import annotations

import re

_JAVA_INTEGER = re.compile(r"[+-]?[0-9]+\Z")


class JavaError(ValueError):
    """What a RocketMQ processor throws on bad input, in its words (SYSTEM_ERROR)."""


def parse_java_int(text: str, bits: int = 32) -> int | None:
    """``Integer.parseInt`` (``bits=64``: ``Long.parseLong``); None where Java throws."""
    if not _JAVA_INTEGER.match(text):
        return None
    value = int(text)
    limit = 1 << (bits - 1)
    return value if -limit <= value < limit else None


def number_format(text: str) -> JavaError:
    """The NumberFormatException of parseInt/parseLong on ``text``."""
    return JavaError(
        f'java.lang.NumberFormatException: For input string: "{text}", '
        "java.base/java.lang.NumberFormatException.forInputString(NumberFormatException.java:67)"
    )


def java_int(text: str, bits: int = 32) -> int:
    """``Integer.parseInt`` (or ``Long.parseLong``), throwing as Java does."""
    value = parse_java_int(text, bits)
    if value is None:
        raise number_format(text)
    return value

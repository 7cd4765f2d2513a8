"""RocketMQ's version numbers: a request's ``version`` is an ordinal of MQVersion.Version.

Clients announce theirs in every request (the C++ client 2.0 says V3_1_8, 63; the Java
client 4.9.7 says 407), and the broker gates features on them and prints their names.
The enum is rebuilt here rather than listed: 16 early names, then a SNAPSHOT and a
release for every patch of every minor version, then HIGHER_VERSION for anything later.
"""

from __future__ import annotations

from functools import cache

_EARLY = (
    "V3_0_0_SNAPSHOT",
    "V3_0_0_ALPHA1",
    *(f"V3_0_0_BETA{i}" for i in range(1, 6)),
    *(name for i in range(6, 10) for name in (f"V3_0_0_BETA{i}_SNAPSHOT", f"V3_0_0_BETA{i}")),
    "V3_0_0_FINAL",
)
# (major, minor) -> the first and last patch the enum has for it
_PATCHES = {
    (3, 0): (1, 15),
    (3, 1): (0, 9),
    (3, 2): (0, 9),
    **{(3, minor): (1, 9) for minor in range(3, 10)},
    **{(major, minor): (0, 9) for major in (4, 5) for minor in range(10)},
}


@cache
def names() -> tuple[str, ...]:
    """MQVersion.Version.values(), by name, in ordinal order."""
    out = list(_EARLY)
    for (major, minor), (first, last) in _PATCHES.items():
        for patch in range(first, last + 1):
            release = f"V{major}_{minor}_{patch}"
            out += (f"{release}_SNAPSHOT", release)
    out.append("HIGHER_VERSION")
    return tuple(out)


def version_desc(value: int) -> str:
    """MQVersion.getVersionDesc: the name of an ordinal; one past the end names the last."""
    table = names()
    return table[min(value, len(table) - 1)]


def ordinal(name: str) -> int:
    """Version.valueOf(name).ordinal()."""
    return names().index(name)

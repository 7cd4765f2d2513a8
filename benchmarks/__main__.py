"""``python -m benchmarks [name ...]``: run the benchmarks (all by default)."""

from __future__ import annotations

import sys

from benchmarks import broker, endtoend, grpc5, reconcile, runners, strategies

SUITES = {
    "broker": broker.main,
    "runners": runners.main,
    "strategies": strategies.main,
    "endtoend": endtoend.main,
    "grpc5": grpc5.main,
    "reconcile": reconcile.main,
}


def main(argv: list[str]) -> int:
    """``python -m benchmarks`` runs every suite; ``python -m benchmarks NAME ARGS...``
    runs one with its own options."""
    if argv and not argv[0].startswith("-"):
        name, rest = argv[0], argv[1:]
        if name not in SUITES:
            print(f"unknown benchmark {name!r}; choose from {', '.join(SUITES)}")
            return 2
        return SUITES[name](rest)
    for name, suite in SUITES.items():
        print(f"== {name}")
        code = suite(argv)
        if code:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Entry point for ``python -m benchmarks`` (placeholder)."""

import sys


def main() -> int:
    print("no benchmarks yet")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``idemp broker export``: a store's message history for reconciliation.

Reads the commit log directly (the broker may be stopped; a torn tail ends the
export, it is never repaired here) and writes one row per stored record, with a
``kind`` column so that retry, DLQ, delayed and transactional copies can be told
from the messages producers sent.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# The row schema lives in idemp.history (shared with ``idemp history pull``); the
# names stay importable from here.
from idemp.history import SCHEMA_FIELDS, arrow_schema, kind_of, row_of, write_rows

from .commitlog import scan

__all__ = ["SCHEMA_FIELDS", "arrow_schema", "export", "kind_of", "row_of", "rows", "run_export"]


def rows(store_dir: Path, with_body: bool, broker: str | None = None) -> Iterator[dict[str, Any]]:
    for msg in scan(store_dir / "commitlog"):
        yield row_of(msg, with_body, broker)


def export(
    store_dir: str | Path,
    out: str | Path,
    fmt: str | None = None,
    with_body: bool = False,
    broker: str | None = None,
) -> int:
    """Write the history; return the number of rows. ``broker``: the store's broker name,
    written on every row (a cluster's exports then tell their queues apart)."""
    store_dir, out = Path(store_dir), Path(out)
    if not (store_dir / "commitlog").is_dir():
        raise FileNotFoundError(f"{store_dir} is not a broker store (no commitlog/ directory)")
    return write_rows(rows(store_dir, with_body, broker), out, fmt)


def run_export(
    store: str, out: str, fmt: str | None, with_body: bool, broker: str | None = None
) -> int:
    try:
        n = export(store, out, fmt, with_body, broker)
    except (OSError, ValueError) as exc:
        print(f"idemp broker export: {exc}", file=sys.stderr)
        return 1
    print(f"exported {n} messages from {store} to {out}")
    return 0

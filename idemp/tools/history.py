"""``idemp history pull``: the command line (the work is in ``history_pull``, which is
imported only when the command runs, so building the ``idemp`` parser stays cheap)."""

from __future__ import annotations

import argparse
import sys

DEFAULT_PULL_GROUP = "idemp_history_pull"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--namesrv", required=True, help="HOST:PORT[;HOST:PORT]")
    p.add_argument(
        "--topic",
        action="append",
        required=True,
        dest="topics",
        metavar="TOPIC",
        help="topic to pull (repeatable)",
    )
    p.add_argument(
        "--group",
        action="append",
        default=[],
        dest="groups",
        metavar="GROUP",
        help="also pull %%RETRY%%GROUP and %%DLQ%%GROUP (repeatable)",
    )
    p.add_argument("--begin-ms", type=int, help="store time from (epoch ms, inclusive)")
    p.add_argument("--end-ms", type=int, help="store time until (epoch ms, exclusive)")
    p.add_argument("--out", required=True, help="file to write (.parquet or .jsonl)")
    p.add_argument(
        "--format",
        choices=["parquet", "jsonl"],
        default=None,
        help="default: from the file extension",
    )
    p.add_argument(
        "--with-body",
        action="store_true",
        help="write bodies (base64 in JSON lines) instead of their SHA-256",
    )
    p.add_argument(
        "--pull-group",
        default=DEFAULT_PULL_GROUP,
        help="group name the pulls are made under (never a real consumer group)",
    )


def run(args: argparse.Namespace) -> int:
    from idemp.client import RemotingError

    from .history_pull import HistoryError, TimeRange, pull_history

    if args.pull_group in args.groups:
        print("idemp history pull: --pull-group must not be a real group", file=sys.stderr)
        return 2
    try:
        n = pull_history(
            args.namesrv,
            args.topics,
            args.groups,
            args.out,
            when=TimeRange(args.begin_ms, args.end_ms),
            fmt=args.format,
            with_body=args.with_body,
            pull_group=args.pull_group,
        )
    except (HistoryError, RemotingError, OSError, ValueError) as exc:
        print(f"idemp history pull: {exc}", file=sys.stderr)
        return 1
    print(f"pulled {n} messages to {args.out}")
    return 0

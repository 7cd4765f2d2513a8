"""One chaos consumer process: ``python -m chaos.worker``; the run SIGKILLs it at will.

It writes its counters (``idemp.stats`` per listener, plus the repeats the stream cursor
caught) to ``--stats`` every 0.5 s and at a clean exit (SIGTERM), so the run can add
them up; a SIGKILLed process loses at most its last half second of counts.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import threading
from pathlib import Path

from chaos.app import Consumers

_stats = importlib.import_module("idemp.stats")
SNAPSHOT_INTERVAL_S = 0.5


def snapshot(path: Path, consumers: Consumers) -> None:
    data = {name: _stats.stats(name) for name in _stats.listeners()}
    data["_cursor"] = {"repeats": consumers.cursor_repeats}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)  # atomic: a SIGKILL never leaves a torn file


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chaos.worker")
    p.add_argument("--namesrv", required=True)
    p.add_argument("--pg", required=True)
    p.add_argument("--redis", required=True)
    p.add_argument("--stats", required=True, type=Path)
    args = p.parse_args(argv)
    consumers = Consumers(args.namesrv, args.pg, args.redis)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    consumers.start()
    print("worker started", flush=True)
    while not stop.wait(SNAPSHOT_INTERVAL_S):
        snapshot(args.stats, consumers)
    consumers.shutdown()
    snapshot(args.stats, consumers)
    return 0


if __name__ == "__main__":
    sys.exit(main())

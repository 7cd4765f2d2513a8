"""The consumer process the demo kills with SIGKILL: ``python -m idemp.demo.worker``.

It runs the same decorated listeners as the demo process until it is killed (the
demo never lets it finish). Its effects are recorded with its pid.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from idemp.demo.app import Consumers, Names


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m idemp.demo.worker")
    p.add_argument("--namesrv", required=True)
    p.add_argument("--db-url", required=True)
    p.add_argument("--dedup-url", default=None)
    p.add_argument("--suffix", default="")
    p.add_argument("--lock-expiry", type=float, default=30.0)
    args = p.parse_args(argv)
    consumers = Consumers(
        args.namesrv,
        args.db_url,
        args.dedup_url,
        Names(args.suffix),
        lock_expiry_s=args.lock_expiry,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    consumers.start()
    print("worker started", flush=True)
    stop.wait()  # SIGKILL is the expected end; SIGTERM shuts down cleanly
    consumers.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

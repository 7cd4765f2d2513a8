"""``idemp worker --reload``: the worker restarted when its code changes (development).

The parent consumes nothing: it runs the worker as a child process and watches the
directories (``watchfiles``, the file watcher uvicorn uses) for changed ``.py`` and
``.toml`` files. On a change it stops the child as SIGTERM stops a worker (in-flight
handlers finish, offsets are committed, orderly queues unlocked) and starts a new one.
The child runs in a session of its own, so a terminal's Ctrl-C reaches only the parent,
which then stops the child once; a child that exits by itself (a configuration error, a
crash) is started again at the next change.
"""

from __future__ import annotations

import argparse
import logging
import signal
import subprocess
import sys
import threading
from typing import Any

log = logging.getLogger("idemp.worker")

#: after the child's own shutdown timeout, how long before it is killed
KILL_GRACE_S = 5.0


def child_command(args: argparse.Namespace) -> list[str]:
    """The worker's command line without ``--reload``: every option of the worker's
    parser (a test parses this back and compares, so a new option cannot be left out)."""
    cmd = [sys.executable, "-m", "idemp", "worker", args.app]
    for flag, value in (
        ("--namesrv", args.namesrv),
        ("--endpoint", args.endpoint),
        ("--http-port", args.http_port),
        ("--http-host", args.http_host),
        ("--shutdown-timeout", args.shutdown_timeout),
        ("--log-format", args.log_format),
        ("--log-level", args.log_level),
        ("--ready-file", args.ready_file),
    ):
        if value is not None:
            cmd += [flag, str(value)]
    return cmd


def run_reloading(args: argparse.Namespace) -> int:
    """Logging is the worker's (``--log-format``, ``--log-level``), set by the caller."""
    try:
        from watchfiles import PythonFilter, watch
    except ImportError:
        print(
            "idemp worker: --reload needs watchfiles: pip install 'idemp[reload]'",
            file=sys.stderr,
        )
        return 2
    dirs = args.reload_dir or ["."]
    cmd = child_command(args)
    stop = threading.Event()
    children = [_start(cmd)]

    def on_signal(signum: int, frame: Any) -> None:
        if stop.is_set():  # a second signal: passed on, the worker then exits at once
            children[-1].send_signal(signal.SIGTERM)
            return
        log.info("idemp event=stopping signal=%s (reloader)", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("idemp event=watching dirs=%s", ",".join(dirs))
    for changes in watch(
        *dirs,
        watch_filter=PythonFilter(extra_extensions=(".toml",)),
        stop_event=stop,
        raise_interrupt=False,
    ):
        changed = sorted({path for _, path in changes})
        log.info("idemp event=reload changed=%s", ",".join(changed))
        _stop(children[-1], args.shutdown_timeout)
        children.append(_start(cmd))
        del children[:-1]
    return _stop(children[-1], args.shutdown_timeout)


def _start(cmd: list[str]) -> subprocess.Popen[bytes]:
    child = subprocess.Popen(cmd, start_new_session=True)
    threading.Thread(target=_report_exit, args=(child,), daemon=True).start()
    return child


def _report_exit(child: subprocess.Popen[bytes]) -> None:
    code = child.wait()
    if code not in (0, -signal.SIGTERM, -signal.SIGKILL):
        log.error("idemp worker exited with code %s; it starts again at the next change", code)


def _stop(child: subprocess.Popen[bytes], shutdown_timeout: float) -> int:
    """SIGTERM, the worker's own graceful stop; SIGKILL if it outlasts its timeout."""
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(shutdown_timeout + KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            log.error("idemp worker did not stop within %.0f s: killed", shutdown_timeout)
            child.kill()
            child.wait()
    return child.returncode

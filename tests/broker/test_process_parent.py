"""A broker started by BrokerProcess goes when the process that started it dies (the child
arms its own death signal, so no fork handler runs between fork and exec)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PARENT = """
import sys, time
from idemp.broker.process import BrokerProcess
broker = BrokerProcess(sys.argv[1]).start()
print(broker.proc.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its new parent) counts as gone
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return stat[0] != "Z"


def test_the_broker_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path / "store")],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    broker_pid = int(parent.stdout.readline())
    assert _alive(broker_pid)
    parent.send_signal(signal.SIGKILL)
    parent.wait(10)
    deadline = time.monotonic() + 30
    while _alive(broker_pid) and time.monotonic() < deadline:
        time.sleep(0.1)  # SIGTERM makes the broker flush and exit; bounded
    assert not _alive(broker_pid)

"""``idemp consume --strategy`` shows what @idempotent would do with a topic's messages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.realbroker import broker_of

HERE = Path(__file__)  # which suite: IDEMP_4X_REAL swaps this suite's brokers


def test_consume_through_a_strategy_marks_the_repeated_key_duplicate(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("o-1\no-2\no-2\no-3\n")
    with broker_of(tmp_path / "store", None, HERE) as broker:
        idemp = [sys.executable, "-m", "idemp"]
        common = ["--namesrv", broker.namesrv_addr, "--topic", "Orders"]
        subprocess.run(
            [*idemp, "produce", *common, "--count", "4", "--keys-from", str(keys)],
            check=True,
            capture_output=True,
            timeout=60,
        )
        out = subprocess.run(
            [*idemp, "consume", *common, "--group", "watch", "--from", "first", "--max", "4"]
            + ["--strategy", f"sqlite:///{tmp_path / 'dedup.db'}", "--body"]
            # one consume thread: two threads could hold both o-2 copies at once, and the
            # second would then be in progress (reconsumed later), not yet a duplicate
            + ["--threads", "1"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert out.returncode == 0, out.stderr
    lines = sorted((json.loads(line) for line in out.stdout.splitlines()), key=lambda r: r["index"])
    # the two o-2 messages sit on different queues: either may be handled first
    assert sorted((r["key"], r["outcome"]) for r in lines) == [
        ("o-1", "processed"),
        ("o-2", "duplicates"),
        ("o-2", "processed"),
        ("o-3", "processed"),
    ]
    assert [r["body"].split(" ", 1)[0] for r in lines] == ["0", "1", "2", "3"]


def test_a_strategy_url_that_cannot_work_stops_before_consuming(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "idemp", "consume", "--namesrv", "127.0.0.1:1", "--topic", "t"]
        + ["--group", "g", "--strategy", "nosuch://host/x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr.startswith("idemp consume: --strategy nosuch://host/x: ")
    assert out.stderr.count("\n") == 1

"""A file the command cannot read is one line naming it, exit status 2, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("option", ["--body-file", "--keys-from"])
def test_produce_names_a_missing_file(tmp_path: Path, option: str) -> None:
    missing = tmp_path / "absent.bin"
    out = subprocess.run(
        [sys.executable, "-m", "idemp", "produce", "--namesrv", "127.0.0.1:1", "--topic", "t"]
        + [option, str(missing)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr == f"idemp produce: cannot read {missing}: No such file or directory\n"

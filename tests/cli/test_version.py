"""One version: pyproject's, read from the installed metadata by idemp and its command."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import idemp

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_version_is_pyprojects() -> None:
    # the [project] table's version line (tomllib is 3.11+; idemp supports 3.10)
    found = re.search(
        r'^\[project\][^\[]*?^version = "([^"]+)"', PYPROJECT.read_text(), re.M | re.S
    )
    assert found is not None
    declared = found[1]
    assert version("idemp") == declared
    assert idemp.__version__ == declared


def test_command_prints_the_same_version() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "idemp", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == f"idemp {idemp.__version__}"

"""The sharding-key hash equals libstdc++'s std::hash<std::string> on 64-bit Linux."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from idemp.client.sharding import queue_index_for_key, std_hash_string

# Printed by g++ 12 (libstdc++, x86_64) for std::hash<std::string>{}(s).
KNOWN = {
    "": 6142509188972423790,
    "abc": 3663726644998027833,
    "key-0": 14789006193094771391,
    "hello world 12345": 250997661988489835,
}


def test_known_values() -> None:
    assert {k: std_hash_string(k) for k in KNOWN} == KNOWN


def test_queue_index_is_hash_mod_queue_count() -> None:
    assert queue_index_for_key("key-0", 4) == 14789006193094771391 % 4
    with pytest.raises(ValueError):
        queue_index_for_key("key-0", 0)


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_against_compiled_std_hash(tmp_path: Path) -> None:
    keys = [f"key-{i}" for i in range(40)] + ["ä€😀", "x" * 7, "y" * 8, "z" * 9, "w" * 65]
    src = tmp_path / "h.cpp"
    src.write_text(
        "#include <string>\n#include <iostream>\nint main(){std::string s;"
        "while(std::getline(std::cin,s)) std::cout<<std::hash<std::string>{}(s)<<'\\n';}"
    )
    exe = tmp_path / "h"
    subprocess.run(["g++", "-O1", "-o", str(exe), str(src)], check=True, timeout=120)
    out = subprocess.run(
        [str(exe)], input="\n".join(keys) + "\n", capture_output=True, text=True, check=True
    ).stdout.split()
    assert [int(v) for v in out] == [std_hash_string(k) for k in keys]

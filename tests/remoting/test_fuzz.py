"""The fuzz harnesses of ``make fuzz`` (fuzz/), briefly, inside ``make test``.

Every crash a fuzzer ever found is in fuzz/regressions/<target>/ and must replay
cleanly; the seed corpus (the golden frames) too; then atheris runs each target for a
few seconds in a child process (libFuzzer exits the process it runs in).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz.targets import TARGETS

ROOT = Path(__file__).resolve().parents[2]
FUZZ = ROOT / "fuzz"
SHORT_RUN_S = 8  # per target; make fuzz runs 300 s each


def _inputs(target: str) -> list[Path]:
    return sorted(
        p
        for d in (FUZZ / "regressions" / target, FUZZ / "corpus" / target)
        if d.is_dir()
        for p in d.iterdir()
        if p.is_file()
    )


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_regressions_and_seed_corpus_replay(target: str) -> None:
    inputs = _inputs(target)
    assert len(inputs) > 50  # the corpus is seeded from the golden frames
    for path in inputs:
        TARGETS[target](path.read_bytes())


def test_surrogate_in_a_response_is_written_as_a_json_escape() -> None:
    """Regression (dispatch fuzzer): a request whose JSON header carried "\\ud800" made
    the broker's answer unencodable (UnicodeEncodeError out of data_received)."""
    from idemp.remoting import RemotingCommand, decode_frame, encode

    cmd = RemotingCommand(code=1, remark="topic \ud800", ext_fields={"k\udfff": "v\ud800"})
    back = decode_frame(encode(cmd)[4:])
    assert (back.remark, back.ext_fields) == ("topic \ud800", {"k\udfff": "v\ud800"})


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_short_coverage_guided_run(target: str, tmp_path: Path) -> None:
    pytest.importorskip("atheris")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for path in _inputs(target):
        (corpus / path.name).write_bytes(path.read_bytes())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fuzz.run",
            target,
            f"-max_total_time={SHORT_RUN_S}",
            "-max_len=4096",
            f"-artifact_prefix={tmp_path}/",
            str(corpus),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=SHORT_RUN_S + 60,
    )
    crashes = [p.name for p in tmp_path.iterdir() if p.name.startswith("crash-")]
    assert proc.returncode == 0 and crashes == [], proc.stderr[-3000:]
    assert "Done " in proc.stderr  # libFuzzer's final line: it ran to the time limit

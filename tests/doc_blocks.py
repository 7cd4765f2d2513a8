"""Every code block in README.md and docs/ runs, so the docs cannot drift (Sybil).

What runs, per document, in order, in a fresh scratch directory (the document's working
directory, removed afterwards):

- ``python`` blocks: executed in one namespace per document, as a reader pasting them
  into one interpreter would;
- ``sh`` blocks: executed by ``bash -euo pipefail``; the environment a block exports (a
  ``. venv/bin/activate`` included) carries over to the document's next block. ``idemp``
  and ``python`` are this checkout's (``.venv``) until a block activates a venv of its
  own; ``pip`` only works in such a venv (so a docs test can never reinstall the
  checkout's ``.venv``). ``./idemp`` is this checkout (the clone the install page starts
  from), and ``make TARGET`` is checked with ``make --dry-run`` in the checkout: the
  README's ``make test`` cannot run inside ``make test``, but a target that does not
  exist, or a recipe that does not expand, fails;
- ``toml`` blocks: parsed (a settings file shown in the docs must at least be TOML);
- ``text`` blocks: output, diagrams and layouts; not run. tests/structure checks that no
  fence is left without one of these languages, so a command cannot hide in an unlabeled
  block.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sybil import Example, Sybil
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser

REPO = Path(__file__).resolve().parent.parent
DOCUMENTS = ["README.md", "docs/*.md"]
LANGUAGES = {"python", "sh", "toml", "text"}
BLOCK_TIMEOUT_S = 600  # the install page's pip runs take ~30 s; this bounds a hang
GROUP_STOP_S = 10.0  # a stopped broker persists and exits in well under a second

_PRELUDE = f"""
make() {{ command make --dry-run --no-print-directory -C {REPO} "$@" >/dev/null; }}
"""


_WRAPPERS = {
    "idemp": '#!/bin/sh\nexec "{venv}/idemp" "$@"\n',
    "python": (
        "#!/bin/sh\n"
        'case "$1 $2" in "-m pip"*) echo "docs: pip only inside a venv the document made" >&2;'
        " exit 97;; esac\n"
        'exec "{venv}/python" "$@"\n'
    ),
    "pip": '#!/bin/sh\necho "docs: pip only inside a venv the document made" >&2\nexit 97\n',
}


def _setup(namespace: dict[str, Any]) -> None:
    scratch = Path(tempfile.mkdtemp(prefix="idemp-docs-"))
    shims = scratch / ".docs-bin"
    shims.mkdir()
    for name, text in _WRAPPERS.items():
        shim = shims / name
        shim.write_text(text.replace("{venv}", str(Path(sys.executable).parent)))
        shim.chmod(0o755)
    for alias in ("python3", "pip3"):
        (shims / alias).symlink_to(shims / alias.rstrip("3"))
    env = dict(os.environ)
    env["PATH"] = f"{shims}{os.pathsep}{env.get('PATH', '')}"
    env.pop("VIRTUAL_ENV", None)
    namespace["_docs"] = {"cwd": os.getcwd(), "scratch": scratch, "env": env, "groups": []}
    os.chdir(scratch)


def _teardown(namespace: dict[str, Any]) -> None:
    state = namespace["_docs"]
    _stop_groups(state["groups"])
    os.chdir(state["cwd"])
    shutil.rmtree(state["scratch"], ignore_errors=True)


def _stop_groups(groups: list[int]) -> None:
    """What a document's blocks left running (a broker a failed block never stopped):
    each block runs in a process group of its own, and its background jobs stay in it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, sig)
        deadline = time.monotonic() + GROUP_STOP_S
        while time.monotonic() < deadline and any(_alive(g) for g in groups):
            time.sleep(0.05)


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _run_sh(example: Example) -> str | None:
    state = example.namespace["_docs"]
    env_file = state["scratch"] / ".docs-env"
    clone = state["scratch"] / "idemp"
    if "./idemp" in example.parsed and not clone.exists():
        # only where a block names the clone: elsewhere a directory called idemp in the
        # working directory would shadow the package for `python -m idemp`
        clone.symlink_to(REPO)
    script = f"{_PRELUDE}\nset -euo pipefail\n{example.parsed}\nexport -p > {env_file}\n"
    proc = subprocess.Popen(
        ["bash", "-c", script],
        cwd=state["scratch"],
        env=state["env"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    state["groups"].append(proc.pid)
    try:
        stdout, stderr = proc.communicate(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _stop_groups([proc.pid])
        stdout, stderr = proc.communicate()
        head = f"sh block timed out after {BLOCK_TIMEOUT_S} s"
        return f"{head}\n--- stdout\n{stdout}--- stderr\n{stderr}"
    out = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    if out.returncode != 0:
        return f"sh block exited {out.returncode}\n--- stdout\n{out.stdout}--- stderr\n{out.stderr}"
    state["env"] = _exported(env_file, state["env"])
    return None


def _exported(env_file: Path, before: dict[str, str]) -> dict[str, str]:
    """The variables ``export -p`` printed, read back by bash itself (no parsing here)."""
    dump = subprocess.run(
        ["bash", "-c", f"source {env_file} && env -0"],
        env=before,
        capture_output=True,
        check=True,
    ).stdout
    pairs = (item.split(b"=", 1) for item in dump.split(b"\0") if b"=" in item)
    return {k.decode(): v.decode() for k, v in pairs}


def _parse_toml(example: Example) -> str | None:
    if sys.version_info >= (3, 11):
        import tomllib

        tomllib.loads(example.parsed)
        return None
    raise RuntimeError("TOML blocks are read with tomllib, Python 3.11+ (as the test venv)")


def _not_run(example: Example) -> str | None:
    return None


sybil = Sybil(
    parsers=[
        PythonCodeBlockParser(),
        CodeBlockParser(language="sh", evaluator=_run_sh),
        CodeBlockParser(language="toml", evaluator=_parse_toml),
        CodeBlockParser(language="text", evaluator=_not_run),
    ],
    patterns=DOCUMENTS,
    path=str(REPO),
    setup=_setup,
    teardown=_teardown,
)

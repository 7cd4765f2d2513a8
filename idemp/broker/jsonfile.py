"""Config files under ``<store>/config``: written atomically, read leniently.

RocketMQ writes these with fastjson (bare integer map keys); idemp writes standard
JSON, which fastjson reads too, and reads either form.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from idemp.remoting import jsonlenient

log = logging.getLogger("idemp.broker.config")


def write_json(path: Path, data: Any, *, fsync: bool = True) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    text = json.dumps(data, indent=2, sort_keys=True)
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        if fsync:
            os.fsync(fh.fileno())
    if path.exists():
        os.replace(path, path.with_name(path.name + ".bak"))
    os.replace(tmp, path)


def read_json(path: Path) -> Any | None:
    """The file's content, falling back to its ``.bak`` when it is missing or torn."""
    for candidate in (path, path.with_name(path.name + ".bak")):
        try:
            text = candidate.read_text(encoding="utf-8")
        except FileNotFoundError:
            continue
        if not text.strip():
            continue
        try:
            return jsonlenient.loads(text)
        except ValueError as exc:
            log.warning("%s is not valid JSON (%s); trying its backup", candidate, exc)
    return None

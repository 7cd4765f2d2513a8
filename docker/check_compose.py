"""What ``docker-compose config -q`` does not check in a Compose file: files on disk.

``make lint`` validates the compose files with ``docker-compose config -q`` (PyPI
docker-compose 1.29 in its own venv, ``.cache/compose-venv``): schema, unknown keys,
ports, healthchecks, depends_on targets, named volumes. That validation never looks at
the disk, so a renamed ``broker.conf`` or Dockerfile would only fail on ``docker compose
up`` in CI. This checks that every relative bind-mount source and every build Dockerfile
exists. Usage: ``python docker/check_compose.py FILE...``; exit 1 on errors.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml


def check(path: Path) -> list[str]:
    doc: Any = yaml.safe_load(path.read_text())
    services = doc.get("services") if isinstance(doc, dict) else None
    if not isinstance(services, dict):
        return [f"{path}: no services mapping"]
    errors: list[str] = []
    for name, svc in services.items():
        where = f"{path}: services.{name}"
        build = svc.get("build") if isinstance(svc, dict) else None
        if isinstance(build, (str, dict)):
            spec = {"context": build} if isinstance(build, str) else build
            dockerfile = (
                path.parent / spec.get("context", ".") / spec.get("dockerfile", "Dockerfile")
            )
            if not dockerfile.is_file():
                errors.append(f"{where}: build Dockerfile {dockerfile} not found")
        for vol in (svc.get("volumes") or []) if isinstance(svc, dict) else []:
            source = vol.get("source", "") if isinstance(vol, dict) else str(vol).split(":")[0]
            if source.startswith(".") and not (path.parent / source).exists():
                errors.append(f"{where}: bind source {source} not found")
    return errors


def main(argv: list[str]) -> int:
    errors = [e for f in argv for e in check(Path(f))]
    for e in errors:
        print(e, file=sys.stderr)
    if not errors:
        print(f"compose files: bind sources and Dockerfiles present ({' '.join(argv)})")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

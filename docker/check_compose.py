"""Offline structural check of a Compose file (no Docker engine on these machines).

``docker-compose config -q`` (PyPI docker-compose 1.29) needs PyYAML < 6 and other old
pins that conflict with the project's environment, so this checks what matters with
PyYAML: known top-level and service keys, an image or a build per service, port and
volume syntax, depends_on targets, named volumes declared, bind-mounted files present,
healthcheck shape. Usage: ``python docker/check_compose.py FILE...``; exit 1 on errors.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml

TOP = {"version", "services", "volumes", "networks", "configs", "secrets", "name"}
SERVICE = {
    "image", "build", "command", "entrypoint", "environment", "env_file", "ports", "expose",
    "volumes", "depends_on", "healthcheck", "restart", "networks", "working_dir", "user",
    "ulimits", "deploy", "container_name", "hostname", "labels", "tmpfs", "shm_size",
    "extra_hosts", "cap_add", "stop_grace_period", "profiles",
}
HEALTH = {"test", "interval", "timeout", "retries", "start_period", "disable"}
PORT = re.compile(r"^(\d{1,5}(-\d{1,5})?:)?\d{1,5}(-\d{1,5})?(/(tcp|udp))?$")


def check(path: Path) -> list[str]:
    errors: list[str] = []
    doc: Any = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict):
        return [f"{path}: not a mapping"]
    errors += [f"{path}: unknown top-level key {k!r}" for k in doc if k not in TOP]
    services = doc.get("services")
    if not isinstance(services, dict) or not services:
        return errors + [f"{path}: no services"]
    named = set((doc.get("volumes") or {}).keys())
    for name, svc in services.items():
        where = f"{path}: services.{name}"
        if not isinstance(svc, dict):
            errors.append(f"{where}: not a mapping")
            continue
        errors += [f"{where}: unknown key {k!r}" for k in svc if k not in SERVICE]
        if "image" not in svc and "build" not in svc:
            errors.append(f"{where}: needs image or build")
        build = svc.get("build")
        if isinstance(build, dict):
            ctx = path.parent / build.get("context", ".")
            dockerfile = ctx / build.get("dockerfile", "Dockerfile")
            if not dockerfile.is_file():
                errors.append(f"{where}: build dockerfile {dockerfile} not found")
        for port in svc.get("ports", []):
            if not PORT.match(str(port)):
                errors.append(f"{where}: bad port {port!r}")
        for dep in svc.get("depends_on", []):
            if dep not in services:
                errors.append(f"{where}: depends_on unknown service {dep!r}")
        for vol in svc.get("volumes", []):
            source = str(vol).split(":")[0]
            if source.startswith((".", "/")):
                if source.startswith(".") and not (path.parent / source).exists():
                    errors.append(f"{where}: bind source {source} not found")
            elif source not in named:
                errors.append(f"{where}: volume {source!r} not declared at top level")
        env = svc.get("environment", {})
        if not isinstance(env, (dict, list)):
            errors.append(f"{where}: environment must be a mapping or a list")
        hc = svc.get("healthcheck")
        if hc is not None:
            errors += [f"{where}: healthcheck key {k!r}" for k in hc if k not in HEALTH]
            test = hc.get("test")
            if not (isinstance(test, str) or (isinstance(test, list) and test
                                              and test[0] in ("CMD", "CMD-SHELL", "NONE"))):
                errors.append(f"{where}: healthcheck test must be a string or CMD/CMD-SHELL list")
        for key in ("command", "entrypoint"):
            if key in svc and not isinstance(svc[key], (str, list)):
                errors.append(f"{where}: {key} must be a string or a list")
    return errors


def main(argv: list[str]) -> int:
    errors = [e for f in argv for e in check(Path(f))]
    for e in errors:
        print(e, file=sys.stderr)
    if not errors:
        print(f"compose files OK: {' '.join(argv)}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Coverage-guided fuzzing under atheris (libFuzzer):

    python -m fuzz.run codec    [libFuzzer flags, e.g. -max_total_time=300] [corpus dirs]
    python -m fuzz.run dispatch [...]
    python -m fuzz.run grpc5 [...]
    python -m fuzz.run http2 [...]
    python -m fuzz.run --replay codec fuzz/corpus/codec   # run inputs once, no atheris

libFuzzer writes a crash as ``crash-<sha1>`` (see ``-artifact_prefix=``).
"""

from __future__ import annotations

import sys
from pathlib import Path


def replay(target_name: str, dirs: list[str]) -> int:
    from fuzz.targets import TARGETS

    target = TARGETS[target_name]
    n = 0
    for d in dirs:
        paths = sorted(Path(d).iterdir()) if Path(d).is_dir() else [Path(d)]
        for path in paths:
            if path.is_file():
                target(path.read_bytes())
                n += 1
    print(f"replayed {n} inputs on {target_name}: no failure")
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--replay":
        return replay(argv[1], argv[2:])
    import atheris

    target_name = argv[0]
    with atheris.instrument_imports(include=["idemp", "fuzz"]):
        # the broker imports its handler modules lazily: import them here to instrument
        import idemp.broker.acl  # noqa: F401
        import idemp.broker.admin  # noqa: F401
        import idemp.broker.consumers  # noqa: F401
        import idemp.broker.namesrv  # noqa: F401
        import idemp.broker.pull  # noqa: F401
        import idemp.broker.schedule  # noqa: F401
        import idemp.broker.send  # noqa: F401
        import idemp.broker.server  # noqa: F401
        import idemp.broker.transaction  # noqa: F401
        import idemp.broker.v5.convert  # noqa: F401
        import idemp.broker.v5.endpoint  # noqa: F401
        import idemp.broker.v5.headerblock  # noqa: F401
        import idemp.broker.v5.http2  # noqa: F401
        import idemp.broker.v5.pop  # noqa: F401
        import idemp.broker.v5.service  # noqa: F401
        from fuzz.targets import TARGETS

    target = TARGETS[target_name]
    atheris.Setup([sys.argv[0], *argv[1:]], target)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

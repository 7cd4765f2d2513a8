"""Build the API reference: one HTML page of idemp's public surface (``idemp.__all__``).

    python docs/build_api.py [OUT_DIR]      # make api; default .cache/api

pdoc renders it from the docstrings, so the page cannot drift from the code;
tests/structure/test_api_page.py builds it in ``make test`` and fails on any warning.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path


def build() -> tuple[str, list[str]]:
    """The page's HTML and the warnings pdoc raised while building it."""
    import pdoc.doc
    import pdoc.render

    import idemp

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = pdoc.doc.Module(idemp)
        html = pdoc.render.html_module(module, {"idemp": module})
    return html, [f"{w.category.__name__}: {w.message}" for w in caught]


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else ".cache/api")
    html, problems = build()
    for problem in problems:
        print(f"build_api: {problem}", file=sys.stderr)
    if problems:
        return 1
    out.mkdir(parents=True, exist_ok=True)
    (out / "idemp.html").write_text(html, encoding="utf-8")
    print(f"API reference: {out / 'idemp.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The API reference page builds with no warning and documents every public name."""

from __future__ import annotations

import importlib.util
import inspect
import re

import idemp
from tests.doc_blocks import REPO

spec = importlib.util.spec_from_file_location("build_api", REPO / "docs" / "build_api.py")
assert spec is not None and spec.loader is not None
build_api = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build_api)


def test_the_page_builds_without_warnings_and_has_a_section_per_public_name() -> None:
    html, problems = build_api.build()
    assert problems == []
    sections = set(re.findall(r'<section id="([A-Za-z_]+)">', html))
    assert sorted(set(idemp.__all__) - sections) == []


def test_every_public_name_has_a_docstring_of_its_own() -> None:
    # a class without one shows its base's (IdempSettings would show pydantic's)
    bare = [
        name
        for name in idemp.__all__
        if not (getattr(idemp, name).__doc__ or "").strip()
        or (inspect.isclass(getattr(idemp, name)) and "__doc__" not in vars(getattr(idemp, name)))
    ]
    assert bare == []

"""Every fenced block in README.md and docs/ names a language tests/doc_blocks.py knows,
so a command cannot sit in an unlabeled block that no test runs."""

from __future__ import annotations

from tests.doc_blocks import DOCUMENTS, LANGUAGES, REPO


def fence_languages(text: str) -> list[tuple[int, str]]:
    found, inside = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            if not inside:
                found.append((number, line[3:].strip()))
            inside = not inside
    return found


def test_every_fence_has_a_known_language() -> None:
    unknown = [
        f"{path.relative_to(REPO)}:{number} {language or '(none)'}"
        for pattern in DOCUMENTS
        for path in sorted(REPO.glob(pattern))
        for number, language in fence_languages(path.read_text())
        if language not in LANGUAGES
    ]
    assert unknown == []


def test_an_unlabeled_fence_is_found() -> None:
    assert fence_languages("a\n```\nls\n```\n```sh\nls\n```\n") == [(2, ""), (5, "sh")]

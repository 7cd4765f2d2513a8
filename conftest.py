"""Collects the code blocks of README.md and docs/ as tests (see tests/doc_blocks.py)."""

from tests.doc_blocks import sybil

pytest_collect_file = sybil.pytest()

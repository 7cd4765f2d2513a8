"""Every option of every ``idemp`` subcommand says what it is for, and every ``--help``
prints."""

from __future__ import annotations

import argparse

import pytest

from idemp.cli import build_parser


def options_without_help(parser: argparse.ArgumentParser, path: str = "idemp") -> list[str]:
    missing = []
    for action in parser._actions:  # argparse exposes no public walk of its actions
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                missing += options_without_help(child, f"{path} {name}")
        elif action.option_strings and not action.help and action.dest != "help":
            missing.append(f"{path} {'/'.join(action.option_strings)}")
    return missing


def test_every_option_has_help() -> None:
    assert options_without_help(build_parser()) == []


def test_walk_finds_an_option_without_help() -> None:
    parser = argparse.ArgumentParser(prog="x")
    parser.add_subparsers().add_parser("sub").add_argument("--bare")
    assert options_without_help(parser, "x") == ["x sub --bare"]


def subcommand_paths(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple]:
    paths = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                paths.append((*path, name))
                paths += subcommand_paths(child, (*path, name))
    return paths


@pytest.mark.parametrize("path", subcommand_paths(build_parser()), ids=" ".join)
def test_a_wrong_option_prints_that_subcommands_usage(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([*path, "--no-such-option"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: idemp {' '.join(path)} ")
    # the error is this subcommand's (a missing required option may be named first)
    assert f"\nidemp {' '.join(path)}: error: " in err


@pytest.mark.parametrize("path", [(), *subcommand_paths(build_parser())], ids=" ".join)
def test_every_subcommands_help_prints(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    """argparse formats help texts with ``%``: an unescaped ``%DLQ%`` in one subcommand's
    help made ``idemp dlq --help`` a traceback."""
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([*path, "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: idemp{''.join(' ' + p for p in path)}")

"""`ponder --help` lists every command once, by group, within 80 columns; every
command's `--help` ends with an example of itself."""

import argparse
import shlex

import pytest

from ponder.cli import build_parser, parse_args
from ponder.cli.overview import EXAMPLES, GROUPS, WIDTH

MAIN_COMMANDS = ("train", "demo", "eval", "pipeline", "serve", "chat", "export", "report", "bench-agent")


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def _help(monkeypatch, argv):
    monkeypatch.setenv("COLUMNS", "80")
    parser = build_parser()
    for name in argv:
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    return parser.format_help()


def test_every_command_stands_in_exactly_one_group():
    grouped = [name for names in GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(set(grouped)), "a command in two groups"
    assert set(grouped) == set(_commands()), "a group names no command, or a command has no group"


def test_top_help_is_grouped_one_line_each_within_80_columns(monkeypatch):
    text = _help(monkeypatch, [])
    lines = text.splitlines()
    assert all(len(line) <= WIDTH for line in lines), [line for line in lines if len(line) > WIDTH]
    for group, names in GROUPS.items():
        start = lines.index(f"{group}:")
        block = lines[start + 1 : start + 1 + len(names)]
        assert [line.split()[0] for line in block] == list(names)  # one line per command, none wrapped
    assert "search-QA" not in text  # eval evaluates any recipe's environment
    assert "{eval," not in text and "positional arguments" not in text  # argparse's flat list is hidden


@pytest.mark.parametrize("command", sorted(EXAMPLES))
def test_each_command_help_ends_with_its_example(monkeypatch, command):
    assert command in _commands()
    text = _help(monkeypatch, [command])
    tail = text[text.rindex("\nexample") + 1 :]
    examples = [line.strip() for line in tail.splitlines()[1:] if line.strip()]
    assert examples and all(line.startswith(f"ponder {command}") for line in examples)
    assert all(len(line) <= WIDTH for line in tail.splitlines())


def test_main_commands_have_examples():
    assert set(MAIN_COMMANDS) <= set(EXAMPLES)
    assert set(EXAMPLES) == set(_commands())  # in fact every command has one


@pytest.mark.parametrize("example", [line for lines in EXAMPLES.values() for line in lines])
def test_every_example_parses(example):
    argv = shlex.split(example)[1:]
    args = parse_args(argv)
    assert args.command == argv[0]

"""Every sub-command's --help: each option states its default (or what leaving it out means), every command
carries the device epilogue, and the model help names every promptable family."""

from __future__ import annotations

import argparse

import pytest

from jaxseg_robust.commands import COMMAND_MODULES, build_parser
from jaxseg_robust.commands.flags import DEVICE_EPILOG

def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _options(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if (action.option_strings and not action.required and action.help != argparse.SUPPRESS
                and not isinstance(action, (argparse._HelpAction, argparse._VersionAction))):
            yield action


def _help_text(parser: argparse.ArgumentParser, action) -> str:
    """The help of ``action`` as --help prints it (``%(default)s`` expanded), on one line."""
    return " ".join(parser._get_formatter()._expand_help(action).split())


def default_problem(parser: argparse.ArgumentParser, action) -> str | None:
    """Why ``action``'s help does not state its default, or None when it does.

    A flag whose default is None, False or [] says what leaving it out means, with the word "default"
    (``(default: none)``, ``(default: off, ...)``); any other default is shown as the help prints it.
    """
    text = _help_text(parser, action)
    if action.default is None or action.default == [] or action.nargs == 0:  # absent, or an on/off flag
        if "default" in text.lower():
            return None
        return f"{action.option_strings[0]}: leaving it out ({action.default!r}) is not explained: {text!r}"
    shown = [str(action.default), repr(action.default)]
    if isinstance(action.default, (list, tuple)):
        shown.append(",".join(str(v) for v in action.default))
        shown.append(" ".join(str(v) for v in action.default))
    if "default" in text.lower() and any(s in text for s in shown):
        return None
    return f"{action.option_strings[0]}: default {action.default!r} not stated: {text!r}"


@pytest.mark.parametrize("command", [c.replace("_", "-") for c in COMMAND_MODULES])
def test_every_option_states_its_default_or_what_absence_means(command):
    parsers = _subparsers()
    parser = parsers[command if command in parsers else command.replace("-", "_")]
    problems = [p for p in (default_problem(parser, a) for a in _options(parser)) if p]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("command", [c.replace("_", "-") for c in COMMAND_MODULES])
def test_every_command_says_how_to_pick_the_device(command):
    parsers = _subparsers()
    parser = parsers[command if command in parsers else command.replace("-", "_")]
    assert DEVICE_EPILOG in parser.format_help()

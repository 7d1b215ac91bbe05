"""The walk of a command's flags through the library, traced while the command runs.

`trace_walk` runs ``cli.main(argv)`` under `sys.setprofile` and records, for
the package's own functions:

* ``args_files``: the files whose functions receive the parsed flags (the
  ``argparse.Namespace``) as an argument: how far the shell's config travels;
* ``entries``: every call into the command module from another file, as
  (caller file or None outside the package, function): its import
  (``<module>``), the parser registration and the run itself, plus any return
  into the command from below (a callback the library calls back).
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys

from jaxseg_robust import cli

PACKAGE = pathlib.Path(cli.__file__).resolve().parent


@dataclasses.dataclass
class Walk:
    args_files: set = dataclasses.field(default_factory=set)
    entries: list = dataclasses.field(default_factory=list)
    exit_code: int | None = None


def _relative(filename: str) -> str | None:
    path = pathlib.Path(filename)
    try:
        return path.resolve().relative_to(PACKAGE).as_posix()
    except ValueError:
        return None


def trace_walk(argv: list[str], command_file: str) -> Walk:
    """Runs ``cli.main(argv)`` and traces where its flags go (module docstring); ``command_file`` is the
    command module relative to the package (``commands/tetris.py``)."""
    walk = Walk()
    names: dict[str, str | None] = {}

    def file_of(code) -> str | None:
        if code.co_filename not in names:
            names[code.co_filename] = _relative(code.co_filename)
        return names[code.co_filename]

    def profile(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        own = file_of(code)
        if own is None:
            return
        count = code.co_argcount + code.co_kwonlyargcount
        values = frame.f_locals
        if any(isinstance(values.get(name), argparse.Namespace) for name in code.co_varnames[:count]):
            walk.args_files.add(own)
        if own == command_file and frame.f_back is not None:
            caller = file_of(frame.f_back.f_code)
            if caller != command_file:
                walk.entries.append((caller, code.co_name))

    sys.setprofile(profile)
    try:
        walk.exit_code = cli.main(argv)
    finally:
        sys.setprofile(None)
    return walk

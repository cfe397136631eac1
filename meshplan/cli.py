"""The ``meshplan`` command line: ``meshplan plan | estimate | run | calibrate | validate | report | profiles``.

Each subcommand lives in :mod:`meshplan.commands` as a module with ``add_arguments(parser)``
and ``main(args) -> int``; this file only dispatches, importing the chosen module lazily so
that ``meshplan estimate`` never imports torch or ortools.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys
import warnings

from meshplan.errors import MeshplanError, MeshplanWarning

COMMANDS = {
    "plan": ("meshplan.commands.plan", "search layouts and write the best plan"),
    "estimate": ("meshplan.commands.estimate", "predict memory and step time of one layout"),
    "run": ("meshplan.commands.run", "run a plan file on this node's GPUs (spawns torchrun)"),
    "calibrate": ("meshplan.commands.calibrate", "measure this machine and write a profile"),
    "validate": ("meshplan.commands.validate", "run planned layouts and compare with predictions"),
    "report": ("meshplan.commands.report", "write a capacity-planning report (HTML/Markdown)"),
    "profiles": ("meshplan.commands.profiles", "list model, GPU and cluster presets"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="meshplan",   # the docstring's line, without its RST
                                     description=__doc__.splitlines()[0].replace("``", ""))
    from meshplan import __version__
    parser.add_argument("--version", action="version", version=f"meshplan {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (modname, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=modname)
        try:
            importlib.import_module(modname).add_arguments(p)
        except ModuleNotFoundError as exc:
            if exc.name != modname:
                raise
            p.set_defaults(_missing=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        _unrecognized(parser, getattr(args, "command", None), unknown)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    if getattr(args, "_missing", False):
        print(f"meshplan {args.command}: not available in this installation", file=sys.stderr)
        return 2
    with warnings.catch_warnings():
        # meshplan's warnings read like its errors; --strict turns them into errors
        warnings.simplefilter("error" if getattr(args, "strict", False) else "default",
                              MeshplanWarning)
        warnings.showwarning = _show_warning(args.command)
        try:
            return int(importlib.import_module(args._module).main(args) or 0)
        except (MeshplanError, MeshplanWarning) as exc:
            strict = " (--strict)" if isinstance(exc, MeshplanWarning) else ""
            print(f"meshplan {args.command}: error{strict}: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print(f"meshplan {args.command}: interrupted", file=sys.stderr)
            return 130


def _unrecognized(parser: argparse.ArgumentParser, command: str | None,
                  unknown: list[str]) -> None:
    """Exit 2 as argparse does, but from the subcommand (its usage, ``meshplan CMD: error``)
    and with the closest options to each unknown one."""
    sub = parser
    if command:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub = action.choices[command]
    options = [o for o in sub._option_string_actions if o.startswith("--")]
    hints = []
    for arg in unknown:
        if arg.startswith("--"):
            close = difflib.get_close_matches(arg.split("=", 1)[0], options, n=2, cutoff=0.6)
            if close:
                hints.append(f"{arg.split('=', 1)[0]}: did you mean {' or '.join(close)}?")
    sub.error(f"unrecognized arguments: {' '.join(unknown)}"
              + (f" ({'; '.join(hints)})" if hints else ""))


def _show_warning(command: str):
    default = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, MeshplanWarning):
            print(f"meshplan {command}: warning: {message}", file=file or sys.stderr)
        else:
            default(message, category, filename, lineno, file, line)
    return show


if __name__ == "__main__":
    sys.exit(main())

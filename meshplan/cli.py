"""The ``meshplan`` command line: ``meshplan plan | estimate | run | calibrate | validate | report | profiles``.

Each subcommand lives in :mod:`meshplan.commands` as a module with ``add_arguments(parser)``
and ``main(args) -> int``; this file only dispatches, importing the chosen module lazily so
that ``meshplan estimate`` never imports torch or ortools.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from meshplan.errors import MeshplanError

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
    parser = argparse.ArgumentParser(prog="meshplan", description=__doc__.splitlines()[0])
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
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    if getattr(args, "_missing", False):
        print(f"meshplan {args.command}: not available in this installation", file=sys.stderr)
        return 2
    try:
        return int(importlib.import_module(args._module).main(args) or 0)
    except MeshplanError as exc:
        print(f"meshplan {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"meshplan {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

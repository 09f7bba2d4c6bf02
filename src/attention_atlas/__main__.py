"""Command line: ``python -m attention_atlas <command> ...`` (also the ``attention-atlas`` script).

Each command registers itself through a function that takes the argparse subparsers object
and adds one parser whose defaults carry ``func(args) -> int`` (the exit status). To add a
command, write ``add_subcommand(subparsers)`` in your module and add one line to
:data:`COMMANDS` (imports are lazy, so a command's heavy imports cost nothing to the others).

Commands:
    notebooks run [--smoke] [NAME ...] [--out DIR] [-p key=value ...]   run chapters headlessly
    notebooks list                                                      chapters and parameters
    sweep EXPERIMENT [--preset P] [--seeds ...] [--out DIR] [-p k=v]      experiment grid over seeds
    lab [CHAPTER] [--smoke] [--port P] [--token T]                      JupyterLab, widgets live
    serve [--port P] [--jupyter-port P] [--smoke]                       the book, live on a kernel
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

#: command name -> module whose ``add_subcommand(subparsers)`` registers it
COMMANDS: dict[str, str] = {
    "notebooks": "attention_atlas.notebooks",
    "train": "attention_atlas.train",
    "bench": "attention_atlas.bench",
    "sweep": "attention_atlas.sweep",
    "lab": "attention_atlas.lab",  # registers lab and serve
    "serve": "attention_atlas.lab",
}


def build_parser() -> argparse.ArgumentParser:
    """The full parser, every command of :data:`COMMANDS` registered."""
    parser = argparse.ArgumentParser(
        prog="python -m attention_atlas",
        description="Attention Atlas: run the book's chapters, training and benchmarks.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in dict.fromkeys(COMMANDS.values()):  # a module registers all its commands once
        importlib.import_module(module).add_subcommand(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the command, return its exit status."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())

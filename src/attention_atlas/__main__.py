"""Command line: ``python -m attention_atlas <command> ...`` (also the ``attention-atlas`` script).

Each command registers itself through a function that takes the argparse subparsers object
and adds one parser whose defaults carry ``func(args) -> int`` (the exit status). To add a
command, write ``add_subcommand(subparsers)`` in your module and add one line to
:data:`COMMANDS` (imports are lazy, so a command's heavy imports cost nothing to the others).

Commands:
    notebooks run [--smoke] [NAME ...] [--out DIR] [-p key=value ...]   run chapters headlessly
    notebooks list                                                      chapters and parameters
    train --task T --attention A [--config F] [-o key=value ...]        train a Transformer
    bench VARIANT ... [--baseline dot] [-L N]                           time attention variants
    sweep EXPERIMENT [--preset P] [--seeds ...] [--out DIR] [-p k=v]      experiment grid over seeds
          [--backend local|dask] [--workers N] [--address HOST:PORT]        (local pool or Dask)
    results list | show EXPERIMENT PRESET | verify [--sample N]         the stored results
    data {where,verify,fetch}                                           the data files
    claims [--json] [--seed S] [--smoke]                                the claims register
    lab [CHAPTER] [--smoke] [--port P]                      JupyterLab, widgets live
    serve [--port P] [--jupyter-port P] [--smoke]                       the book, live on a kernel
    atlas report SPEC [--preset P] [-o key=value] [--out DIR]           your attention, reported

Errors: bad input (an unknown name, a value out of range, a missing data file, a malformed
config file) prints one line ``error: ...`` naming what was expected and what came, and exits
with status 2; any other failure prints one line and exits with 1. ``--debug`` (anywhere on
the line) shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from .validate import InputError, one_line

#: command name -> module whose ``add_subcommand(subparsers)`` registers it
COMMANDS: dict[str, str] = {
    "notebooks": "attention_atlas.cli.notebooks",
    "train": "attention_atlas.cli.train",
    "bench": "attention_atlas.cli.bench",
    "sweep": "attention_atlas.cli.sweep",
    "results": "attention_atlas.cli.results",
    "data": "attention_atlas.cli.data",
    "claims": "attention_atlas.cli.claims",
    "lab": "attention_atlas.cli.lab",
    "serve": "attention_atlas.cli.serve",
    "atlas": "attention_atlas.cli.atlas",
}

#: exit status of bad input (as argparse uses), and of any other failure
EXIT_BAD_INPUT, EXIT_FAILED = 2, 1


class UsageError(InputError):
    """The command line does not parse (unknown option, missing or malformed argument)."""


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (raised as :class:`UsageError`)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    """The full parser, every command of :data:`COMMANDS` registered."""
    parser = Parser(
        prog="python -m attention_atlas",
        description="Attention Atlas: run the book's chapters, training and benchmarks.",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error (anywhere on the line)"
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in dict.fromkeys(COMMANDS.values()):  # a module registers all its commands once
        importlib.import_module(module).add_subcommand(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the command, return its exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args_list or os.environ.get("ATTENTION_ATLAS_DEBUG") == "1"
    args_list = [a for a in args_list if a != "--debug"]
    try:
        args = build_parser().parse_args(args_list)
        return int(args.func(args))
    except SystemExit as exit_:  # --help, or a command that exits on purpose
        return _exit_status(exit_)
    except KeyboardInterrupt:
        if debug:
            raise
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into a command that stopped reading (head, less)
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (stay quiet until exit)
        return 0
    except Exception as err:
        if debug:
            raise
        return _report(err)


def _exit_status(exit_: SystemExit) -> int:
    if exit_.code is None or isinstance(exit_.code, int):
        return int(exit_.code or 0)
    print(f"error: {one_line(exit_.code)}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _report(err: Exception) -> int:
    """One line on stderr; the exit status for ``err``."""
    if isinstance(err, InputError):
        print(f"error: {one_line(err)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    name: Any = type(err).__name__
    print(
        f"error: {name}: {one_line(err)} (run again with --debug for the traceback)",
        file=sys.stderr,
    )
    return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())

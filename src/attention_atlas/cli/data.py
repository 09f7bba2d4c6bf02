"""The ``data`` command: ``data where`` (the folder in use and why), ``data verify`` (every file
against its sha256), ``data fetch`` (download what is missing, where the network allows)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from attention_atlas.data.files import (
    ENV_VAR,
    FILES,
    DataFileError,
    data_dir_source,
    data_file,
    verify,
)
from attention_atlas.validate import ConfigError, close_matches

__all__ = ["add_subcommand"]


def add_subcommand(subparsers: Any) -> None:
    """Register ``data {where,verify,fetch}`` on the command line."""
    p = subparsers.add_parser(
        "data",
        help="where the data files are, verify them, fetch missing ones",
        description=(
            f"The text data (PTB, WikiText-2) lives in one folder: --data-dir, else ${ENV_VAR}, "
            "else a user cache. Example: python -m attention_atlas data verify"
        ),
    )
    sub = p.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    where = sub.add_parser("where", help="the data folder in use, and why that one")
    verify_ = sub.add_parser("verify", help="check every file against its sha256")
    fetch = sub.add_parser("fetch", help="download (or rebuild) missing files")
    fetch.add_argument("names", nargs="*", metavar="FILE", help="files to fetch (default: all)")
    fetch.add_argument(
        "--timeout", type=float, default=30.0, help="seconds per download (default 30)"
    )
    for q in (where, verify_, fetch):
        q.add_argument("--data-dir", default=None, help=f"data folder (default ${ENV_VAR})")
    where.set_defaults(func=_where)
    verify_.set_defaults(func=_verify)
    fetch.set_defaults(func=_fetch)


def _folder(args: argparse.Namespace) -> tuple[Any, str]:
    folder, why = data_dir_source(args.data_dir)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"--data-dir: {folder} is a file, expected a folder")
    return folder, why


def _where(args: argparse.Namespace) -> int:
    folder, why = _folder(args)
    state = "exists" if folder.is_dir() else "does not exist yet"
    print(f"{folder}  ({why}; {state})")
    return 0


def _verify(args: argparse.Namespace) -> int:
    folder, why = _folder(args)
    print(f"data folder {folder} ({why})")
    bad = 0
    for name in FILES:
        status = verify(name, folder)
        bad += status != "ok"
        print(f"{status if status in ('ok', 'missing') else 'BAD':8s} {name}"
              + ("" if status in ("ok", "missing") else f"  ({status})"))  # fmt: skip
    if bad:
        print(
            f"{bad} of {len(FILES)} file(s) missing or wrong; "
            "`python -m attention_atlas data fetch` gets missing ones",
            file=sys.stderr,
        )
    return 1 if bad else 0


def _fetch(args: argparse.Namespace) -> int:
    if not args.timeout > 0:
        raise ConfigError(f"--timeout: expected a number of seconds > 0, got {args.timeout}")
    for name in args.names:
        if name not in FILES:
            raise ConfigError(
                f"unknown data file {name!r}{close_matches(name, FILES)}; known: {', '.join(FILES)}"
            )
    folder, why = _folder(args)
    print(f"data folder {folder} ({why})")
    failed = 0
    for name in args.names or list(FILES):
        try:
            data_file(name, folder, timeout=args.timeout)
            print(f"ok       {name}")
        except DataFileError as err:
            failed += 1
            print(f"FAILED   {name}: {str(err).split('; fix:')[0]}", file=sys.stderr)
    return 1 if failed else 0

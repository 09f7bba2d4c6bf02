"""``python -m attention_atlas lab [CHAPTER]``: JupyterLab on the chapters, on 127.0.0.1 with a
token (the helpers: :mod:`attention_atlas.notebooks.lab`)."""

from __future__ import annotations

import argparse
from typing import Any

from attention_atlas.notebooks import repo_root, resolve_chapter
from attention_atlas.notebooks.lab import (
    SMOKE_ENV,
    TOKEN_ENV,
    check_port,
    run_until_signal,
    start_server,
)
from attention_atlas.validate import ConfigError

__all__ = ["add_subcommand", "run"]


def run(args: argparse.Namespace) -> int:
    """Check the arguments (the chapter, a free port), then run JupyterLab until a signal."""
    root = repo_root()
    url = "/lab"
    if args.chapter:
        try:
            chapter = resolve_chapter(args.chapter)
        except FileNotFoundError as err:
            raise ConfigError(f"CHAPTER: {err}") from None
        url = f"/lab/tree/{chapter.relative_to(root).as_posix()}"
    check_port(args.port, "--port")
    proc, token = start_server(
        port=args.port, root=root, smoke=args.smoke, open_browser=not args.no_browser,
        default_url=url, extra=[a for a in args.extra if a != "--"],
    )  # fmt: skip
    print(f"JupyterLab: http://127.0.0.1:{args.port}{url}?token={token}", flush=True)
    if args.smoke:
        print(f"chapters run with their SMOKE values ({SMOKE_ENV}=1)", flush=True)
    return run_until_signal(proc)


def add_subcommand(subparsers: Any) -> None:
    """Register ``lab``."""
    lab = subparsers.add_parser(
        "lab",
        help="JupyterLab on the chapters (127.0.0.1, token), widgets live",
        description="Start JupyterLab on the project: chapters open as notebooks (jupytext). "
        f"The token is ${TOKEN_ENV} when set, else a random one (printed); it never goes on a "
        "command line.",
    )
    lab.add_argument("chapter", nargs="?", help="open this chapter (stem or path)")
    lab.add_argument("--smoke", action="store_true", help=f"kernels use SMOKE values ({SMOKE_ENV})")
    lab.add_argument("--port", type=int, default=8888)
    lab.add_argument("--no-browser", action="store_true", help="do not open a browser")
    lab.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more jupyter lab options")
    lab.set_defaults(func=run)

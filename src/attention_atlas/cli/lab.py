"""``python -m attention_atlas lab [CHAPTER]``: JupyterLab on the chapters, on 127.0.0.1 with a
token (the helpers: :mod:`attention_atlas.notebooks.lab`)."""

from __future__ import annotations

import argparse
import secrets
import subprocess
from typing import Any

from attention_atlas.notebooks import repo_root, resolve_chapter
from attention_atlas.notebooks.lab import (
    SMOKE_ENV,
    ensure_jupytext_viewer,
    kernel_environment,
    lab_command,
    run_until_signal,
)

__all__ = ["add_subcommand", "run"]


def run(args: argparse.Namespace) -> int:
    root = repo_root()
    url = "/lab"
    if args.chapter:
        url = f"/lab/tree/{resolve_chapter(args.chapter).relative_to(root).as_posix()}"
    ensure_jupytext_viewer()
    token = args.token or secrets.token_hex(24)
    cmd = lab_command(
        port=args.port,
        token=token,
        root=root,
        open_browser=not args.no_browser,
        default_url=url,
        extra=[a for a in args.extra if a != "--"],
    )
    print(f"JupyterLab: http://127.0.0.1:{args.port}{url}?token={token}", flush=True)
    if args.smoke:
        print(f"chapters run with their SMOKE values ({SMOKE_ENV}=1)", flush=True)
    return run_until_signal(subprocess.Popen(cmd, env=kernel_environment(args.smoke), cwd=root))


def add_subcommand(subparsers: Any) -> None:
    """Register ``lab``."""
    lab = subparsers.add_parser(
        "lab",
        help="JupyterLab on the chapters (127.0.0.1, token), widgets live",
        description="Start JupyterLab on the project: chapters open as notebooks (jupytext).",
    )
    lab.add_argument("chapter", nargs="?", help="open this chapter (stem or path)")
    lab.add_argument("--smoke", action="store_true", help=f"kernels use SMOKE values ({SMOKE_ENV})")
    lab.add_argument("--port", type=int, default=8888)
    lab.add_argument("--token", help="the server's token (default: a random one, printed)")
    lab.add_argument("--no-browser", action="store_true", help="do not open a browser")
    lab.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more jupyter lab options")
    lab.set_defaults(func=run)

"""``python -m attention_atlas serve``: the built book over HTTP and a Jupyter server its pages
run on, both on 127.0.0.1 (the helpers: :mod:`attention_atlas.notebooks.lab`)."""

from __future__ import annotations

import argparse
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

from attention_atlas.notebooks import repo_root
from attention_atlas.notebooks.lab import (
    SMOKE_ENV,
    ensure_jupytext_viewer,
    kernel_environment,
    lab_command,
    live_fragment,
    run_until_signal,
    serve_book,
)

__all__ = ["add_subcommand", "run"]


def run(args: argparse.Namespace) -> int:
    root = repo_root()
    html = Path(args.html).resolve() if args.html else root / "_build" / "html"
    try:
        book = serve_book(html, args.port)
    except (FileNotFoundError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    origin = f"http://127.0.0.1:{book.server_address[1]}"
    ensure_jupytext_viewer()
    token = args.token or secrets.token_hex(24)
    jupyter = f"http://127.0.0.1:{args.jupyter_port}/"
    cmd = lab_command(port=args.jupyter_port, token=token, root=root, allow_origin=origin)
    proc = subprocess.Popen(cmd, env=kernel_environment(args.smoke), cwd=root)
    address = f"{origin}/index.html{live_fragment(jupyter, token)}"
    print(f"The book, live: {address}\n(Jupyter server {jupyter}, token {token})", flush=True)
    if not args.no_browser:
        import webbrowser

        webbrowser.open(address)

    def stop_book() -> None:
        book.shutdown()
        book.server_close()

    return run_until_signal(proc, stop_book)


def add_subcommand(subparsers: Any) -> None:
    """Register ``serve``."""
    serve = subparsers.add_parser(
        "serve",
        help="the built book and a local Jupyter server (127.0.0.1): pages go live",
        description="Serve _build/html and a Jupyter server that the book's pages run on.",
    )
    serve.add_argument("--port", type=int, default=8000, help="the book's port")
    serve.add_argument("--jupyter-port", type=int, default=8888)
    serve.add_argument("--token", help="the Jupyter server's token (default: random, printed)")
    serve.add_argument(
        "--smoke", action="store_true", help=f"kernels use SMOKE values ({SMOKE_ENV})"
    )
    serve.add_argument("--html", help="the built book (default _build/html)")
    serve.add_argument("--no-browser", action="store_true", help="do not open a browser")
    serve.set_defaults(func=run)

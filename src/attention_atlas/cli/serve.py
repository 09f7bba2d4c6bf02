"""``python -m attention_atlas serve``: the built book over HTTP and a Jupyter server its pages
run on, both on 127.0.0.1 (the helpers: :mod:`attention_atlas.notebooks.lab`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from attention_atlas.notebooks import repo_root
from attention_atlas.notebooks.lab import (
    SMOKE_ENV,
    TOKEN_ENV,
    check_port,
    live_fragment,
    run_until_signal,
    serve_book,
    start_server,
)
from attention_atlas.validate import ConfigError

__all__ = ["add_subcommand", "run"]


def run(args: argparse.Namespace) -> int:
    """Check the arguments (the built book, two free ports), then serve until a signal."""
    root = repo_root()
    html = Path(args.html).resolve() if args.html else root / "_build" / "html"
    check_port(args.port, "--port")
    check_port(args.jupyter_port, "--jupyter-port")
    if args.port == args.jupyter_port:
        raise ConfigError(f"--port and --jupyter-port must differ, both are {args.port}")
    try:
        book = serve_book(html, args.port)
    except (FileNotFoundError, OSError) as err:
        raise ConfigError(f"--html: {err}") from None
    origin = f"http://127.0.0.1:{book.server_address[1]}"
    jupyter = f"http://127.0.0.1:{args.jupyter_port}/"
    proc, token = start_server(
        port=args.jupyter_port, root=root, smoke=args.smoke, allow_origin=origin
    )
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
        description="Serve _build/html and a Jupyter server that the book's pages run on. "
        f"The token is ${TOKEN_ENV} when set, else a random one (printed); it never goes on a "
        "command line.",
    )
    serve.add_argument("--port", type=int, default=8000, help="the book's port")
    serve.add_argument("--jupyter-port", type=int, default=8888)
    serve.add_argument(
        "--smoke", action="store_true", help=f"kernels use SMOKE values ({SMOKE_ENV})"
    )
    serve.add_argument("--html", help="the built book (default _build/html)")
    serve.add_argument("--no-browser", action="store_true", help="do not open a browser")
    serve.set_defaults(func=run)

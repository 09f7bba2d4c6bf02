"""Exploring the book live: JupyterLab on the chapters, the built book on a local kernel, and the
switch that runs a chapter with its small ``SMOKE`` values from JupyterLab itself.

Commands (``python -m attention_atlas ...``; ``make lab`` and ``make serve`` call them):

``lab [CHAPTER] [--smoke] [--port P] [--token T] [--no-browser]``
    JupyterLab on the project, listening on 127.0.0.1 only, with a token. The chapters
    (``notebooks/*.py``, jupytext) open as notebooks; ``CHAPTER`` opens one directly. With
    ``--smoke`` every kernel runs its chapter with the ``SMOKE`` values (see :func:`apply_smoke`).

``serve [--port 8000] [--jupyter-port 8888] [--token T] [--smoke] [--html DIR] [--no-browser]``
    The built book (``_build/html``) over HTTP on 127.0.0.1, and a Jupyter server on 127.0.0.1
    that accepts the book's origin (``allow_origin``) and a token. Every chapter page has a
    "Go live" button (``book/_ext/atlas_book.py``) that runs the page's cells on that server,
    widgets drawn in the page. The address to open carries the server and token in its
    fragment (never sent over HTTP); the page keeps them in the browser's ``localStorage``.

The SMOKE switch: a chapter's ``smoke`` cell ends with ``apply_smoke(SMOKE, globals())``. In a
kernel started with ``ATTENTION_ATLAS_SMOKE=1`` (``make lab SMOKE=1``, ``lab --smoke``, or
``%env ATTENTION_ATLAS_SMOKE=1`` then *Restart and run all*) that call replaces the book's
parameters by the SMOKE values. Headless runs (papermill through ``notebooks run``, ``make
book``, the tests) set ``ATTENTION_ATLAS_HEADLESS=1`` and are never switched: papermill injects
its own values.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .notebooks import HEADLESS_ENV, ParameterError, repo_root, resolve_chapter
from .notebooks import validate_parameters as _validate

__all__ = ["SMOKE_ENV", "add_subcommand", "apply_smoke", "lab_command", "smoke_requested"]

#: set to 1 in a kernel's environment to run chapters with their SMOKE values
SMOKE_ENV = "ATTENTION_ATLAS_SMOKE"
#: JupyterLab setting that opens ``.py`` chapters as notebooks (jupytext)
JUPYTEXT_VIEWER = {
    "@jupyterlab/docmanager-extension:plugin": {"defaultViewers": {"python": "Jupytext Notebook"}}
}


def _on(name: str) -> bool:
    return os.environ.get(name, "").strip() not in ("", "0")


def smoke_requested() -> bool:
    """True in a live kernel started with ``ATTENTION_ATLAS_SMOKE=1`` (never when headless)."""
    return _on(SMOKE_ENV) and not _on(HEADLESS_ENV)


def apply_smoke(smoke: Mapping[str, Any], namespace: MutableMapping[str, Any]) -> None:
    """Replace the chapter's parameters in ``namespace`` (its ``globals()``) by ``smoke`` when
    :func:`smoke_requested`; otherwise do nothing. Prints the values applied (it returns
    nothing, so the smoke cell shows no value).

    Raises:
        ParameterError: a SMOKE name the parameters cell did not define, or a value of another
            type than the book's (the same check as ``notebooks run --smoke``).
    """
    if not smoke_requested():
        return
    missing = sorted(k for k in smoke if k not in namespace)
    if missing:
        raise ParameterError(f"SMOKE sets {missing}, which the parameters cell does not define")
    declared = {k: namespace[k] for k in smoke}
    checked = _validate(declared, smoke, chapter="this chapter", source="SMOKE")
    namespace.update(checked)
    shown = ", ".join(f"{k}={v!r}" for k, v in checked.items())
    print(f"SMOKE values in use ({SMOKE_ENV}=1): {shown}")


# -- servers -----------------------------------------------------------------------------------


def _ensure_jupytext_viewer() -> None:
    """Make JupyterLab open ``.py`` files as notebooks (a setting in this environment)."""
    path = Path(sys.prefix) / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    settings = json.loads(path.read_text()) if path.is_file() else {}
    key = "@jupyterlab/docmanager-extension:plugin"
    viewers = settings.setdefault(key, {}).setdefault("defaultViewers", {})
    if viewers.get("python") != "Jupytext Notebook":
        viewers["python"] = "Jupytext Notebook"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(settings, indent=2) + "\n")


def lab_command(
    *,
    port: int,
    token: str,
    root: Path,
    open_browser: bool = False,
    default_url: str = "/lab",
    allow_origin: str | None = None,
    extra: list[str] | None = None,
) -> list[str]:
    """The ``jupyter lab`` command line: 127.0.0.1 only, this port (no retries), this token."""
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.default_url={default_url}",
        f"--ServerApp.open_browser={open_browser}",
    ]
    if allow_origin:
        cmd.append(f"--ServerApp.allow_origin={allow_origin}")
    if hasattr(os, "getuid") and os.getuid() == 0:
        cmd.append("--allow-root")
    return cmd + list(extra or [])


def _environment(smoke: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.pop(HEADLESS_ENV, None)  # kernels of a lab are interactive
    if smoke:
        env[SMOKE_ENV] = "1"
    return env


def _run_until_signal(proc: subprocess.Popen, cleanup: Any = None) -> int:
    """Wait for ``proc``; on SIGINT/SIGTERM stop it (and ``cleanup()``) and return 0."""
    stopped = []

    def stop(signum: int, frame: Any) -> None:
        stopped.append(signum)
        proc.terminate()

    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = proc.wait()
        return 0 if stopped else code
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        if cleanup is not None:
            cleanup()
        for s, h in old.items():
            signal.signal(s, h)


def _cmd_lab(args: argparse.Namespace) -> int:
    root = repo_root()
    url = "/lab"
    if args.chapter:
        url = f"/lab/tree/{resolve_chapter(args.chapter).relative_to(root).as_posix()}"
    _ensure_jupytext_viewer()
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
    return _run_until_signal(subprocess.Popen(cmd, env=_environment(args.smoke), cwd=root))


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def serve_book(html: Path, port: int) -> http.server.ThreadingHTTPServer:
    """Serve the built book from ``html`` on 127.0.0.1 (a thread; ``.shutdown()`` stops it)."""
    if not (html / "index.html").is_file():
        raise FileNotFoundError(f"no built book at {html} (run `make book` first)")
    if not (html / "_static" / "vendor" / "thebe" / "index.js").is_file():
        raise FileNotFoundError(
            f"the book at {html} has no thebe (built before it was vendored): run `make book`"
        )
    handler = functools.partial(_QuietHandler, directory=str(html))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def live_fragment(jupyter_url: str, token: str) -> str:
    """The URL fragment that tells the book's pages where the Jupyter server is."""
    return f"#atlas-jupyter={quote(jupyter_url, safe='')}&atlas-token={quote(token, safe='')}"


def _cmd_serve(args: argparse.Namespace) -> int:
    root = repo_root()
    html = Path(args.html).resolve() if args.html else root / "_build" / "html"
    try:
        book = serve_book(html, args.port)
    except (FileNotFoundError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    origin = f"http://127.0.0.1:{book.server_address[1]}"
    _ensure_jupytext_viewer()
    token = args.token or secrets.token_hex(24)
    jupyter = f"http://127.0.0.1:{args.jupyter_port}/"
    cmd = lab_command(port=args.jupyter_port, token=token, root=root, allow_origin=origin)
    proc = subprocess.Popen(cmd, env=_environment(args.smoke), cwd=root)
    address = f"{origin}/index.html{live_fragment(jupyter, token)}"
    print(f"The book, live: {address}\n(Jupyter server {jupyter}, token {token})", flush=True)
    if not args.no_browser:
        import webbrowser

        webbrowser.open(address)

    def stop_book() -> None:
        book.shutdown()
        book.server_close()

    return _run_until_signal(proc, stop_book)


def add_subcommand(subparsers: Any) -> None:
    """Register ``lab`` and ``serve``."""
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
    lab.set_defaults(func=_cmd_lab)
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
    serve.set_defaults(func=_cmd_serve)

"""Exploring the book live: JupyterLab on the chapters, the built book on a local kernel, and the
switch that runs a chapter with its small ``SMOKE`` values from JupyterLab itself.

Commands (``python -m attention_atlas ...``, :mod:`attention_atlas.cli.lab` and
:mod:`attention_atlas.cli.serve`; ``make lab`` and ``make serve`` call them):

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

import functools
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from . import HEADLESS_ENV, ParameterError
from . import validate_parameters as _validate

__all__ = [
    "SMOKE_ENV",
    "apply_smoke",
    "ensure_jupytext_viewer",
    "kernel_environment",
    "lab_command",
    "live_fragment",
    "run_until_signal",
    "serve_book",
    "smoke_requested",
]

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


def ensure_jupytext_viewer() -> None:
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


def kernel_environment(smoke: bool) -> dict[str, str]:
    """This process's environment for a lab's kernels: interactive (not headless), with the
    SMOKE switch on when ``smoke``."""
    env = dict(os.environ)
    env.pop(HEADLESS_ENV, None)  # kernels of a lab are interactive
    if smoke:
        env[SMOKE_ENV] = "1"
    return env


def run_until_signal(proc: subprocess.Popen, cleanup: Any = None) -> int:
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

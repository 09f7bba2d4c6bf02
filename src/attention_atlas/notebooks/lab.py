"""Exploring the book live: JupyterLab on the chapters, the built book on a local kernel, and the
switch that runs a chapter with its small ``SMOKE`` values from JupyterLab itself.

Commands (``python -m attention_atlas ...``, :mod:`attention_atlas.cli.lab` and
:mod:`attention_atlas.cli.serve`; ``make lab`` and ``make serve`` call them):

``lab [CHAPTER] [--smoke] [--port P] [--no-browser]``
    JupyterLab on the project, listening on 127.0.0.1 only, with a token. The chapters
    (``notebooks/*.py``, jupytext) open as notebooks; ``CHAPTER`` opens one directly. With
    ``--smoke`` every kernel runs its chapter with the ``SMOKE`` values (see :func:`apply_smoke`).

``serve [--port 8000] [--jupyter-port 8888] [--smoke] [--html DIR] [--no-browser]``
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

import ctypes
import functools
import http.server
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from attention_atlas.validate import ConfigError

from . import HEADLESS_ENV, ParameterError
from . import validate_parameters as _validate

__all__ = [
    "SMOKE_ENV",
    "TOKEN_ENV",
    "apply_smoke",
    "check_port",
    "ensure_jupytext_viewer",
    "kernel_environment",
    "lab_command",
    "live_fragment",
    "run_until_signal",
    "serve_book",
    "server_token",
    "smoke_requested",
    "start_server",
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
    root: Path,
    open_browser: bool = False,
    default_url: str = "/lab",
    allow_origin: str | None = None,
    extra: list[str] | None = None,
) -> list[str]:
    """The ``jupyter lab`` command line: 127.0.0.1 only, this port (no retries). The token is
    not on it (any local account reads command lines with ``ps``): the server reads it from
    ``JUPYTER_TOKEN`` in its environment (:func:`kernel_environment`)."""
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.default_url={default_url}",
        f"--ServerApp.open_browser={open_browser}",
    ]
    if allow_origin:
        cmd.append(f"--ServerApp.allow_origin={allow_origin}")
    if hasattr(os, "getuid") and os.getuid() == 0:
        cmd.append("--allow-root")
    return cmd + list(extra or [])


#: the environment variable a token for ``lab``/``serve`` is read from (never an argument)
TOKEN_ENV = "ATTENTION_ATLAS_TOKEN"


def server_token() -> str:
    """The token of a ``lab``/``serve`` server: ``$ATTENTION_ATLAS_TOKEN`` when set, else a
    fresh random one."""
    return os.environ.get(TOKEN_ENV) or secrets.token_hex(24)


def kernel_environment(smoke: bool, token: str) -> dict[str, str]:
    """The Jupyter server's environment (its kernels inherit it): interactive (not headless),
    the SMOKE switch on when ``smoke``, and the token in ``JUPYTER_TOKEN`` (readable only by this
    user, unlike a command line)."""
    env = dict(os.environ)
    env.pop(HEADLESS_ENV, None)  # kernels of a lab are interactive
    env.pop(TOKEN_ENV, None)
    env["JUPYTER_TOKEN"] = token
    if smoke:
        env[SMOKE_ENV] = "1"
    return env


def check_port(port: int, option: str) -> None:
    """``port`` is a TCP port (1 to 65535) that is free on 127.0.0.1; else :class:`ConfigError`
    naming ``option``."""
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise ConfigError(f"{option}: expected a port from 1 to 65535, got {port!r}")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as err:
            raise ConfigError(f"{option}: 127.0.0.1:{port} is not free ({err.strerror})") from None


def _die_with_parent() -> None:  # pragma: no cover - runs in the child, before exec
    """In the child of :func:`start_server`: SIGTERM when the parent dies (Linux), so a killed
    ``lab``/``serve`` takes its server, which stops its kernels, with it."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def start_server(
    *, port: int, root: Path, smoke: bool, **options: Any
) -> tuple[subprocess.Popen, str]:
    """Start ``lab`` and ``serve``'s Jupyter server on 127.0.0.1:``port`` over ``root``
    (:func:`lab_command` with ``options``), its token (:func:`server_token`) in its environment
    (:func:`kernel_environment`), tied to this process's life (:func:`_die_with_parent`);
    ``(process, token)``."""
    ensure_jupytext_viewer()
    token = server_token()
    cmd = lab_command(port=port, root=root, **options)
    env = kernel_environment(smoke, token)
    return subprocess.Popen(cmd, env=env, cwd=root, preexec_fn=_die_with_parent), token


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

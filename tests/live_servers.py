"""Servers for the browser tests, started with the project's own commands
(``python -m attention_atlas lab`` / ``serve``) on 127.0.0.1 with a token, and always stopped:
the command, the Jupyter server and every kernel it started."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import psutil

from attention_atlas.notebooks import chapters

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
_EXPLORE_CALL = re.compile(r"\bviz\.explore\(")


def figure_data_js(selector: str) -> str:
    """A page function returning the data of the first plotly figure matching ``selector`` as
    a string (null while there is none): each trace's x, y, z and, for a table, its cells, so
    a recomputed figure of any kind compares unequal to the old one."""
    traces = "[t.x, t.y, t.z, t.cells ? t.cells.values : null]"
    return (
        f"() => {{ const plot = document.querySelector({json.dumps(selector)});"
        f" if (!plot || !plot.data) return null; return JSON.stringify(plot.data.map(t => {traces})); }}"
    )


def has_main_control(source: str) -> bool:
    """Whether ``source`` calls ``viz.explore(..., main=True)``: the call that marks a chapter's
    main exploration (the control the browser tests move). The call's arguments are found by
    balancing parentheses, so nested calls and tuples inside it do not hide the keyword."""
    for match in _EXPLORE_CALL.finditer(source):
        depth, start = 1, match.end()
        for i in range(start, len(source)):
            depth += {"(": 1, ")": -1}.get(source[i], 0)
            if depth == 0:
                if re.search(r"(?<![\w.])main\s*=\s*True\b", source[start:i]):
                    return True
                break
    return False


#: JupyterLab user settings for the tests: never save the chapter (a .py file, through
#: jupytext), render every cell (no windowing), no news or update checks
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker": {
        "windowingMode": "none",
        "autoStartDefaultKernel": True,
    },
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LabServer:
    """A running ``attention_atlas lab``/``serve`` command and where to reach it."""

    proc: subprocess.Popen
    port: int
    token: str
    log: Path
    book_port: int | None = None
    processes: set[int] = field(default_factory=set)

    def url(self, path: str = "") -> str:
        sep = "&" if "?" in path else "?"
        return f"http://127.0.0.1:{self.port}/{path}{sep}token={self.token}"

    def tree(self) -> list[psutil.Process]:
        """The command and its descendants (Jupyter server, kernels)."""
        try:
            root = psutil.Process(self.proc.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        self.processes.update(p.pid for p in procs)
        return procs

    def start_session(self, path: str, kernel: str = "python3") -> str:
        """Start a kernel session for the notebook at ``path`` (relative to the server root)
        through the REST API, so JupyterLab opens the notebook on it without asking which
        kernel to use; the kernel id."""
        body = json.dumps({"path": path, "name": Path(path).name, "type": "notebook",
                           "kernel": {"name": kernel}}).encode()  # fmt: skip
        req = urllib.request.Request(self.url("api/sessions"), data=body, method="POST",
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=60) as r:
            return str(json.loads(r.read())["kernel"]["id"])

    def shutdown_kernels(self) -> int:
        """Shut down every kernel of the Jupyter server (REST API); the number shut down."""
        with urllib.request.urlopen(self.url("api/kernels"), timeout=30) as r:
            kernels = json.loads(r.read())
        for k in kernels:
            req = urllib.request.Request(self.url(f"api/kernels/{k['id']}"), method="DELETE")
            with contextlib.suppress(OSError), urllib.request.urlopen(req, timeout=30):
                pass
        return len(kernels)

    def listening_addresses(self) -> list[tuple[str, int]]:
        """Every (ip, port) a process of the tree listens on (TCP), kernels included."""
        found = []
        for p in self.tree():
            with contextlib.suppress(psutil.Error):
                for c in p.net_connections(kind="inet"):
                    if c.status == psutil.CONN_LISTEN:
                        found.append((c.laddr.ip, c.laddr.port))
        return found

    def stop(self) -> None:
        """SIGTERM the command (it stops Jupyter, which stops its kernels); then SIGKILL
        whatever of the tree is left."""
        self.tree()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        for pid in self.processes:
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                p.kill()
                p.wait(timeout=10)


def _lab_environment(workdir: Path) -> dict[str, str]:
    settings = workdir / "settings"
    for plugin, values in LAB_SETTINGS.items():
        f = settings / f"{plugin}.jupyterlab-settings"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(values))
    config = workdir / "config"  # checkpoints out of the project's notebooks/
    config.mkdir(exist_ok=True)
    checkpoints = {"FileCheckpoints": {"checkpoint_dir": str(workdir / "checkpoints")}}
    (config / "jupyter_server_config.json").write_text(json.dumps(checkpoints))
    env = dict(os.environ)
    env.pop("ATTENTION_ATLAS_HEADLESS", None)
    env.update(
        JUPYTER_CONFIG_DIR=str(config),
        JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(workdir / "workspaces"),
        JUPYTER_RUNTIME_DIR=str(workdir / "runtime"),
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
    )
    return env


def _wait_ready(server: LabServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(
                f"the server exited ({server.proc.returncode}):\n{server.log.read_text()[-4000:]}"
            )
        try:
            with urllib.request.urlopen(server.url("api/status"), timeout=5) as r:
                if r.status == 200:
                    server.tree()
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"no answer within {timeout:.0f} s:\n{server.log.read_text()[-4000:]}")


@contextlib.contextmanager
def start_lab(
    workdir: Path, *, smoke: bool = True, html: Path | None = None
) -> Iterator[LabServer]:
    """``python -m attention_atlas lab --smoke`` (or, given a built book ``html``, ``serve``:
    the book and the Jupyter server) on free ports with a fresh token; yields once the Jupyter
    server answers; always stopped."""
    port, token = free_port(), secrets.token_hex(16)
    if html is not None:
        book_port: int | None = free_port()
        args = ["serve", "--port", str(book_port), "--jupyter-port", str(port)]
        args += ["--html", str(html)]
    else:
        book_port = None
        args = ["lab", "--port", str(port)]
    args += ["--no-browser"] + (["--smoke"] if smoke else [])
    log = workdir / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "attention_atlas", *args],
            cwd=ROOT,
            env={**_lab_environment(workdir), "ATTENTION_ATLAS_TOKEN": token},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = LabServer(proc, port, token, log, book_port)
    try:
        _wait_ready(server, timeout=180)
        yield server
    finally:
        server.stop()


# -- in the browser --------------------------------------------------------------------------


def chapters_with_a_main_control() -> list[Path]:
    """Chapters whose source calls ``viz.explore(..., main=True)``."""
    return [p for p in chapters(ROOT / "notebooks") if has_main_control(p.read_text())]


def block_other_hosts(context: Any, blocked: list[str]) -> None:
    """Abort every request of a Playwright browser context to a host other than 127.0.0.1,
    recording its URL in ``blocked``."""

    def route(r: Any) -> None:
        url = r.request.url
        if url.startswith(("data:", "blob:", "about:")) or urlparse(url).hostname == "127.0.0.1":
            r.continue_()
        else:
            blocked.append(url)
            r.abort()

    context.route("**/*", route)


def move_control(control: Any) -> str:
    """Move a control one step: a slider's handle by the keyboard, a menu to its next entry,
    a text box to a new text. Returns what was done."""
    handle = control.locator(".noUi-handle")
    if handle.count():
        now, top = (handle.first.get_attribute(a) for a in ("aria-valuenow", "aria-valuemax"))
        at_top = now is not None and top is not None and float(now) >= float(top)
        key, way = ("ArrowLeft", "left") if at_top else ("ArrowRight", "right")
        handle.first.focus()
        for _ in range(3):
            handle.first.press(key)
        return f"main control (a slider) moved 3 steps {way}"
    select = control.locator("select")
    if select.count():
        values = select.first.locator("option").evaluate_all("os => os.map(o => o.value)")
        current = select.first.input_value()
        select.first.select_option(values[(values.index(current) + 1) % len(values)])
        return "main control (a menu) moved to its next entry"
    box = control.locator("input, textarea").first
    box.fill(box.input_value() + " more")
    box.press("Enter")
    return "main control (a text box) changed"

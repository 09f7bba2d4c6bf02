"""The ``lab`` server keeps its secret and its life: the token is on no command line (any local
account reads those with ``ps``), the address printed is the one served, and a wrapper killed
with SIGKILL takes its Jupyter server with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from live_servers import free_port

ROOT = Path(__file__).resolve().parents[1]


def _command_lines() -> dict[int, str]:
    """Every process's command line (``/proc/<pid>/cmdline``), by pid."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                out[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                pass
    return out


def _answers(port: int, token: str) -> bool:
    try:
        url = f"http://127.0.0.1:{port}/api/status?token={token}"
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc (Linux)")
def test_the_token_is_on_no_command_line_and_the_server_dies_with_its_wrapper(tmp_path):
    port, token = free_port(), "t" + os.urandom(16).hex()
    env = {**os.environ, "ATTENTION_ATLAS_TOKEN": token, "JUPYTER_CONFIG_DIR": str(tmp_path / "c"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "r"), "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "w")}  # fmt: skip
    log = (tmp_path / "lab.log").open("w")
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "attention_atlas", "lab", "--port", str(port), "--no-browser"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not _answers(port, token):
            assert wrapper.poll() is None, (tmp_path / "lab.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the server did not answer within 120 s"
            time.sleep(0.5)
        printed = (tmp_path / "lab.log").read_text()
        assert f"http://127.0.0.1:{port}/lab?token={token}" in printed  # the address served
        holders = [pid for pid, line in _command_lines().items() if token in line]
        assert not holders, f"the token is on the command line of {holders}"
        wrapper.send_signal(signal.SIGKILL)
        wrapper.wait(timeout=10)
        deadline = time.monotonic() + 60
        while _answers(port, token):
            assert time.monotonic() < deadline, "the server outlived its wrapper by 60 s"
            time.sleep(0.5)
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
        log.close()

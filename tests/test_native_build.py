"""A cold native build on a busy machine: several processes start at once with an empty kernel
cache while other processes keep every core busy, and the compiler is slow. The kernels are
compiled once (under the cross-process lock), every process waits for that build however long it
takes (there is no timeout that turns a slow build into a failure), and all of them load it and
compute with it. The compiler is a wrapper that waits before compiling at ``-O0`` (the real
``-O3`` build takes minutes on a busy 2-core machine; the locking and waiting are the same)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import time, torch
from attention_atlas import native
t0 = time.perf_counter()
print(native.status(), flush=True)
x = torch.randn(7, 5, dtype=torch.float64)
out = x.new_empty(7)
native.call("sumsq", x, out, *x.shape)
err = (out - (x * x).sum(-1)).abs().max().item()
print(f"error {err:.3g} waited {time.perf_counter() - t0:.1f}", flush=True)
"""


@pytest.mark.timeout(900)
def test_a_cold_build_under_load_is_compiled_once_and_every_process_waits_for_it(tmp_path):
    log = tmp_path / "cc.log"
    cc = tmp_path / "slow-cc"
    cc.write_text(f'#!/bin/sh\necho "$$" >> "{log}"\nsleep 20\nexec cc "$@" -O0\n')
    cc.chmod(cc.stat().st_mode | stat.S_IEXEC)
    cache = tmp_path / "cache"
    env = {**os.environ, "ATTENTION_ATLAS_CACHE": str(cache), "CC": str(cc),
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 2)]  # fmt: skip
    try:
        t0 = time.monotonic()
        procs = [subprocess.Popen([sys.executable, "-c", PROBE], env=env, cwd=ROOT, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for _ in range(3)]  # fmt: skip
        outs = [p.communicate(timeout=840) for p in procs]
        took = time.monotonic() - t0
    finally:
        for b in busy:
            b.kill()
            b.wait()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        lines = out.splitlines()
        assert lines[0] == "native kernels loaded", out + err
        assert float(lines[1].split()[1]) < 1e-12, out
    assert len(log.read_text().split()) == 1, "the kernels were compiled more than once"
    built = sorted(p.name for p in cache.rglob("*") if p.is_file())
    assert [n for n in built if n.endswith(".so")] == [b for b in built if b.startswith("kernels-")]
    assert len([n for n in built if n.endswith(".so")]) == 1 and not any(
        n.endswith(".partial") for n in built
    ), built
    assert took > 20, "the build was not slow: the processes did not have to wait"

"""The prepared run for your GPU machine (benchmarks/gpu_run.sh), rehearsed on this CPU with
smoke grids in a scratch results store: it benchmarks, sweeps both long grids' cells within its
time budget and packs what it made into one file, results.tgz, to bring back and extract here."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from data_helpers import SHARED

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(
    not (SHARED / "ptb-char" / "ptb.char.train.txt").exists(), reason="char-PTB not in the data"
)
def test_the_gpu_run_rehearses_on_a_cpu(tmp_path: Path) -> None:
    # BUDGET_S caps the script (it ends early on an idle machine): 900 s leaves room for a
    # machine whose two cores another process keeps busy, where 300 s cut the fifth seed
    env = {**os.environ, "SMOKE": "1", "DEVICE": "cpu", "NO_WHEELS": "1", "PYTHON": sys.executable,
           "LENGTHS": "256", "BUDGET_S": "900", "WORKERS": "1", "CPU_WORKERS": "1", "OUT": str(tmp_path),
           "ATTENTION_ATLAS_DATA": str(SHARED)}  # fmt: skip
    env.pop("ATTENTION_ATLAS_RESULTS", None)
    done = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_run.sh")], env=env,
                          capture_output=True, text=True, timeout=1200)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert (tmp_path / "env.txt").read_text().startswith("torch ")
    profile = (tmp_path / "profile.txt").read_text()  # where the two costliest steps go
    assert "== riemannian, shape book" in profile and "== fiber_bundle, shape book" in profile
    with tarfile.open(tmp_path / "results.tgz") as tar:
        names = tar.getnames()
    assert "store/bench/cpu/kernels-float32.json" in names
    assert "store/bench/cpu/train-book.json" in names  # the training steps' record
    for grid, arms in (("fiber-bundle", ("fbt__", "fbt_reg-none__")), ("matroidal", ("",))):
        cells = [n for n in names if n.startswith(f"store/{grid}/smoke/cells/")]
        assert cells and all(n.endswith(".json") for n in cells), names
        assert all(any(Path(c).name.startswith(a) for c in cells) for a in arms)
    assert not any(n.endswith(".lock") for n in names)
    sweep_log = (tmp_path / "sweep.txt").read_text()
    assert "sweep fiber-bundle ended (0)" in sweep_log
    assert "sweep matroidal (CPU) seed 4 ended (0)" in sweep_log  # seeds 0 to 4 on the "CPU"
    assert "sweep matroidal (GPU) seed 5 ended (0)" in sweep_log  # and seed 5 beside them
    matroidal = [n for n in names if n.startswith("store/matroidal/smoke/cells/")]
    assert {int(Path(n).name.split("__seed")[1].split("__")[0]) for n in matroidal} == set(range(6))

"""Data-parallel training: two gloo processes reproduce one process on the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

DDP_SCRIPT = """
import json, sys, torch
from attention_atlas.data import copy_task
from attention_atlas.models import ModelConfig
from attention_atlas.train import TrainConfig, train
torch.set_num_threads(1)
data = copy_task(256, 64, length=6, vocab=5)
extra = json.loads(sys.argv[2])
cfg = TrainConfig(steps=6, batch_size=8, lr=1e-2, warmup_steps=2, log_every=3, eval_batches=2,
                  progress=False, measure_flops=False, checkpoint_every=3, out_dir=sys.argv[1],
                  **extra)
res = train(ModelConfig(dim=16, n_layers=2, n_heads=2), cfg, data)
if int(__import__("os").environ.get("RANK", "0")) == 0:
    torch.save(res.model.state_dict(), sys.argv[1] + "/final.pt")
    json.dump({"history": res.history[["train_loss", "val_loss"]].values.tolist(),
               "world": res.record["world_size"]}, open(sys.argv[1] + "/out.json", "w"))
"""


#: the cofactor regulariser on the native kernels adds its query and key gradients in place
#: (native_heads.inplace_grads), under data parallel as in one process
COFACTOR = {"native": True,
            "regularizers": [{"name": "cofactor", "weight": 0.01, "heads": 1, "beta": 0.1}]}  # fmt: skip


@pytest.mark.parametrize("extra", [{}, COFACTOR], ids=["plain", "cofactor-native"])
def test_a_two_process_gloo_run_matches_one_process_on_the_same_global_batch(tmp_path, extra):
    script = tmp_path / "ddp_run.py"
    script.write_text(DDP_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one, two = tmp_path / "one", tmp_path / "two"
    arg = json.dumps(extra)
    subprocess.run([sys.executable, str(script), str(one), arg], check=True, env=env, timeout=120)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--standalone", str(script), str(two), arg]  # fmt: skip
    proc = subprocess.run(torchrun, env=env, timeout=180, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r1, r2 = (json.loads((p / "out.json").read_text()) for p in (one, two))
    assert r1["world"] == 1 and r2["world"] == 2
    assert (two / "checkpoint.pt").exists()
    w1, w2 = (torch.load(p / "final.pt") for p in (one, two))
    for n in w1:
        torch.testing.assert_close(w1[n], w2[n], atol=2e-5, rtol=1e-4, msg=n)
    for a, b in zip(r1["history"], r2["history"]):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-5)

"""``check_cell`` of every experiment module: it accepts every configuration of every preset as
it is, and ``python -m attention_atlas sweep`` refuses a ``-p`` value that a cell would reject
(or run into nonsense) before any cell runs: one line ``error: ...`` naming the parameter, exit
status 2, no traceback, nothing written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from attention_atlas.__main__ import main
from attention_atlas.experiments import EXPERIMENTS, experiment

torch.set_num_threads(1)  # tiny ops on a shared 2-core machine: threads only contend

SHARED = Path(os.environ.get("ATTENTION_ATLAS_DATA", "/work/shared/data"))
#: the experiments whose grid reads data (cofactor's counts FLOPs on WikiText-2 and the digits)
NEEDS_DATA = {"cofactor": SHARED / "wikitext-2" / "train.txt"}


@pytest.fixture(autouse=True)
def _data(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared data folder for the grids that read data (never a download)."""
    if SHARED.is_dir():
        monkeypatch.setenv("ATTENTION_ATLAS_DATA", str(SHARED))


def _skip_without_data(name: str) -> None:
    if name in NEEDS_DATA and not NEEDS_DATA[name].exists():
        pytest.skip(f"{name}'s grid needs {NEEDS_DATA[name]} (set $ATTENTION_ATLAS_DATA)")


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_check_cell_accepts_every_configuration_of_every_preset(name: str) -> None:
    mod = experiment(name)
    assert callable(getattr(mod, "check_cell", None)), f"{name} has no check_cell"
    if hasattr(mod, "__all__"):
        assert "check_cell" in mod.__all__
    _skip_without_data(name)
    for preset in mod.PRESETS:
        for params in mod.chapter_grid(**mod.PRESETS[preset]).values():
            assert mod.check_cell(params) is None


#: who refuses a value: the experiment's check_cell (the grid accepts it), or chapter_grid
CELL, GRID = "configuration", "grid"
#: experiment -> (``-p`` value on the smoke preset, a fragment of the one-line message, who
#: refuses it)
BAD: dict[str, list[tuple[str, str, str]]] = {
    "atlas": [
        ("variant=nosuch", "variant: expected a registered name", GRID),
        ("depth=0", "depth: expected an integer >= 1, got 0", CELL),
        ("rank_lengths=[8,0]", "lengths: expected an integer >= 1, got 0", CELL),
        ("cost_reps=0", "reps: expected an integer >= 1, got 0", CELL),
        ('zoo="nosuch"', "zoo: expected one of smoke, book, long", GRID),
        ('zoo_params={"steps": 0}', "train setting steps: expected a value >= 1, got 0", CELL),
        ('options={"nosuch": 1}', "options: dot has no constructor option 'nosuch'", CELL),
    ],
    "cofactor": [
        ("lr=-0.003", "train setting lr: expected a value > 0", CELL),
        ("train_steps=0", "train setting steps: expected a value >= 1, got 0", CELL),
        ("eval_batches=0", "train setting eval_batches", CELL),
        ("reg_heads=3", "reg_heads: expected an integer from 1 to n_heads=2, got 3", CELL),
        ("alpha=-0.001", "alpha: expected a finite number > 0, got -0.001", CELL),
        ("beta=-1", "beta: expected a finite number >= 0, got -1", CELL),
        ("spike_ratio=0", "spike_ratio: expected a finite number > 0, got 0", CELL),
        ("probe_items=0", "probe_items: expected an integer >= 1, got 0", CELL),
    ],
    "fiber-bundle": [
        ("lr=-0.003", "train setting lr: expected a value > 0", CELL),
        ("steps=0", "train setting steps: expected a value >= 1, got 0", CELL),
        ("n_heads=3", "dim=32 is not divisible by n_heads=3", CELL),
        ("ranks=[0]", "rank must be positive, got 0", CELL),
        ("kappa_factors=[-1.0]", "kappa_factor: expected a finite number > 0, got -1.0", CELL),
        ("alphas=[2.0]", "alphas: expected a finite number in [0, 1], got 2.0", CELL),
        ('reg_weights={"antti": 1.0}', "reg_weights: unknown weight 'antti'", CELL),
        ("analyse_seqs=0", "analyse_seqs: expected an integer >= 1, got 0", CELL),
        ("explore_len=64", "explore_len: expected at most the model's length 32, got 64", CELL),
    ],
    "matroidal": [
        ("steps=0", "train setting steps: expected a value >= 1, got 0", CELL),
        ("lr=-0.003", "train setting lr: expected a value > 0", CELL),
        ("n_heads=0", "model setting n_heads: expected a value >= 1, got 0", CELL),
        ("m_multiples=[0]", "the number of edges m must be positive", CELL),
        ('families=["nosuch"]', "unknown covector family 'nosuch'", CELL),
        ("fractions=[0]", "fractions: expected numbers in (0, 1], got 0.0", CELL),
        ("prune_fractions=[1.0]", "prune_fractions: expected numbers in [0, 1), got 1.0", CELL),
    ],
    "rank-collapse": [
        ("dim=16.5", "dim: expected an integer >= 1, got 16.5", CELL),
        ("depth=2.5", "depth: expected an integer >= 1, got 2.5", CELL),
        ("length=32.5", "length: expected an integer >= 2, got 32.5", CELL),
        ("token_rank=2.5", "ranks or token_rank: expected an integer >= 1, got 2.5", CELL),
        ("entries=[-1]", "entries must be non-negative numbers", GRID),
    ],
    "ssd-scaling": [
        ("chunk_size=0", "chunk_size: expected an integer >= 1, got 0", CELL),
        ("heads=0", "heads: expected an integer >= 1, got 0", CELL),
        ("lengths=[]", "lengths: expected a non-empty list, got []", CELL),
        ("flop_lengths=[64, 64]", "flop_lengths: expected distinct lengths", CELL),
        ("accuracy_length=0", "accuracy_length: expected an integer >= 1, got 0", CELL),
        ("reps=0", "reps: expected an integer >= 1, got 0", CELL),
        ("max_seconds=-1", "max_seconds: expected a finite number > 0, got -1", CELL),
        ("memory_gb=0", "memory_gb: expected a finite number > 0, got 0", CELL),
    ],
    "claims": [
        ("smoke=2", "smoke: expected true or false, got 2", CELL),
        ('smoke="no"', "smoke: expected true or false, got 'no'", CELL),
        ('modules=["nosuch"]', "modules: unknown ['nosuch']", GRID),
    ],
    "ssm-lm": [
        ("steps=0", "steps: expected an integer >= 1, got 0", CELL),
        ("batch=0", "batch: expected an integer >= 1, got 0", CELL),
        ("heads=0", "heads: expected an integer >= 1, got 0", CELL),
        ("lr=-0.01", "lr: expected a finite number > 0, got -0.01", CELL),
        ("dim=33", "dim=33 is not divisible by n_heads=2", CELL),
        ("chunk_size=0", "chunk_size: expected an integer >= 1, got 0", CELL),
    ],
    "toy": [
        ("seq_len=1", "seq_len: expected an integer >= 2, got 1", CELL),
        ("steps=0", "steps: expected an integer >= 1, got 0", GRID),
        ("lr=-1", "lr: expected a finite number > 0, got -1", GRID),
        ("n_heads=3", "dims: 8 is not divisible by n_heads=3", GRID),
    ],
    "zoo": [
        ("steps=0", "train setting steps: expected a value >= 1, got 0", CELL),
        ("lrs=[-0.001]", "lrs: expected a finite number > 0, got -0.001", CELL),
        ("n_heads=3", "dim=16 is not divisible by n_heads=3", CELL),
        ("n_train=0", "n_train: expected an integer >= 1, got 0", CELL),
        ("vocab_size=4", "vocab_size=4", CELL),
        ("ptb_budget_s=-1", "ptb_budget_s: expected a finite number > 0, got -1", CELL),
        ("ptb_lr=-0.003", "train setting lr: expected a value > 0", CELL),
        ('variants=["ssm"]', "variants must include the control 'dot'", GRID),
        ("time_batch=0", "time_batch: expected an integer >= 1, got 0", CELL),
        ("time_reps=0", "time_reps: expected an integer >= 1, got 0", CELL),
        ("cofactor_weight=-1", "cofactor_weight: expected a finite number > 0, got -1", CELL),
    ],
}
CASES = [(name, *case) for name, cases in BAD.items() for case in cases]


def test_every_experiment_has_bad_values() -> None:
    assert set(BAD) == set(EXPERIMENTS)
    for cases in BAD.values():  # toy's grid checks nearly all of it: one value only a cell refuses
        assert len(cases) >= 3 and any(by == CELL for *_, by in cases)


@pytest.mark.parametrize(
    ("name", "value", "fragment", "by"), CASES, ids=[f"{n}:{v}" for n, v, *_ in CASES]
)
def test_sweep_refuses_a_bad_cell_parameter(
    name: str,
    value: str,
    fragment: str,
    by: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _skip_without_data(name)
    monkeypatch.setenv("ATTENTION_ATLAS_RESULTS", str(tmp_path))
    out = tmp_path / "out"
    argv = ["sweep", name, "--preset", "smoke", "--seeds", "0", "--out", str(out), "-p", value]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and lines[0].strip(), err
    assert fragment in lines[0], lines[0]
    assert lines[0].startswith(f"error: {name} {by}"), lines[0]  # refused by check_cell or the grid
    assert "Traceback" not in err
    assert not out.exists()

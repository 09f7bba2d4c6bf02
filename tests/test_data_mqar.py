"""Multi-query associative recall (MQAR): the format (pairs, then every key queried once among
noise, the target at a query being the value paired with that key), seeded splits that are
disjoint, the options' checks, the command line, and a small dot model that learns it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attention_atlas.data import IGNORE_INDEX, load_task, mqar_task, task_options
from attention_atlas.data.mqar import chance_levels, mqar_arrays
from attention_atlas.validate import ConfigError

torch.set_num_threads(1)

SMALL = {"seq_len": 32, "n_pairs": 6, "vocab_size": 40}


def _pairs_and_queries(x: torch.Tensor, y: torch.Tensor, n_pairs: int) -> tuple[dict, list]:
    """The key -> value map of the pairs region, and the (position, key, target) of every
    scored position."""
    row = x.tolist()
    pairs = dict(zip(row[0 : 2 * n_pairs : 2], row[1 : 2 * n_pairs : 2]))
    scored = [(p, row[p], int(y[p])) for p in range(len(row)) if int(y[p]) != IGNORE_INDEX]
    return pairs, scored


def test_every_query_is_answered_by_the_value_paired_with_its_key_earlier():
    t = mqar_task(200, 20, 20, **SMALL, seed=3)
    N, V, half = 6, 40, 20
    for split in ("train", "val", "test"):
        xs, ys = getattr(t, f"{split}_x"), getattr(t, f"{split}_y")
        assert xs.shape == ys.shape and xs.shape[1] == 32 and xs.dtype == ys.dtype == torch.int64
        for x, y in zip(xs, ys):
            pairs, scored = _pairs_and_queries(x, y, N)
            keys, values = list(pairs), list(pairs.values())
            assert len(keys) == N and len(set(values)) == N  # distinct keys, distinct values
            assert all(1 <= k < half for k in keys) and all(half <= v < V for v in values)
            assert torch.all(y[: 2 * N] == IGNORE_INDEX)  # the pairs region is not scored
            assert sorted(k for _, k, _ in scored) == sorted(keys)  # every key queried once
            for pos, key, target in scored:
                assert pos >= 2 * N and (pos - 2 * N) % 2 == 0  # query slots: even offsets
                assert target == pairs[key]


def test_the_worked_example_of_the_docstring_is_in_the_format():
    x = torch.tensor([3, 12, 5, 9, 5, 2, 3, 14])
    y = torch.tensor([IGNORE_INDEX] * 4 + [9, IGNORE_INDEX, 12, IGNORE_INDEX])
    pairs, scored = _pairs_and_queries(x, y, 2)
    assert pairs == {3: 12, 5: 9} and [t for _, _, t in scored] == [pairs[k] for _, k, _ in scored]


def test_the_same_seed_gives_the_same_splits_and_another_seed_others():
    a, b = mqar_task(64, 16, 16, **SMALL, seed=0), mqar_task(64, 16, 16, **SMALL, seed=0)
    c = mqar_task(64, 16, 16, **SMALL, seed=1)
    for s in ("train_x", "train_y", "val_x", "val_y", "test_x", "test_y"):
        assert torch.equal(getattr(a, s), getattr(b, s))
        assert not torch.equal(getattr(a, s), getattr(c, s))
    # a split depends on the seed and its own size only: more training rows leave val unchanged
    assert torch.equal(mqar_task(128, 16, 16, **SMALL, seed=0).val_x[:8], a.val_x[:8])


def test_splits_are_disjoint_even_where_repeats_are_likely():
    # 4 tokens, 1 pair, vocabulary 8: 3 keys x 4 values x 8 noise tokens = 96 sequences, so
    # independent draws of 60, 15 and 15 would share some
    kw = {"seq_len": 4, "n_pairs": 1, "vocab_size": 8, "seed": 0}
    t = mqar_task(60, 15, 15, **kw)
    rows = {s: {tuple(r) for r in getattr(t, f"{s}_x").tolist()} for s in ("train", "val", "test")}
    assert len(rows["train"]) < 60  # the training draw does repeat itself here
    assert not rows["train"] & rows["val"] and not rows["train"] & rows["test"]
    assert not rows["val"] & rows["test"]
    with pytest.raises(ConfigError, match="could not draw 15 val sequences distinct"):
        mqar_task(2000, 15, 15, **kw)  # the training draw holds all 96


def test_power_law_queries_come_early_and_uniform_ones_do_not():
    rng = np.random.default_rng(0)
    kw = {"seq_len": 64, "n_pairs": 4, "vocab_size": 64}
    first = {}
    for dist in ("power", "uniform"):
        _, y = mqar_arrays(2000, rng, **kw, query_dist=dist, power_a=0.01)
        pos = np.nonzero(y != IGNORE_INDEX)[1]
        first[dist] = float(np.mean(pos < 8 + 2 * 7))  # in the first 7 of 28 query slots
    # power: P(g) ~ (g+1)^-0.99 puts most mass on the first slots; uniform: about 7 of 28
    assert first["power"] > 0.45
    assert abs(first["uniform"] - 7 / 28) < 0.03


@pytest.mark.parametrize(
    "options, message",
    [
        ({"seq_len": 30, "n_pairs": 8}, r"seq_len >= 4 \* n_pairs = 32"),
        ({"seq_len": 33}, "seq_len must be even"),
        ({"vocab_size": 16, "n_pairs": 8}, "vocab_size >= 18"),
        ({"query_dist": "normal"}, "query_dist must be one of power, uniform"),
        ({"power_a": 0.0}, r"power_a must be in \(0, 1\]"),
        ({"n_pairs": 0}, "n_pairs must be an integer >= 1"),
        ({"n_train": True}, "n_train must be an integer >= 1"),
    ],
)
def test_settings_it_cannot_generate_are_one_line_errors(options, message):
    with pytest.raises(ConfigError, match=message):
        mqar_task(**{"n_train": 4, "n_val": 2, "n_test": 2, **options})


def test_chance_levels_are_a_uniform_value_and_a_value_of_the_context():
    assert chance_levels(8, 128) == {"uniform": 1 / 64, "context": 1 / 8}
    assert chance_levels(2, 7) == {"uniform": 1 / 4, "context": 1 / 2}  # values 3..6


def test_mqar_is_a_task_of_the_command_line_with_its_options():
    assert {"seq_len", "n_pairs", "vocab_size", "query_dist", "power_a", "seed"} <= set(
        task_options("mqar")
    )
    t = load_task("mqar", n_train=8, n_val=4, n_test=4, n_pairs=2, seq_len=16, vocab_size=16)
    assert t.train_x.shape == (8, 16) and t.test_x is not None and t.test_x.shape == (4, 16)
    with pytest.raises(ConfigError, match="does not take option 'pairs'"):
        load_task("mqar", pairs=2)


def test_train_on_mqar_from_the_command_line_reports_test_accuracy(tmp_path, capsys):
    from attention_atlas.__main__ import main

    args = ["train", "--task", "mqar", "--attention", "dot", "--out", str(tmp_path / "run"),
            "-o", "task.n_train=64", "-o", "task.n_val=16", "-o", "task.n_test=16",
            "-o", "task.seq_len=16", "-o", "task.n_pairs=2", "-o", "task.vocab_size=16",
            "-o", "steps=2", "-o", "batch_size=8", "-o", "dim=16", "-o", "n_heads=2",
            "-o", "eval_test=true", "-o", "progress=false"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "test_acc=" in out and "val_acc=" in out
    assert main([*args[:6], str(tmp_path / "bad"), "-o", "task.query_dist=zipf"]) == 2
    assert "query_dist must be one of power, uniform" in capsys.readouterr().err

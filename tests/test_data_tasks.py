"""Array tasks: digits as patch tokens, the copy and associative-recall tasks, subsets."""

from __future__ import annotations

import pytest
import torch

from attention_atlas.data import (
    IGNORE_INDEX,
    TextCorpus,
    Vocab,
    associative_recall_task,
    copy_task,
    load_digits_patches,
    subset,
)

torch.set_num_threads(1)  # tiny ops on a shared 2-core machine: threads only contend


@pytest.mark.parametrize("patch,n_tok", [(2, 16), (4, 4)])
def test_digits_become_standardised_patch_tokens_with_a_fixed_split(patch, n_tok):
    d = load_digits_patches(patch)
    assert d.train_x.shape[1:] == (n_tok, patch * patch) and d.patch_dim == patch * patch
    assert d.train_x.shape[0] + d.val_x.shape[0] == 1797
    flat = d.train_x.reshape(d.train_x.shape[0], -1)
    assert flat.mean(0).abs().max() < 1e-5
    assert torch.equal(load_digits_patches(patch).val_y, d.val_y)
    assert set(d.val_y.tolist()) == set(range(10))


def test_digit_patches_are_the_image_blocks_in_raster_order():
    whole = load_digits_patches(8).train_x[:, 0].reshape(-1, 8, 8)  # one 8x8 patch: the image
    p4 = load_digits_patches(4).train_x.reshape(-1, 4, 4, 4)  # (N, patch, 4, 4)
    for i, (r, c) in enumerate([(0, 0), (0, 4), (4, 0), (4, 4)]):
        assert torch.equal(p4[:, i], whole[:, r : r + 4, c : c + 4])


def test_copy_task_targets_repeat_the_first_half():
    t = copy_task(8, 4, length=5, vocab=3, seed=0)
    x, y = t.train_x, t.train_y
    assert x.shape == (8, 10) and t.vocab_size == 4
    assert torch.all(x[:, 5] == 3)  # SEP
    assert torch.all(y[:, :5] == IGNORE_INDEX)
    assert torch.equal(y[:, 5:], x[:, :5])


def test_associative_recall_target_is_the_value_of_the_queried_key():
    t = associative_recall_task(32, 8, n_pairs=3, n_keys=5, n_values=4, seed=1)
    for x, y in zip(t.train_x, t.train_y):
        keys, vals = x[0:6:2].tolist(), x[1:6:2].tolist()
        assert len(set(keys)) == 3
        assert int(y[-1]) == vals[keys.index(int(x[-1]))]
        assert torch.all(y[:-1] == IGNORE_INDEX)


def test_subsets_are_seeded_and_sized_by_fraction():
    t = copy_task(100, 10)
    s = subset(t, 0.25, seed=0)
    assert s.train_x.shape[0] == 25 and torch.equal(s.val_x, t.val_x)
    assert torch.equal(subset(t, 0.25, seed=0).train_x, s.train_x)
    assert not torch.equal(subset(t, 0.25, seed=1).train_x, s.train_x)
    corpus = TextCorpus("toy", torch.arange(1000), torch.arange(10), torch.arange(10), Vocab(["a"]))
    c = subset(corpus, 0.1, seed=2)
    assert c.train.numel() == 100 and torch.equal(
        c.train, torch.arange(int(c.train[0]), int(c.train[0]) + 100)
    )
    with pytest.raises(ValueError, match=r"fraction must be in \(0, 1\]"):
        subset(t, 0.0)

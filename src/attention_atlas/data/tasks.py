"""Fixed-array tasks (:class:`ArrayTask`): digits as patch tokens and small synthetic tasks
(copy, associative recall, multi-query associative recall in :mod:`.mqar`); low-data subsets;
every data set by task name."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attention_atlas.validate import ConfigError

from .corpora import TextCorpus

__all__ = [
    "IGNORE_INDEX",
    "ArrayTask",
    "associative_recall_task",
    "copy_task",
    "load_digits_patches",
    "subset",
]

#: target value that the loss ignores (positions that are not scored)
IGNORE_INDEX = -100


@dataclass
class ArrayTask:
    """Fixed arrays for training and validation.

    ``kind="classify"``: ``x (N, P, patch_dim)`` float, ``y (N,)`` class ids.
    ``kind="lm"``: ``x (N, L)`` token ids, ``y (N, L)`` next-token targets with
    :data:`IGNORE_INDEX` where a position is not scored. A task may also have a test split
    (``test_x``, ``test_y``; None if not).
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
    test_x: Tensor | None = None
    test_y: Tensor | None = None

    @property
    def seq_len(self) -> int:
        return int(self.train_x.shape[1])

    def __repr__(self) -> str:
        test = "" if self.test_x is None else f", test={tuple(self.test_x.shape)}"
        return (
            f"ArrayTask({self.name!r}, kind={self.kind!r}, train={tuple(self.train_x.shape)}, "
            f"val={tuple(self.val_x.shape)}{test})"
        )


def _check_counts(task: str, **values: tuple[Any, int]) -> None:
    """Each ``name=(value, least)``: an integer (not a bool) >= least, else :class:`ConfigError`."""
    for name, (value, least) in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigError(f"{task}: {name} must be an integer >= {least}, got {value!r}")


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

    if isinstance(patch, bool) or patch not in (1, 2, 4, 8):
        raise ConfigError(f"digits: patch must divide 8 (1, 2, 4 or 8), got {patch!r}")
    if not (isinstance(val_fraction, int | float) and 0 < val_fraction < 1):
        raise ConfigError(f"digits: val_fraction must be in (0, 1), got {val_fraction!r}")
    _check_counts("digits", seed=(seed, 0))
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
    _check_counts(
        "copy", n_train=(n_train, 1), n_val=(n_val, 1), length=(length, 1), vocab=(vocab, 1),
        seed=(seed, 0),
    )  # fmt: skip
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
    _check_counts(
        "recall", n_train=(n_train, 1), n_val=(n_val, 1), n_pairs=(n_pairs, 1),
        n_keys=(n_keys, 1), n_values=(n_values, 1), seed=(seed, 0),
    )  # fmt: skip
    if n_pairs > n_keys:
        raise ConfigError(
            f"recall: n_pairs={n_pairs} needs at least as many keys, got n_keys={n_keys}"
        )
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

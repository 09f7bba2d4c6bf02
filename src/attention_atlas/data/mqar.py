"""Multi-query associative recall (MQAR; Arora et al. 2023, "Zoology", Section 3 and Appendix).

A sequence of ``n_pairs`` key-value pairs is followed by a stretch in which every key comes back
once, at a random place, among noise tokens; at each query the model must emit the value that
was paired with that key. Softmax attention solves it by looking the key up; a model with a fixed
recurrent state must hold every pair in its state, so its accuracy falls as the pairs grow.

The format follows Zoology's generator (``zoology/data/associative_recall.py``,
``multiquery_ar``): with vocabulary ``V`` and ``h = V // 2``,

* keys are distinct ids from ``1 .. h-1``, values distinct ids from ``h .. V-1``;
* positions ``0 .. 2N-1`` hold ``k_1 v_1 k_2 v_2 .. k_N v_N`` (``N = n_pairs``);
* the query region is positions ``2N .. L-1`` (``L = seq_len``); query ``i`` (key ``k_i``) sits at
  ``2N + 2 g_i`` with distinct gaps ``g_i`` in ``0 .. (L-2N)/2 - 1``, drawn without replacement
  from the query distribution: ``"power"`` (``P(g) ~ (g+1)^(power_a - 1)``, Zoology's default,
  most queries soon after the pairs) or ``"uniform"``;
* every other query-region position is a noise token, uniform over the whole vocabulary;
* the target at query position ``2N + 2 g_i`` is ``v_i``; every other target is
  :data:`~attention_atlas.data.tasks.IGNORE_INDEX`, so loss and accuracy count the value
  positions only (``N`` per sequence).

Worked example (``V = 16``, ``N = 2``, ``L = 8``; keys ``1..7``, values ``8..15``)::

    position   0   1   2   3   4   5   6   7
    input      3  12   5   9   5   2   3  14     k1=3 v1=12, k2=5 v2=9; queries 5 (at 4), 3 (at 6)
    target     .   .   .   .   9   .  12   .     '.' = IGNORE_INDEX

Position 5 and 7 hold noise (2, 14). At position 4 the model reads key 5 and must say 9 (the
value paired with 5 at positions 2-3); at position 6 it reads 3 and must say 12.

Chance: guessing a value uniformly gets ``1 / (V - h)``; copying any value of the context gets
``1 / N`` (:func:`chance_levels`). The splits are independent draws from one seed
(``SeedSequence([seed, split])``), and a validation sequence equal to a training one, or a test
sequence equal to a training or validation one, is redrawn: the splits are disjoint.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from attention_atlas.validate import ConfigError

from .tasks import IGNORE_INDEX, ArrayTask

__all__ = ["QUERY_DISTRIBUTIONS", "chance_levels", "check_mqar", "mqar_arrays", "mqar_task"]

#: the query distributions: where the queries sit in the query region
QUERY_DISTRIBUTIONS = ("power", "uniform")
#: the splits and their index in the seed sequence
SPLITS = {"train": 0, "val": 1, "test": 2}


def _count(name: str, value: object, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < least:
        raise ConfigError(f"mqar: {name} must be an integer >= {least}, got {value!r}")
    return int(value)


def check_mqar(
    seq_len: int, n_pairs: int, vocab_size: int, query_dist: str, power_a: float
) -> None:
    """The relations MQAR needs (else :class:`ConfigError`, one line): room for every query
    (``4 n_pairs <= seq_len``, an even ``seq_len``), enough distinct keys and values
    (``n_pairs <= V//2 - 1`` and ``n_pairs <= V - V//2``), a known query distribution and
    ``0 < power_a <= 1``."""
    _count("seq_len", seq_len, 4)
    _count("n_pairs", n_pairs, 1)
    _count("vocab_size", vocab_size, 4)
    if seq_len % 2:
        raise ConfigError(
            f"mqar: seq_len must be even (queries sit at even offsets), got {seq_len}"
        )
    if 4 * n_pairs > seq_len:
        raise ConfigError(
            f"mqar: {n_pairs} pairs need seq_len >= 4 * n_pairs = {4 * n_pairs} (the pairs, then "
            f"a query region with room for every query), got seq_len={seq_len}"
        )
    half = vocab_size // 2
    if n_pairs > half - 1 or n_pairs > vocab_size - half:
        raise ConfigError(
            f"mqar: {n_pairs} distinct keys and values need vocab_size >= {2 * n_pairs + 2} "
            f"(keys 1..V//2-1, values V//2..V-1), got vocab_size={vocab_size}"
        )
    if query_dist not in QUERY_DISTRIBUTIONS:
        raise ConfigError(
            f"mqar: query_dist must be one of {', '.join(QUERY_DISTRIBUTIONS)}, got {query_dist!r}"
        )
    if isinstance(power_a, bool) or not isinstance(power_a, int | float) or not 0 < power_a <= 1:
        raise ConfigError(f"mqar: power_a must be in (0, 1], got {power_a!r}")


def chance_levels(n_pairs: int, vocab_size: int) -> dict[str, float]:
    """Accuracy without recall: ``uniform`` (a value guessed uniformly, ``1 / (V - V//2)``) and
    ``context`` (any value of the sequence's own pairs, ``1 / n_pairs``)."""
    return {"uniform": 1.0 / (vocab_size - vocab_size // 2), "context": 1.0 / n_pairs}


def _distinct(rng: np.random.Generator, n: int, low: int, high: int, k: int) -> np.ndarray:
    """``(n, k)``: ``k`` distinct integers from ``low .. high-1`` per row (uniform order)."""
    return low + np.argsort(rng.random((n, high - low)), axis=1)[:, :k]


def mqar_arrays(
    n: int,
    rng: np.random.Generator,
    *,
    seq_len: int,
    n_pairs: int,
    vocab_size: int,
    query_dist: str = "power",
    power_a: float = 0.01,
    noise: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` MQAR sequences drawn with ``rng``: inputs ``x (n, seq_len)`` and targets
    ``y (n, seq_len)`` (the value at each query position, ``IGNORE_INDEX`` elsewhere); int64.
    The format is in the module docstring."""
    check_mqar(seq_len, n_pairs, vocab_size, query_dist, power_a)
    N, half = n_pairs, vocab_size // 2
    keys = _distinct(rng, n, 1, half, N)  # (n, N)
    values = _distinct(rng, n, half, vocab_size, N)  # (n, N)
    space = (seq_len - 2 * N) // 2  # query slots: offsets 0, 2, .., 2(space-1)
    g = np.arange(1, space + 1, dtype=np.float64)
    logp = np.log(g) * (power_a - 1) if query_dist == "power" else np.zeros(space)
    # N distinct slots per row, sampled without replacement with P ~ p (Gumbel top-k)
    gumbel = -np.log(-np.log(rng.random((n, space))))
    gaps = np.argsort(-(logp + gumbel), axis=1)[:, :N]  # (n, N)
    if noise:  # noise everywhere, then the structure
        x = rng.integers(0, vocab_size, (n, seq_len))
    else:  # the filler token 0 (never a key or a value)
        x = np.zeros((n, seq_len), dtype=np.int64)
    x[:, 0 : 2 * N : 2] = keys
    x[:, 1 : 2 * N : 2] = values
    qpos = 2 * N + 2 * gaps  # (n, N)
    rows = np.arange(n)[:, None]
    x[rows, qpos] = keys
    y = np.full((n, seq_len), IGNORE_INDEX, dtype=np.int64)
    y[rows, qpos] = values
    return x.astype(np.int64), y


def _draw_split(
    n: int, seed: int, split: str, taken: set[bytes] | None, **kw: Any
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` sequences of ``split`` drawn from ``SeedSequence([seed, split index])``; with
    ``taken``, a sequence already in it is redrawn (until there are ``n``)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, SPLITS[split]]))
    if taken is None:
        return mqar_arrays(n, rng, **kw)
    xs, ys, have = [], [], 0
    for _ in range(100):
        x, y = mqar_arrays(n - have, rng, **kw)
        keep = [i for i, r in enumerate(x) if r.tobytes() not in taken]
        xs.append(x[keep])
        ys.append(y[keep])
        have += len(keep)
        if have == n:
            return np.concatenate(xs), np.concatenate(ys)
    raise ConfigError(
        f"mqar: could not draw {n} {split} sequences distinct from the other splits; the "
        "setting has too few distinct sequences (raise vocab_size or seq_len)"
    )


def mqar_task(
    n_train: int = 50_000,
    n_val: int = 1_000,
    n_test: int = 1_000,
    *,
    seq_len: int = 64,
    n_pairs: int = 8,
    vocab_size: int = 128,
    query_dist: str = "power",
    power_a: float = 0.01,
    seed: int = 0,
) -> ArrayTask:
    """MQAR as an :class:`~attention_atlas.data.tasks.ArrayTask` (``kind="lm"``) with train,
    validation and test splits (format in the module docstring).

    ``n_train`` defaults to 50,000 sequences, fixed arrays drawn once (well under a second and
    25 MB at length 64): the harness's resumable row sampler and checkpoints work unchanged, and
    a run of a few thousand steps sees each training sequence a few times at most, too few for a
    model of this size to memorise the bindings of 50,000 random sequences (the chapter reports
    the train-validation gap). The splits are disjoint (see the module docstring).
    """
    kw = {"seq_len": seq_len, "n_pairs": n_pairs, "vocab_size": vocab_size,
          "query_dist": query_dist, "power_a": power_a}  # fmt: skip
    check_mqar(seq_len, n_pairs, vocab_size, query_dist, power_a)
    sizes = {"train": _count("n_train", n_train, 1), "val": _count("n_val", n_val, 1),
             "test": _count("n_test", n_test, 1)}  # fmt: skip
    _count("seed", seed, 0)
    arrays = {"train": _draw_split(sizes["train"], seed, "train", None, **kw)}
    taken = {r.tobytes() for r in arrays["train"][0]}
    for split in ("val", "test"):  # none equal to a training (or validation) sequence
        arrays[split] = _draw_split(sizes[split], seed, split, taken, **kw)
        taken |= {r.tobytes() for r in arrays[split][0]}
    t = {s: (torch.from_numpy(x), torch.from_numpy(y)) for s, (x, y) in arrays.items()}
    return ArrayTask(
        f"mqar-{n_pairs}", "lm", *t["train"], *t["val"], vocab_size=vocab_size,
        test_x=t["test"][0], test_y=t["test"][1],
        info={**kw, "seed": seed, "chance": chance_levels(n_pairs, vocab_size)},
    )  # fmt: skip

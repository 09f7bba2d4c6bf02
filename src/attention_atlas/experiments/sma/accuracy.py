"""Chapter 7's numerical experiments: where the seed's generator product breaks, and how close
SSD's three methods and its float32 chunked form stay to float64 references.

* :func:`generator_overflow`: the seed's linear-time product through semiseparable generators
  (:func:`~attention_atlas.attention.sma.ssm_masked_attention_product`) against the log-space
  chunked :func:`~attention_atlas.attention.sma.ssd`, in float32 and float64, against the float64
  masked attention, over sequence lengths (the generators ``u_t = a_0 ... a_{t-1}``,
  ``v_t = 1 / u_t`` under- and overflow; segment sums in log space do not);
* :func:`method_agreement`: chunked and recurrent against quadratic, float64, any length;
* :func:`float32_error`, :func:`float32_accuracy` (the chapter's inputs) and
  :func:`accuracy_check` (the benchmark's, part ``"accuracy"`` of :mod:`.scaling`): float32
  chunked against float64 quadratic.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from attention_atlas.attention.sma import ssd, ssm_as_masked_attention, ssm_masked_attention_product

__all__ = [
    "accuracy_check",
    "first_failure",
    "float32_accuracy",
    "float32_error",
    "generator_overflow",
    "make_inputs",
    "method_agreement",
    "rel_err",
    "say",
]

F64 = torch.float64


Inputs = tuple[Tensor, Tensor, Tensor, Tensor]


def make_inputs(
    length: int,
    *,
    batch: int = 1,
    heads: int = 8,
    head_dim: int = 64,
    state: int = 64,
    decay: str = "mamba",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> Inputs:
    """Random ``x, log_a, B, C`` for :func:`ssd`.

    ``decay``: ``"mamba"`` (``log_a = -A dt`` with ``A ~ U(1, 16)`` per head and
    ``dt`` log-uniform in ``[1e-3, 1e-1]``, Mamba-2's initial range), ``"strong"``
    (``log_a ~ -U(0, 4)``) or ``"weak"`` (``log_a ~ -U(0, 1e-3)``: memory over the whole sequence).
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length, heads, head_dim, generator=g, dtype=torch.float64)
    B = torch.randn(batch, length, heads, state, generator=g, dtype=torch.float64) / state**0.5
    C = torch.randn(batch, length, heads, state, generator=g, dtype=torch.float64) / state**0.5
    u = torch.rand(batch, length, heads, generator=g, dtype=torch.float64)
    if decay == "mamba":
        A = 1.0 + 15.0 * torch.rand(heads, generator=g, dtype=torch.float64)
        log_a = -A * torch.exp(math.log(1e-3) + u * math.log(100.0))
    elif decay == "strong":
        log_a = -4.0 * u
    elif decay == "weak":
        log_a = -1e-3 * u
    else:
        raise ValueError(f"decay must be 'mamba', 'strong' or 'weak', got {decay!r}")
    return tuple(t.to(dtype) for t in (x, log_a, B, C))  # type: ignore[return-value]


def say(verbose: bool, text: str) -> None:
    """Print ``text`` to stderr when ``verbose`` (the benchmarks' progress lines)."""
    if verbose:
        print(text, file=sys.stderr)


def rel_err(a: Tensor, b: Tensor) -> float:
    """Max-abs error relative to the largest entry of the reference ``b``."""
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def _generator_rows(T: int, chunk_size: int) -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(T)
    a = torch.empty(T - 1, dtype=F64).uniform_(0.4, 0.6, generator=g)
    Bn, Cn = torch.randn(T, 4, generator=g, dtype=F64), torch.randn(T, 4, generator=g, dtype=F64)
    x = torch.randn(T, generator=g, dtype=F64)
    ref = ssm_as_masked_attention(a, Bn, Cn) @ x  # mask by products along segments: no division
    log_a = torch.cat([torch.zeros(1, dtype=F64), torch.log(a)])  # log a_t takes t-1 to t
    rows = []
    for dtype in (torch.float32, F64):
        y_gen = ssm_masked_attention_product(a.to(dtype), Bn.to(dtype), Cn.to(dtype), x.to(dtype))
        xs, la, Bs, Cs = (t.to(dtype)[None, :, None] for t in (x[:, None], log_a, Bn, Cn))
        y_ssd = ssd(xs, la, Bs, Cs, chunk_size=chunk_size)[0, :, 0, 0]  # batch 1, head 1
        for name, y in (("generators", y_gen), ("ssd chunked (log space)", y_ssd)):
            e = rel_err(y.double(), ref)
            rows.append({"T": T, "dtype": str(dtype).replace("torch.", ""), "method": name,
                         "rel_err": e if math.isfinite(e) else float("nan")})  # fmt: skip
    return rows


def generator_overflow(lengths: Sequence[int], chunk_size: int = 64) -> pd.DataFrame:
    """Relative error (:func:`rel_err`; NaN where the product is not finite) of the generator
    product and of chunked ``ssd`` against the float64 masked attention, decays ``a ~ U(0.4,
    0.6)``, inputs seeded by ``T``: columns ``T, dtype, method, rel_err``."""
    return pd.DataFrame([row for T in lengths for row in _generator_rows(T, chunk_size)])


def first_failure(df: pd.DataFrame, dtype: str, tol: float = 1e-3) -> int | None:
    """Smallest T where the generator product is NaN/inf or off by more than ``tol``."""
    sub = df[(df.method == "generators") & (df.dtype == dtype)]
    bad = sub[~(sub.rel_err < tol)]
    return int(bad["T"].min()) if len(bad) else None


def method_agreement(lengths: Sequence[int], chunk_size: int = 64) -> pd.DataFrame:
    """:func:`rel_err` of chunked and recurrent ``ssd`` against quadratic, float64, on
    ``x (2, L, 3, 8)``, ``log_a ~ -U(0, 1)``, ``B, C (2, L, 3, 5)`` seeded by L."""
    rows = []
    for L in lengths:
        g = torch.Generator().manual_seed(L)
        x = torch.randn(2, L, 3, 8, generator=g, dtype=F64)
        log_a = -torch.rand(2, L, 3, generator=g, dtype=F64)
        B, C = (torch.randn(2, L, 3, 5, generator=g, dtype=F64) / 5**0.5 for _ in range(2))
        yq = ssd(x, log_a, B, C, method="quadratic")
        yr = ssd(x, log_a, B, C, method="recurrent")
        yc = ssd(x, log_a, B, C, method="chunked", chunk_size=chunk_size)
        rows.append({"L": L, "chunked vs quadratic": rel_err(yc, yq),
                     "recurrent vs quadratic": rel_err(yr, yq)})  # fmt: skip
    return pd.DataFrame(rows)


def float32_error(inputs: Inputs, chunk_size: int = 64) -> dict[str, float]:
    """Float32 chunked :func:`ssd` against the float64 quadratic form (one head at a time) on the
    float64 ``inputs``: ``rel_fro = |y32 - y64|_F / |y64|_F`` and ``rel_max`` (max-abs error
    relative to ``max |y64|``)."""
    x, log_a, B, C = inputs
    with torch.no_grad():
        heads = [slice(i, i + 1) for i in range(x.shape[2])]
        ref = torch.cat(
            [ssd(x[:, :, h], log_a[:, :, h], B[:, :, h], C[:, :, h], "quadratic") for h in heads],
            dim=2,
        )
        y32 = ssd(x.float(), log_a.float(), B.float(), C.float(), chunk_size=chunk_size)
        err = y32.double() - ref
    return {"rel_fro": float(err.norm() / ref.norm()),
            "rel_max": float(err.abs().max() / ref.abs().max())}  # fmt: skip


def float32_accuracy(
    length: int,
    decays: Sequence[tuple[str, float]] = (("strong", 4.0), ("weak", 1e-3)),
    chunk_size: int = 64,
) -> pd.DataFrame:
    """:func:`float32_error` (``rel_fro``) on ``x (1, L, 2, 32)``, ``log_a ~ -U(0, scale)``,
    ``B, C (1, L, 2, 32)`` (seed 1) for each ``(name, scale)`` of ``decays``."""
    rows = []
    for decay, scale in decays:
        g = torch.Generator().manual_seed(1)
        x = torch.randn(1, length, 2, 32, generator=g, dtype=F64)
        log_a = -scale * torch.rand(1, length, 2, generator=g, dtype=F64)
        B, C = (torch.randn(1, length, 2, 32, generator=g, dtype=F64) / 32**0.5 for _ in range(2))
        rel = float32_error((x, log_a, B, C), chunk_size)["rel_fro"]
        rows.append({"decay": decay, "L": length, "|y32 - y64| / |y64|": rel})
    return pd.DataFrame(rows)


def accuracy_check(
    length: int, decays: Sequence[str] = ("strong", "weak", "mamba"), chunk_size: int = 64,
    verbose: bool = False, **shape: Any,
) -> list[dict[str, Any]]:  # fmt: skip
    """:func:`float32_error` on :func:`make_inputs` for each kind of decay."""
    rows = []
    for decay in decays:
        inputs = make_inputs(length, decay=decay, dtype=F64, **shape)
        rows.append({"decay": decay, "length": length, **float32_error(inputs, chunk_size),
                     "log_a_min": float(inputs[1].min()), "log_a_max": float(inputs[1].max())})  # fmt: skip
        say(verbose, f"[accuracy] {decay}: {rows[-1]['rel_fro']:.2e}")
    return rows

"""Chapter 7's checks of the seed's identities and cost claims, and the outcomes of its six
claims in the register (:data:`attention_atlas.claims.CLAIMS`, seed ``"sma"``).

Every check runs in float64 in well under a second: it computes the structured form with the
library (:mod:`attention_atlas.attention.sma`), compares it with an independent dense reference
(explicit matrices, a dense solve or inverse) and counts the work it does. The chapter runs the
same functions in the same order on one generator seeded 42 (the seed's ``Random.seed!(42)``),
so chapter and register show the same numbers and outcomes.

* :func:`check_low_rank_mask`: ``(B o U V^T) x = sum_i D(U_i) B D(V_i) x`` in exactly ``p``
  products with ``B`` (matrix-product FLOPs counted);
* :func:`check_ssm_semiseparable`: iteration = ``A^{-1} B x`` through the generators of the
  block-bidiagonal inverse, ``tril(U V^T)`` = the dense inverse, work linear in ``T``;
* :func:`check_ssm_is_sma` (claims ``ssm-is-sma`` and ``sum-of-sma``): ``C^T A^{-1} B`` =
  ``(C B^T) o a^{-1}`` by each of the seed's steps, and per-state dynamics = a sum of masked
  attentions;
* :func:`check_generators`: the product through ``u_t = a_1 ... a_{t-1}``, ``v_t = 1 / u_t``,
  exact at the seed's size and linear in ``T``; its float32 and float64 overflow is measured by
  :func:`.accuracy.generator_overflow` and reported beside the outcome;
* :func:`check_ssd_linear`: chunked = quadratic = recurrent SSD at every length, and the
  chunked method's FLOPs exactly double when ``L`` doubles (the quadratic form's quadruple).

"Linear" is decided on counted work, never on timings (a timing on a shared machine is noise):
matrix-product FLOPs (:func:`attention_atlas.bench.timing.count_flops`) where the algorithm is made of
products, else the elements written by every tensor operation (:func:`count_elements`; the
generator products are cumulative sums and scalings that a FLOP counter does not see).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from attention_atlas.attention.sma import (
    bidiagonal,
    bidiagonal_inverse_generators,
    low_rank_masked_product,
    per_state_ssm_matrices,
    scalar_ssm_matrices,
    ssm_as_masked_attention,
    ssm_as_sum_of_masked_attentions,
    ssm_block_matrices,
    ssm_masked_attention_product,
    ssm_recurrence,
    ssm_semiseparable,
)
from attention_atlas.bench.timing import count_flops
from attention_atlas.verdicts import Outcome, outcome_from_check

from .accuracy import first_failure, generator_overflow, method_agreement, rel_err
from .scaling import flop_growth

__all__ = [
    "COST_LENGTHS",
    "LINEAR_GROWTH",
    "SEED",
    "TOL",
    "Check",
    "check_generators",
    "check_low_rank_mask",
    "check_ssd_linear",
    "check_ssm_is_sma",
    "check_ssm_semiseparable",
    "count_elements",
    "outcomes",
    "work_growth",
]

F64 = torch.float64
#: the seed's Julia checks start from Random.seed!(42)
SEED = 42
#: a float64 identity holds when the structured form is within this of the dense reference
#: (relative to the reference's largest entry): rounding, about 1e-16 per operation
TOL = 1e-12
#: counted work growing by a factor in this range per doubling of T is linear (a quadratic
#: algorithm grows by 4; fixed set-up costs keep a linear one slightly off 2)
LINEAR_GROWTH = (1.9, 2.1)
#: sequence lengths on which the cost of the seed's linear-time products is counted
COST_LENGTHS = (64, 128, 256, 512)
#: chapter 7's lengths for the comparison of the SSD methods and their FLOP growth
SSD_LENGTHS = (1, 7, 63, 64, 65, 130, 333)
FLOP_LENGTHS = (256, 512, 1024, 2048)
GENERATOR_LENGTHS = (25, 50, 100, 125, 150, 200, 400, 800, 1200)
SMOKE = {"ssd_lengths": (1, 7, 65), "generator_lengths": (25, 150, 400)}


@dataclass
class Check:
    """One claim's check: ``errors`` (name -> relative error against the dense reference),
    ``outcome`` (:class:`~attention_atlas.verdicts.Outcome`) and ``data`` (what the chapter
    plots or prints: matrices, tables, counted growth)."""

    errors: dict[str, float]
    outcome: Outcome
    data: dict[str, Any] = field(default_factory=dict)


# -- counted work --------------------------------------------------------------------------------


class _ElementCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if not getattr(func, "is_view", False):  # a view writes nothing
            self.elements += sum(t.numel() for t in tree_flatten(out)[0] if isinstance(t, Tensor))
        return out


def count_elements(fn: Callable[..., Any], *args: Any) -> int:
    """Elements written by every tensor operation (views excluded) of one call ``fn(*args)``: a
    deterministic count of elementwise work (scans, scalings, copies) that matrix-product FLOPs
    miss."""
    with _ElementCounter() as counter:
        fn(*args)
    return counter.elements


def work_growth(
    make_args: Callable[[int], tuple[Any, ...]], fn: Callable[..., Any],
    lengths: Sequence[int] = COST_LENGTHS, *, counter: Callable[..., int] = count_elements,
) -> list[float]:  # fmt: skip
    """``counter(fn, *make_args(T))`` at each T, as growth factors from one T to the next."""
    work = [counter(fn, *make_args(T)) for T in lengths]
    return [b / a for a, b in zip(work, work[1:])]


def _linear(growth: Sequence[float]) -> bool:
    lo, hi = LINEAR_GROWTH
    return all(lo <= g <= hi for g in growth)


def _fmt(growth: Sequence[float]) -> str:
    return ", ".join(f"{g:.3f}" for g in growth)


# -- the seed's checks ---------------------------------------------------------------------------


def check_low_rank_mask(g: torch.Generator, T: int = 10, p: int = 2) -> Check:
    """Seed check 1: ``(B o U V^T) x = sum_i D(U_i) B D(V_i) x``, ``B (T, T)``, rank ``p``; the
    structured product runs exactly ``p`` matrix-vector products with ``B`` (``2 p T^2``
    FLOPs, counted)."""
    U, V = torch.randn(T, p, generator=g, dtype=F64), torch.randn(T, p, generator=g, dtype=F64)
    B = torch.rand(T, T, generator=g, dtype=F64)
    x = torch.randn(T, generator=g, dtype=F64)
    err = rel_err(low_rank_masked_product(B, U, V, x), (B * (U @ V.T)) @ x)
    flops, want = count_flops(low_rank_masked_product, B, U, V, x), 2 * p * T * T
    ok = err < TOL and flops == want
    outcome = outcome_from_check(
        ok,
        f"(B o UV^T) x = sum_i D(U_i) B D(V_i) x to {err:.1e} (float64, T = {T}, p = {p}), in "
        f"{flops} counted FLOPs = p products with B ({want})",
        f"relative error {err:.1e} (tolerance {TOL:.0e}), {flops} FLOPs against p products "
        f"with B = {want}",
    )
    return Check({"(B o UV^T) x": err}, outcome, {"flops": flops, "flops_p_products": want})


def check_ssm_semiseparable(g: torch.Generator, T: int = 10, n: int = 6) -> Check:
    """Seed check 2: scalar dynamics ``A_i = a_i I_n``, scalar inputs and outputs; hidden states
    and outputs by iteration = by the semiseparable inverse ``A^{-1} = tril(U V^T)``, which equals
    the dense inverse; the work of the generator form grows linearly in T."""
    A_blocks = torch.rand(T - 1, generator=g, dtype=F64)[:, None, None] * torch.eye(n, dtype=F64)
    B_blocks = torch.rand(T, n, 1, generator=g, dtype=F64)
    C_blocks = torch.rand(T, n, 1, generator=g, dtype=F64)
    x = torch.randn(T, 1, generator=g, dtype=F64)
    h_iter, y_iter = ssm_recurrence(A_blocks, B_blocks, C_blocks, x)
    h_semi, y_semi = ssm_semiseparable(A_blocks, B_blocks, C_blocks, x)
    A_big = ssm_block_matrices(A_blocks, B_blocks, C_blocks)[0]
    gens = bidiagonal_inverse_generators(A_blocks)
    errors = {
        "hidden states": rel_err(h_semi, h_iter),
        "outputs": rel_err(y_semi, y_iter),
        "tril(UV^T) = A^-1": rel_err(gens.dense(), torch.linalg.inv(A_big)),
    }
    growth = work_growth(_block_ssm_inputs(n), ssm_semiseparable)
    ok = max(errors.values()) < TOL and _linear(growth)
    outcome = outcome_from_check(
        ok,
        f"iteration = A^-1 B x by the semiseparable generators to {max(errors.values()):.1e} "
        f"(float64, T = {T}, n = {n}); counted work grows {_fmt(growth)}x per doubling of T "
        f"(from {COST_LENGTHS[0]} to {COST_LENGTHS[-1]}): linear",
        f"largest error {max(errors.values()):.1e} (tolerance {TOL:.0e}); work growth "
        f"{_fmt(growth)} per doubling of T (linear: {LINEAR_GROWTH})",
    )
    data = {"A": A_big, "A_inv": torch.linalg.inv(A_big), "UV": gens.U @ gens.V.T,
            "growth": growth}  # fmt: skip
    return Check(errors, outcome, data)


def _block_ssm_inputs(n: int) -> Callable[[int], tuple[Tensor, ...]]:
    def make(T: int) -> tuple[Tensor, ...]:
        g = torch.Generator().manual_seed(T)
        a = torch.empty(T - 1, dtype=F64).uniform_(0.9, 1.0, generator=g)  # no under/overflow
        A = a[:, None, None] * torch.eye(n, dtype=F64)
        B, C = (torch.rand(T, n, 1, generator=g, dtype=F64) for _ in range(2))
        return A, B, C, torch.randn(T, 1, generator=g, dtype=F64)

    return make


def check_ssm_is_sma(g: torch.Generator, T: int = 10, n: int = 6) -> tuple[Check, Check]:
    """Seed check 3 (``C^T A^{-1} B`` for ``A = I_n (x) a``: each of the seed's equalities, then
    the mask by products, no inverse) and its per-state extension (a sum of masked attentions).
    Returns ``(ssm-is-sma, sum-of-sma)``; the first's ``data`` holds ``Bn, Cn``."""
    a = torch.rand(T - 1, generator=g, dtype=F64)
    Bn, Cn = torch.rand(T, n, generator=g, dtype=F64), torch.rand(T, n, generator=g, dtype=F64)
    A_k, B_k, C_k = scalar_ssm_matrices(a, Bn, Cn)
    kron = float(torch.equal(A_k, torch.kron(torch.eye(n, dtype=F64), bidiagonal(a))))
    M = C_k.T @ torch.linalg.solve(A_k, B_k)
    ai = torch.linalg.inv(bidiagonal(a))
    d = torch.diag
    errors = {
        "sum_k D(c_k) a^-1 D(b_k)": rel_err(
            sum(d(Cn[:, k]) @ ai @ d(Bn[:, k]) for k in range(n)),
            M,  # type: ignore[arg-type]
        ),
        "sum_k (c_k b_k^T) o a^-1": rel_err(
            sum(torch.outer(Cn[:, k], Bn[:, k]) * ai for k in range(n)),
            M,  # type: ignore[arg-type]
        ),
        "(C B^T) o a^-1": rel_err((Cn @ Bn.T) * ai, M),
        "ssm_as_masked_attention (mask by products, no inverse)": rel_err(
            ssm_as_masked_attention(a, Bn, Cn), M
        ),
    }
    worst = max(errors.values())
    sma = outcome_from_check(
        worst < TOL and kron == 1.0,
        f"A = I_n (x) a exactly, and C^T A^-1 B = (C B^T) o a^-1 by each of the seed's steps to "
        f"{worst:.1e} (float64, T = {T}, n = {n})",
        f"A = I_n (x) a: {bool(kron)}; largest error {worst:.1e} (tolerance {TOL:.0e})",
    )
    a_k = torch.rand(n, T - 1, generator=g, dtype=F64)
    A_p, B_p, C_p = per_state_ssm_matrices(a_k, Bn, Cn)
    err = rel_err(
        ssm_as_sum_of_masked_attentions(a_k, Bn, Cn), C_p.T @ torch.linalg.solve(A_p, B_p)
    )
    per_state = outcome_from_check(
        err < TOL,
        f"with dynamics a^(k) per state, C^T A^-1 B = sum_k (c_k b_k^T) o (a^(k))^-1 to {err:.1e} "
        f"(float64, T = {T}, n = {n} masks)",
        f"relative error {err:.1e} (tolerance {TOL:.0e})",
    )
    return (
        Check(errors, sma, {"Bn": Bn, "Cn": Cn}),
        Check({"per-state dynamics: sum of masked attentions": err}, per_state),
    )


def check_generators(
    g: torch.Generator, Bn: Tensor, Cn: Tensor,
    overflow_lengths: Sequence[int] = GENERATOR_LENGTHS, chunk_size: int = 64,
) -> Check:  # fmt: skip
    """Seed check 4: ``M x = sum_k c_k o (a^{-1} (b_k o x))`` with ``a^{-1} = tril(u v^T)``,
    ``u_t = a_1 ... a_{t-1}``, ``v_t = 1 / u_t`` (``Bn, Cn (T, n)`` from :func:`check_ssm_is_sma`),
    against the dense solve; its work counted over T; and where it breaks in floating point
    (:func:`.accuracy.generator_overflow`, ``a ~ U(0.4, 0.6)``).

    The outcome is about what the seed claims: an exact identity (each ``a_t != 0``) applied in
    linear time. Floating-point overflow is not part of that claim; the summary reports it."""
    T, n = Bn.shape
    a = torch.rand(T - 1, generator=g, dtype=F64)
    x = torch.randn(T, generator=g, dtype=F64)
    A, B, C = scalar_ssm_matrices(a, Bn, Cn)
    err = rel_err(ssm_masked_attention_product(a, Bn, Cn, x), C.T @ torch.linalg.solve(A, B @ x))
    growth = work_growth(_scalar_ssm_inputs(n), ssm_masked_attention_product)
    table = generator_overflow(overflow_lengths, chunk_size)
    bad32, bad64 = first_failure(table, "float32"), first_failure(table, "float64")
    ssd_worst = float(table[table.method != "generators"].rel_err.max())
    where = (
        f"in floating point the generators overflow (decays a ~ U(0.4, 0.6), lengths up to "
        f"{max(overflow_lengths)}): the product fails in float32 from {_at(bad32)} and in "
        f"float64 from {_at(bad64)}, while log-space SSD stays within {ssd_worst:.1e}"
    )
    outcome = outcome_from_check(
        err < TOL and _linear(growth),
        f"exact (to {err:.1e} in float64 at T = {T}) and linear (work grows {_fmt(growth)}x per "
        f"doubling of T): the seed's claim, linear time in exact arithmetic, holds; {where}",
        f"relative error {err:.1e} (tolerance {TOL:.0e}); work growth {_fmt(growth)} per "
        f"doubling of T (linear: {LINEAR_GROWTH}); {where}",
    )
    data = {"growth": growth, "overflow": table, "ssd_worst": ssd_worst,
            "first_failure": {"float32": bad32, "float64": bad64}}  # fmt: skip
    return Check({"C^T A^-1 B x by the generators": err}, outcome, data)


def _at(T: int | None) -> str:
    return "no length tried (it holds at all of them)" if T is None else f"T = {T}"


def _scalar_ssm_inputs(n: int) -> Callable[[int], tuple[Tensor, ...]]:
    def make(T: int) -> tuple[Tensor, ...]:
        g = torch.Generator().manual_seed(T)
        a = torch.empty(T - 1, dtype=F64).uniform_(0.9, 1.0, generator=g)
        Bn, Cn = (torch.rand(T, n, generator=g, dtype=F64) for _ in range(2))
        return a, Bn, Cn, torch.randn(T, generator=g, dtype=F64)

    return make


def check_ssd_linear(
    lengths: Sequence[int] = SSD_LENGTHS, flop_lengths: Sequence[int] = FLOP_LENGTHS,
    chunk_size: int = 64,
) -> Check:  # fmt: skip
    """SSD's chunked method equals the quadratic form and the recurrence in float64 at every
    length (:func:`.accuracy.method_agreement`), and its matrix-product FLOPs double
    exactly when L doubles (:func:`.scaling.flop_growth`; the quadratic form's quadruple)."""
    agreement = method_agreement(lengths, chunk_size)
    worst = float(agreement.drop(columns="L").max().max())
    flops = flop_growth(flop_lengths, heads=2, head_dim=8, state=4, chunk_size=chunk_size)
    chunked, quadratic = flops["growth"]["chunked"], flops["growth"]["quadratic"]
    exact = all(gr == 2.0 for gr in chunked) and all(gr == 4.0 for gr in quadratic)
    outcome = outcome_from_check(
        worst < TOL and exact,
        f"chunked = quadratic = recurrent to {worst:.1e} (float64, L = "
        f"{', '.join(map(str, lengths))}); chunked FLOPs grow {_fmt(chunked)}x per doubling of L "
        f"(quadratic: {_fmt(quadratic)}x): linear",
        f"largest disagreement {worst:.1e} (tolerance {TOL:.0e}); chunked FLOP growth "
        f"{_fmt(chunked)}, quadratic {_fmt(quadratic)} per doubling of L",
    )
    return Check({"chunked/recurrent vs quadratic": worst}, outcome,
                 {"agreement": agreement, "flops": flops})  # fmt: skip


# -- the register ----------------------------------------------------------------------------------


def outcomes(smoke: bool = False) -> dict[str, Outcome]:
    """The six SMA claims' outcomes, by the checks above in the chapter's order and sizes
    (``smoke``: fewer lengths for the SSD and overflow sweeps)."""
    g = torch.Generator().manual_seed(SEED)
    low_rank = check_low_rank_mask(g)
    semiseparable = check_ssm_semiseparable(g)
    sma, per_state = check_ssm_is_sma(g)
    overflow = SMOKE["generator_lengths"] if smoke else GENERATOR_LENGTHS
    generators = check_generators(g, sma.data["Bn"], sma.data["Cn"], overflow)
    ssd = check_ssd_linear(SMOKE["ssd_lengths"] if smoke else SSD_LENGTHS)
    return {
        "sma/low-rank-mask": low_rank.outcome,
        "sma/ssm-semiseparable": semiseparable.outcome,
        "sma/ssm-is-sma": sma.outcome,
        "sma/sum-of-sma": per_state.outcome,
        "sma/generators": generators.outcome,
        "sma/ssd-linear": ssd.outcome,
    }

"""The :class:`~attention_atlas.attention.base.Attention` contract, checked on any registered
variant: what a layer must do before anything trained with it means something.

:func:`check_contract` builds the variant by name (``build_attention(name, dim=..., n_heads=...,
**options)``) and runs the checks of :data:`CHECKS`, in that order, each named stably (reports
and JSON summaries key on these names):

==================  ===========================================================================
``builds``          the constructor accepts ``dim``, ``n_heads`` and the options
``shape``           ``out (B, L, D)`` for several ``(B, L)``, causal and not; with
                    ``need_weights=True``, ``probs (B, H, L, L)`` (``None`` is allowed and said;
                    whether its rows sum to 1 is said, not required: an SSM's mixing matrix is
                    not a distribution)
``dtype``           float32 in, float32 out; a float64 module on float64 input, float64 out
``device``          the output on the input's device (CUDA too, when this machine has it)
``finite``          finite output (and weights) on Gaussian input
``causal``          with ``causal=True`` no output depends on a later token: each token ``j``
                    perturbed in turn, float64, every position ``< j`` compared with the
                    unperturbed run (an explicit reference, independent of the variant's mask)
``gradcheck``       :func:`torch.autograd.gradcheck` in float64 at toy size, w.r.t. ``x``,
                    through the module with ``causal=True``
``length-1``        ``L = 1`` works, is finite, and its causal output equals the first position
                    of a longer sequence
``permutation``     informational: without a mask, is the layer permutation-equivariant?
                    (a layer with positions is not, and may not be)
``non-finite input``  informational: a NaN in one token; which outputs turn non-finite, and do
                    causal outputs before it stay finite?
==================  ===========================================================================

A check's ``passed`` is True or False, or None for a check that gives no verdict: the two
informational ones, and a check not run because one it needs failed (``shape`` needs
``builds``; every other check needs ``shape``; ``causal``, ``gradcheck``, ``length-1`` and the
informational ones need ``finite``, since comparisons of non-finite outputs say nothing). The
failed check is then the one to read, and it is in :data:`FATAL`.

Nothing the variant does makes :func:`check_contract` raise: an exception inside a check becomes
that check's failure, its detail ``"<Type>: <message>"`` on one line. Only bad arguments of
:func:`check_contract` itself raise (:class:`~attention_atlas.validate.ConfigError`).

A variant that refuses ``causal=False`` (an SSM runs forward in time) is causal-only: the
checks use ``causal=True`` where the contract needs one, and say so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd
import torch
from torch import Tensor
from torch.autograd.gradcheck import GradcheckError

from attention_atlas.attention import Attention, AttentionResult, build_attention
from attention_atlas.validate import ConfigError, check_count, check_device, one_line

__all__ = [
    "CHECKS",
    "FATAL",
    "INFORMATIONAL",
    "Check",
    "check_contract",
    "contract_table",
    "failed",
    "gaussian_input",
    "build_seeded",
    "call_layer",
]

#: every check, in the order :func:`check_contract` runs and reports them
CHECKS: tuple[str, ...] = (
    "builds", "shape", "dtype", "device", "finite", "causal", "gradcheck", "length-1",
    "permutation", "non-finite input",
)  # fmt: skip
#: checks that give no verdict (``passed`` is always None): they describe the layer
INFORMATIONAL = frozenset({"permutation", "non-finite input"})
#: checks whose failure makes a training result meaningless: a layer that cannot be built,
#: returns the wrong shape, returns non-finite values on ordinary input, lets a position see a
#: later token (a language model trained with it cheats) or has wrong gradients (training follows
#: them). ``dtype``, ``device`` and ``length-1`` failures limit where a variant can run, not what
#: its results mean.
FATAL = frozenset({"builds", "shape", "finite", "causal", "gradcheck"})
#: a check runs only when these passed (see the module docstring)
NEEDS: dict[str, tuple[str, ...]] = {
    "shape": ("builds",),
    "dtype": ("shape",),
    "device": ("shape",),
    "finite": ("shape",),
    "causal": ("shape", "finite"),
    "gradcheck": ("shape", "finite"),
    "length-1": ("shape", "finite"),
    "permutation": ("shape", "finite"),
    "non-finite input": ("shape", "finite"),
}
#: the largest relative change of an earlier output that still counts as no dependence (float64)
CAUSAL_RTOL = 1e-12
#: relative tolerance of comparisons that should agree to float64 round-off (length 1, permutation)
MATCH_RTOL = 1e-10
#: how far a row of the weights may sum from 1 (float32) and still be called a distribution
ROW_SUM_TOL = 1e-4
F64 = torch.float64


@dataclass
class Check:
    """One check of the contract.

    Attributes:
        name: one of :data:`CHECKS`.
        passed: True or False; None for an informational check or one not run.
        detail: one line: what was measured, or why it failed.
    """

    name: str
    passed: bool | None
    detail: str


class ContractError(AssertionError):
    """A check's finding (its message is the check's detail)."""


def build_seeded(
    name: str,
    options: dict[str, Any] | None,
    *,
    dim: int,
    n_heads: int,
    seed: int,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> Attention:
    """``build_attention(name, dim=dim, n_heads=n_heads, **options)`` initialised from
    ``torch.manual_seed(seed)`` (the global RNG state is restored after), in eval mode, moved to
    ``dtype`` and ``device``: the same seed gives the same weights in every dtype."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = build_attention(name, dim=dim, n_heads=n_heads, **(options or {}))
    return module.to(device=device, dtype=dtype).eval()


def gaussian_input(
    batch: int,
    length: int,
    dim: int,
    *,
    seed: int,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> Tensor:
    """Standard normal ``x (batch, length, dim)`` from ``torch.Generator().manual_seed(seed)``
    (drawn on the CPU in float64, then cast: the same draw in every dtype and on every device)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, length, dim, generator=g, dtype=F64).to(device=device, dtype=dtype)


def call_layer(module: Attention, x: Tensor, **kwargs: Any) -> AttentionResult:
    """``module(x, **kwargs)``, checked to be an :class:`AttentionResult` whose ``out`` is a
    tensor (else :class:`ContractError` naming what came back)."""
    res = module(x, **kwargs)
    if not isinstance(res, AttentionResult):
        raise ContractError(f"forward returned {type(res).__name__}, expected AttentionResult")
    if not isinstance(res.out, Tensor):
        raise ContractError(f"result.out is {type(res.out).__name__}, expected a Tensor")
    return res


def failed(checks: list[Check], *, fatal: bool = False) -> list[str]:
    """Names of the checks that failed (only those in :data:`FATAL` with ``fatal``)."""
    return [c.name for c in checks if c.passed is False and (c.name in FATAL or not fatal)]


def contract_table(checks: list[Check]) -> pd.DataFrame:
    """One row per check: ``check, passed, fatal, detail`` (``passed`` True, False or None;
    ``fatal``: the check is in :data:`FATAL`)."""
    rows = [{**asdict(c), "fatal": c.name in FATAL} for c in checks]
    frame = pd.DataFrame(rows, columns=["name", "passed", "fatal", "detail"])
    return frame.rename(columns={"name": "check"})


# -- the checks ------------------------------------------------------------------------------


class _Subject:
    """The variant under test: how to build it and draw its inputs."""

    def __init__(
        self, name: str, options: dict[str, Any], dim: int, n_heads: int, seed: int, device: str
    ) -> None:
        self.name, self.options, self.dim, self.n_heads = name, options, dim, n_heads
        self.seed, self.device = seed, device
        self.causal_only = ""  # why causal=False is refused, when it is

    def build(self, dtype: torch.dtype = torch.float32, device: str | None = None) -> Attention:
        return build_seeded(self.name, self.options, dim=self.dim, n_heads=self.n_heads,
                            seed=self.seed, dtype=dtype, device=device or self.device)  # fmt: skip

    def x(self, batch: int, length: int, dtype: torch.dtype = torch.float32, offset: int = 0,
          device: str | None = None) -> Tensor:  # fmt: skip
        return gaussian_input(batch, length, self.dim, seed=self.seed + 1 + offset, dtype=dtype,
                              device=device or self.device)  # fmt: skip

    def expect_out(self, res: AttentionResult, x: Tensor, what: str) -> Tensor:
        want = tuple(x.shape)
        if tuple(res.out.shape) != want:
            raise ContractError(f"{what}: out has shape {tuple(res.out.shape)}, expected {want}")
        return res.out


def _builds(s: _Subject) -> str:
    m = s.build()
    n = sum(p.numel() for p in m.parameters())
    opts = "".join(f", {k}={v!r}" for k, v in s.options.items())
    return f"{type(m).__name__}(dim={s.dim}, n_heads={s.n_heads}{opts}): {n} parameters"


def _shape(s: _Subject) -> str:
    m, H = s.build(), s.n_heads
    notes: list[str] = []
    sums: list[float] = []
    for b, length in ((1, 1), (2, 5), (3, 7)):
        x = s.x(b, length)
        for causal in (True, False):
            what = f"B={b}, L={length}, causal={causal}"
            try:
                res = call_layer(m, x, causal=causal, need_weights=True)
            except ValueError as e:
                if causal or "causal" not in str(e):
                    raise
                s.causal_only = one_line(f"{type(e).__name__}: {e}", 200)
                continue
            s.expect_out(res, x, what)
            s.expect_out(call_layer(m, x, causal=causal), x, what + ", need_weights=False")
            if res.probs is None:
                continue
            want = (b, H, length, length)
            if not isinstance(res.probs, Tensor) or tuple(res.probs.shape) != want:
                got = tuple(res.probs.shape) if isinstance(res.probs, Tensor) else res.probs
                raise ContractError(f"{what}: probs has shape {got}, expected {want}")
            sums.append(float((res.probs.detach().double().sum(-1) - 1).abs().max()))
    notes.append(f"out (B, L, {s.dim}) for (B, L) in (1, 1), (2, 5), (3, 7)")
    if not sums:
        notes.append("probs is None with need_weights=True (allowed: weights not exposed)")
    elif max(sums) <= ROW_SUM_TOL:
        notes.append(f"probs (B, {H}, L, L), rows sum to 1 within {max(sums):.1e}")
    else:
        notes.append(f"probs (B, {H}, L, L) whose rows are not distributions (a row sum is off 1 "
                     f"by {max(sums):.2g}): weights, not probabilities")  # fmt: skip
    if s.causal_only:
        notes.append(f"causal-only: causal=False refused ({s.causal_only})")
    return "; ".join(notes)


def _dtype(s: _Subject) -> str:
    for dtype in (torch.float32, F64):
        out = call_layer(s.build(dtype), s.x(2, 5, dtype), causal=True).out
        if out.dtype != dtype:
            raise ContractError(f"{dtype} in gave {out.dtype} out, expected {dtype}")
    return "float32 in, float32 out; float64 module and input, float64 out"


def _device(s: _Subject) -> str:
    notes = []
    devices = [s.device] + (["cuda"] if torch.cuda.is_available() and s.device == "cpu" else [])
    for dev in devices:
        x = s.x(2, 5, device=dev)
        res = call_layer(s.build(device=dev), x, causal=True, need_weights=True)
        for what, t in (("out", res.out), ("probs", res.probs)):
            if isinstance(t, Tensor) and t.device != x.device:
                raise ContractError(f"input on {x.device} gave {what} on {t.device}")
        notes.append(f"{x.device}: out on {x.device}")
    if not torch.cuda.is_available():
        notes.append("cuda not available here")
    return "; ".join(notes)


def _finite(s: _Subject) -> str:
    m, x = s.build(), s.x(2, 8)
    for causal in (True, False) if not s.causal_only else (True,):
        res = call_layer(m, x, causal=causal, need_weights=True)
        for what, t in (("output", res.out), ("weights", res.probs)):
            if isinstance(t, Tensor) and not bool(torch.isfinite(t).all()):
                bad = int((~torch.isfinite(t)).sum())
                raise ContractError(f"non-finite {what} on Gaussian input (causal={causal}): "
                                    f"{bad} of {t.numel()} entries")  # fmt: skip
    return "finite output and weights on Gaussian input (2, 8, D)" + (
        ", causal only" if s.causal_only else ", causal and not"
    )


def _f64_or_f32(s: _Subject) -> tuple[Attention, torch.dtype, str]:
    """The module in float64 when it runs there, else float32 (and a note saying so)."""
    try:
        m = s.build(F64)
        call_layer(m, s.x(1, 2, F64), causal=True)
        return m, F64, ""
    except Exception as e:
        return s.build(), torch.float32, f" (in float32: float64 fails, {type(e).__name__})"


def _causal(s: _Subject) -> str:
    m, dtype, note = _f64_or_f32(s)
    rtol = CAUSAL_RTOL if dtype == F64 else 1e-6
    L = 8
    x = s.x(2, L, dtype)
    base = s.expect_out(call_layer(m, x, causal=True), x, "causal=True").detach()
    scale = float(base.abs().max()) or 1.0
    bump = s.x(2, L, dtype, offset=1)
    worst, first = 0.0, None  # largest relative leak; (position, token) of the earliest leak
    for j in range(1, L):
        xj = x.clone()
        xj[:, j] += bump[:, j]  # token j changed, tokens < j as they were
        out = call_layer(m, xj, causal=True).out.detach()
        if not bool(torch.isfinite(out).all()):
            raise ContractError(f"non-finite output after perturbing token {j}")
        leak = (out[:, :j] - base[:, :j]).abs().amax(dim=(0, 2)) / scale  # (j,) per position
        worst = max(worst, float(leak.max()))
        bad = torch.nonzero(leak > rtol).flatten().tolist()
        if bad and (first is None or bad[0] < first[0]):
            first = (bad[0], j)
    if first is not None:
        raise ContractError(
            f"position {first[0]} depends on token {first[1]} (a later token): largest relative "
            f"change of an earlier output {worst:.2g} > {rtol:g}{note}"
        )
    return f"no earlier output moved when any of {L - 1} tokens was perturbed: largest relative " \
           f"change {worst:.1e} <= {rtol:g}{note}"  # fmt: skip


def _gradcheck(s: _Subject) -> str:
    m = s.build(F64)
    x = s.x(1, 4, F64).requires_grad_()
    try:
        torch.autograd.gradcheck(lambda t: call_layer(m, t, causal=True).out, (x,),
                                 eps=1e-6, atol=1e-5, rtol=1e-3)  # fmt: skip
    except GradcheckError as e:  # its message goes on to print Jacobians
        raise ContractError(f"gradients disagree with finite differences: "
                            f"{str(e).splitlines()[0].rstrip(',')}") from None  # fmt: skip
    return f"float64 gradcheck of out w.r.t. x (1, 4, {s.dim}), causal=True"


def _length_1(s: _Subject) -> str:
    m, dtype, note = _f64_or_f32(s)
    rtol = MATCH_RTOL if dtype == F64 else 1e-5
    x = s.x(2, 6, dtype)
    alone = {}
    for causal in (True, False) if not s.causal_only else (True,):
        what = f"L=1, causal={causal}"
        alone[causal] = s.expect_out(call_layer(m, x[:, :1], causal=causal), x[:, :1], what)
        if not bool(torch.isfinite(alone[causal]).all()):
            raise ContractError(f"non-finite output at L=1 (causal={causal})")
    first = s.expect_out(call_layer(m, x, causal=True), x, "L=6, causal=True")[:, :1]
    gap = float((alone[True] - first).abs().max() / (first.abs().max() or 1.0))
    if not gap <= rtol:
        raise ContractError(f"causal output of token 0 alone differs from position 0 of a length-6 "
                            f"sequence by {gap:.2g} (relative) > {rtol:g}{note}")  # fmt: skip
    return f"L=1 runs and is finite; causal output of token 0 alone equals position 0 of a " \
           f"length-6 sequence within {gap:.1e}{note}"  # fmt: skip


def _permutation(s: _Subject) -> str:
    if s.causal_only:
        return f"not applicable: causal-only ({s.causal_only})"
    m, dtype, note = _f64_or_f32(s)
    L = 8
    x = s.x(2, L, dtype)
    perm = torch.roll(torch.arange(L), 3)  # moves every token
    out = call_layer(m, x, causal=False).out.detach()
    permuted = call_layer(m, x[:, perm], causal=False).out.detach()
    dev = float((permuted - out[:, perm]).abs().max() / (out.abs().max() or 1.0))
    tol = MATCH_RTOL if dtype == F64 else 1e-5
    if dev <= tol:
        return f"permutation-equivariant without a mask (max relative deviation {dev:.1e}){note}"
    return (f"not permutation-equivariant without a mask (max relative deviation {dev:.2g}): the "
            f"layer depends on positions{note}")  # fmt: skip


def _nonfinite_input(s: _Subject) -> str:
    m, L, j = s.build(), 8, 4
    x = s.x(2, L)
    x[:, j, 0] = float("nan")
    parts = [f"NaN in token {j} of {L}"]
    if not s.causal_only:
        bad = ~torch.isfinite(call_layer(m, x, causal=False).out).all(-1).all(0)  # (L,)
        parts.append(f"without a mask {int(bad.sum())} of {L} positions turn non-finite")
    bad = ~torch.isfinite(call_layer(m, x, causal=True).out).all(-1).all(0)
    early = int(bad[:j].sum())
    parts.append(
        f"causal: positions 0-{j - 1} stay finite, {int(bad[j:].sum())} of {L - j} from {j} on "
        "turn non-finite" if not early else
        f"causal: {early} of {j} earlier positions turn non-finite (first: position "
        f"{int(torch.nonzero(bad).flatten()[0])}): a NaN leaks backwards"
    )  # fmt: skip
    return "; ".join(parts)


RUN: dict[str, Callable[[_Subject], str]] = {
    "builds": _builds, "shape": _shape, "dtype": _dtype, "device": _device, "finite": _finite,
    "causal": _causal, "gradcheck": _gradcheck, "length-1": _length_1,
    "permutation": _permutation, "non-finite input": _nonfinite_input,
}  # fmt: skip


@contextmanager
def _quiet() -> Iterator[None]:
    """No warnings from the variant while it is checked (they are not the check's findings)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def check_contract(
    name: str,
    options: dict[str, Any] | None = None,
    *,
    dim: int = 16,
    n_heads: int = 2,
    seed: int = 0,
    device: str = "cpu",
) -> list[Check]:
    """Every check of :data:`CHECKS` on variant ``name`` built with ``dim``, ``n_heads`` and
    ``options`` (see the module docstring), in order.

    Modules are built from ``torch.manual_seed(seed)`` (the global RNG state is restored) and
    inputs drawn from seeded generators, so a rerun gives the same details. Never raises
    because of the variant; raises :class:`~attention_atlas.validate.ConfigError` (one line) for
    a non-positive ``dim`` or ``n_heads``, options that are not a dict, or an unknown device.
    """
    check_count("check_contract dim", dim)
    check_count("check_contract n_heads", n_heads)
    if options is not None and not isinstance(options, dict):
        raise ConfigError(f"check_contract options: expected a dict, got {type(options).__name__}")
    check_device(device, "check_contract device")
    subject = _Subject(name, dict(options or {}), dim, n_heads, seed, device)
    results: dict[str, Check] = {}
    with _quiet():
        for check in CHECKS:
            missing = [n for n in NEEDS.get(check, ()) if results[n].passed is not True]
            if missing:
                results[check] = Check(check, None, f"not run: needs {missing[0]!r} to pass")
                continue
            try:
                detail = RUN[check](subject)
                results[check] = Check(check, None if check in INFORMATIONAL else True, detail)
            except Exception as e:
                msg = str(e) if isinstance(e, ContractError) else f"{type(e).__name__}: {e}"
                results[check] = Check(check, False, one_line(msg, 400))
    return [results[c] for c in CHECKS]

"""Float64 checks of the register's claims in ``attention_atlas.claims.cards``: the matroidal,
cofactor and structured-masked-attention seeds' statements that the chapters' claims leave out
(see the package docstring).

Each ``check_*`` function returns a :class:`Check` (``passed`` and the computed numbers its
sentences quote) and takes a keyword that builds a wrong instance, so the tests can show that
every check rejects one. :func:`outcomes` turns them into :class:`Outcome` objects.

One idea: the register's float64 checks of the three short seeds (the ``cards`` part), each a
small fixed instance with its wrong instance; they share the helpers (explicit minors,
lower-block ranks, the work counter), which a split by seed would scatter."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from attention_atlas.attention.dot import DotProductAttention
from attention_atlas.attention.graphs import (
    covector_matrix,
    graph_family_admits,
    is_signed_incidence,
    is_totally_unimodular,
)
from attention_atlas.attention.mahalanobis import MahalanobisAttention
from attention_atlas.attention.matroidal import (
    MatroidalAttention,
    matroidal_coefficients,
    matroidal_logits,
    matroidal_metric,
    prune_columns,
)
from attention_atlas.attention.sma import (
    Semiseparable,
    bidiagonal,
    bidiagonal_inverse_generators,
    block_bidiagonal,
    decay_mask,
    masked_attention,
    scalar_ssm_matrices,
    ssm_as_masked_attention,
    ssm_as_sum_of_masked_attentions,
    ssm_block_matrices,
    ssm_recurrence,
)
from attention_atlas.cofactor import cofactor_penalty, principal_cofactors
from attention_atlas.cofactor.references import toward_reducible
from attention_atlas.threads import intra_op_threads
from attention_atlas.verdicts import Outcome, outcome_from_check

__all__ = ["Check", "count_work", "outcomes"] + [
    f"check_{n}" for n in (
        "softplus", "eps_ridge", "pseudocode", "prune", "m_sweep", "matched_params",
        "fewer_params", "matrix_tree", "weak_access", "general_L", "row_stochastic",
        "zero_eigenvalue", "softmax_rank", "pi", "grad", "minors_float64", "slogdet",
        "causal_cumsum", "unstructured", "causal_lowrank", "recurrence", "invertible",
        "kron_orderings", "kron_inverse", "bidiagonal_inverse", "scalar_needed",
    )
]  # fmt: skip

F64 = torch.float64
U64 = 2.0**-53


@dataclass
class Check:
    """A check's verdict and the numbers its sentences quote."""

    passed: bool
    v: dict[str, Any] = field(default_factory=dict)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _rel(a: Tensor, b: Tensor) -> float:
    """``max|a - b| / max|b|`` (``max|a - b|`` when ``b`` is zero)."""
    scale = float(b.abs().max())
    return float((a - b).abs().max()) / (scale if scale > 0 else 1.0)


def _minors(L: Tensor) -> Tensor:
    """``c_i = det(L without row i and column i)`` for ``L (n, n)`` -> ``(n,)``, explicitly."""
    n = L.shape[-1]
    out = []
    for i in range(n):
        keep = [j for j in range(n) if j != i]
        out.append(torch.linalg.det(L[keep][:, keep]))
    return torch.stack(out)


def _lower_block_ranks(M: Tensor, tol: float) -> tuple[int, float]:
    """Largest numerical rank of the blocks ``M[t:, :t+1]`` (on and below the diagonal) and the
    largest ``sigma_2 / sigma_1`` among them."""
    T = M.shape[-1]
    worst, ratio = 0, 0.0
    for t in range(T):
        s = torch.linalg.svdvals(M[t:, : t + 1])
        if s[0] == 0:
            continue
        worst = max(worst, int((s > tol * s[0]).sum()))
        if s.numel() > 1:
            ratio = max(ratio, float(s[1] / s[0]))
    return worst, ratio


def _einsum_work(eq: str, ops: list[Tensor]) -> int:
    """``2 x`` the product of the sizes of every index of ``eq`` (leading ``...`` dims too)."""
    sizes: dict[str, int] = {}
    batch = 1
    for spec, op in zip(eq.split("->")[0].split(","), ops, strict=True):
        letters = spec.replace("...", "")
        lead = op.dim() - len(letters)
        batch = max(batch, math.prod(op.shape[:lead]))
        sizes.update(zip(letters, op.shape[lead:], strict=True))
    return 2 * batch * math.prod(sizes.values())


class _WorkCounter(TorchFunctionMode):
    """Counts work: matrix products and einsums as ``2 x`` multiply-adds, dense solves,
    inverses and determinants as ``2 N^3 / 3 + 2 N^2``, every other op as its output size."""

    def __init__(self) -> None:
        super().__init__()
        self.work = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "")
        if name in ("matmul", "__matmul__", "mm", "bmm", "mv") and isinstance(out, Tensor):
            self.work += 2 * max(out.numel(), 1) * args[0].shape[-1]
        elif name == "einsum":
            ops = (
                list(args[1]) if len(args) == 2 and isinstance(args[1], list | tuple) else args[1:]
            )
            self.work += _einsum_work(args[0], ops)
        elif name in ("solve", "inv", "det", "slogdet"):
            N = args[0].shape[-1]
            self.work += (2 * N**3) // 3 + 2 * N**2
        elif isinstance(out, Tensor):
            self.work += out.numel()
        return out


def count_work(fn: Callable[[], Any]) -> int:
    """Work of ``fn()``: matrix products and einsums as ``2 x`` multiply-adds, dense
    factorisations as ``2 N^3 / 3 + 2 N^2``, every other torch op as its output size (a proxy
    for FLOPs that also sees elementwise ops, prefix sums and matrix-vector products, which
    :class:`torch.utils.flop_counter.FlopCounterMode` leaves out)."""
    with torch.no_grad(), _WorkCounter() as c:
        fn()
    return c.work


def _affine(work: list[int]) -> bool:
    """Counted work at ``T, 2T, 4T`` is affine in ``T`` (second difference zero)."""
    return work[2] - work[1] == 2 * (work[1] - work[0])


# ============================================================================================
# matroidal
# ============================================================================================
def check_softplus(coef: Callable[[Tensor], Tensor] = matroidal_coefficients) -> Check:
    """``coef(theta) >= 0`` over ``theta in [-1000, 1000]`` (float64), and ``coef`` inverts
    onto every weight in ``[1e-8, 1e3]`` (inverse softplus ``l + log(-expm1(-l))``)."""
    theta = torch.linspace(-1000, 1000, 20001, dtype=F64)
    lw = coef(theta)
    l_target = torch.logspace(-8, 3, 56, dtype=F64)
    back = coef(l_target + torch.log(-torch.expm1(-l_target)))
    zero = theta[lw == 0]
    v = dict(min=float(lw.min()), argmin=float(theta[lw.argmin()]), inv_err=_rel(back, l_target),
             underflow=float(zero.max()) if zero.numel() else None)  # fmt: skip
    return Check(bool((lw >= 0).all()) and float(v["inv_err"] or 0.0) <= 1e-12, v)


def check_eps_ridge(eps: float = 1e-4, shift: float = 0.0) -> Check:
    """``lambda_min(M - shift I) = eps`` for incidence supports; ``0`` at ``eps = 0``."""
    g = _gen(1)
    rows = []
    for fam, d, m in (("ring", 8, 8), ("knn", 8, 16), ("complete", 6, 15)):
        A = covector_matrix(fam, d, m, dtype=F64)
        th = torch.randn(m, generator=g, dtype=F64)
        eye = torch.eye(d, dtype=F64)
        M = matroidal_metric(A, th, eps) - shift * eye
        M0 = matroidal_metric(A, th, 0.0)
        scale = float(torch.linalg.matrix_norm(M, 2))
        lam, lam0 = float(torch.linalg.eigvalsh(M)[0]), float(torch.linalg.eigvalsh(M0)[0])
        rows.append((fam, lam, lam0, scale))
    ok = all(abs(lam - eps) <= 1e-12 * s and abs(lam0) <= 1e-12 * s for _, lam, lam0, s in rows)
    return Check(ok, dict(rows=rows, eps=eps))


def check_pseudocode(perturb: float = 0.0) -> Check:
    """The pseudocode's logits against ``-(z_i - z_j)^T M (z_i - z_j) / (2 tau)``, ``M`` built
    by hand (``perturb`` is added to ``M[0, 1]``)."""
    g = _gen(2)
    d, m, eps, tau = 6, 9, 1e-4, 0.7
    A = covector_matrix("ring_chords", d, m, dtype=F64)
    th = torch.randn(m, generator=g, dtype=F64)
    z = torch.randn(2, 5, d, generator=g, dtype=F64)
    w = torch.log1p(torch.exp(th))  # softplus by hand
    M = A @ torch.diag(w) @ A.T + eps * torch.eye(d, dtype=F64)
    M[0, 1] += perturb
    diff = z[:, :, None, :] - z[:, None, :, :]
    ref = -torch.einsum("bijd,de,bije->bij", diff, M, diff) / (2 * tau)
    err = _rel(matroidal_logits(z, A, th, eps, tau), ref)
    return Check(err <= 1e-12, dict(err=err))


def check_prune(family: str = "ring_chords") -> Check:
    """Prune the columns below the median weight of ``A (6, 10)``: still totally unimodular, and
    the pruned metric equals the full one with the pruned weights zeroed."""
    g = _gen(3)
    d, m, eps = 6, 10, 1e-4
    A = covector_matrix(family, d, m, dtype=F64)
    th = torch.randn(m, generator=g, dtype=F64)
    delta = float(matroidal_coefficients(th).median())
    Ap, thp, kept = prune_columns(A, th, delta)
    keep = torch.zeros(m, dtype=F64)
    keep[kept] = 1.0
    zeroed = A @ torch.diag(torch.log1p(torch.exp(th)) * keep) @ A.T + eps * torch.eye(d, dtype=F64)
    err = _rel(matroidal_metric(Ap, thp, eps), zeroed)
    tu = is_totally_unimodular(Ap) and (family == "sparse_random" or is_signed_incidence(Ap))
    v = dict(kept=int(kept.numel()), m=m, err=err, tu=tu, delta=delta)
    return Check(tu and err <= 1e-14, v)


def check_m_sweep(count: Callable[[int], int] = lambda d: d * (d - 1) // 2) -> Check:
    """Where the library's graph families admit ``m = d, 2d, 4d`` against ``count(d) >= 4d``
    (``count``: the number of distinct incidence columns on ``d`` coordinates)."""
    ds = range(3, 65)
    lib = {d: all(graph_family_admits("random", d, k * d) for k in (1, 2, 4)) for d in ds}
    bound = {d: count(d) >= 4 * d for d in ds}
    dirs = {tuple(sorted((i, j))) for i, j in itertools.permutations(range(7), 2)}
    first = min((d for d in ds if all(lib[e] for e in ds if e >= d)), default=None)
    v = dict(first=first, directions7=len(dirs), edges8=count(8), need8=4 * 8)
    return Check(lib == bound and len(dirs) == count(7) and first is not None, v)


def _n_params(mod: torch.nn.Module) -> int:
    return sum(p.numel() for p in mod.parameters())


def check_matched_params(D: int = 128, H: int = 8, tol: float = 0.05) -> Check:
    """Attention parameter counts at hidden ``D``, ``H`` heads: dense and matroidal against dot."""
    d = D // H
    dot = _n_params(DotProductAttention(D, H))
    dense = _n_params(MahalanobisAttention(D, H))
    mats = {k: _n_params(MatroidalAttention(D, H, m=k * d, graph="random")) for k in (1, 2, 4)}
    closed = dot == 4 * D * D and dense == dot + H * d * d
    closed = closed and all(p == dot + H * k * d for k, p in mats.items())
    gaps = {"dense": (dense - dot) / dot} | {f"m={k}d": (p - dot) / dot for k, p in mats.items()}
    return Check(closed and max(gaps.values()) <= tol, dict(dot=dot, dense=dense, gaps=gaps, H=H))


def check_fewer_params(D: int = 128, H: int = 8, graph: str = "random") -> Check:
    """Metric parameters of the matroidal (``m = d, 2d, 4d``) and dense modules."""
    d = D // H
    dense = sum(p.numel() for p in MahalanobisAttention(D, H).metric_parameters())
    mats = {}
    for k in (1, 2, 4):
        mod = MatroidalAttention(D, H, m=k * d, graph=graph)
        mats[k] = sum(p.numel() for p in mod.metric_parameters())
    closed = dense == H * d * d and all(p == H * k * d for k, p in mats.items())
    return Check(closed and max(mats.values()) < dense, dict(dense=dense, mats=mats, d=d))


# ============================================================================================
# cofactor
# ============================================================================================
def _softmax_head(n: int, seed: int, scale: float = 1.0) -> Tensor:
    return torch.softmax(scale * torch.randn(n, n, generator=_gen(seed), dtype=F64), -1)


def _in_tree_sum(A: Tensor, root: int, orient: str = "in") -> float:
    """Sum over spanning trees oriented toward ``root`` of ``prod A[j, parent(j)]`` (``orient =
    "out"`` uses ``A[parent(j), j]``: the wrong orientation, for the negative control)."""
    n = A.shape[0]
    others = [j for j in range(n) if j != root]
    a = A.tolist()
    total = 0.0
    for parents in itertools.product(range(n), repeat=n - 1):
        par = dict(zip(others, parents, strict=True))
        if any(par[j] == j for j in others):
            continue
        ok = True
        for j in others:  # following parents from j must reach the root within n steps
            k, steps = j, 0
            while k != root and steps <= n:
                k, steps = par[k], steps + 1
            ok = ok and k == root
        if ok:
            total += math.prod(a[j][p] if orient == "in" else a[p][j] for j, p in par.items())
    return total


def check_matrix_tree(orient: str = "in") -> Check:
    """``c_i`` (the library's minors) against an enumeration of in-trees at ``n = 5``."""
    A = _softmax_head(5, 4, scale=2.0)
    c = principal_cofactors(A, "minors")
    ref = torch.tensor([_in_tree_sum(A, r, orient) for r in range(5)], dtype=F64)
    err = _rel(c, ref)
    return Check(err <= 1e-12, dict(err=err, n=5))


def _reach_all(A: Tensor) -> Tensor:
    """``(n,)`` bool: token ``i`` is reached by every token along edges ``A_jk > 0``."""
    n = A.shape[0]
    R = (A > 0) | torch.eye(n, dtype=torch.bool)
    for _ in range(n):
        R = R | ((R.double() @ R.double()) > 0)
    return R.all(0)


def check_weak_access(reverse: bool = False) -> Check:
    """On 20 random sparse row-stochastic ``6 x 6`` patterns, ``c_i > 1e-12`` exactly where every
    token reaches ``i`` (``reverse``: where ``i`` reaches every token, the wrong direction)."""
    g = _gen(5)
    mismatches, zeros, patterns = 0, 0, 20
    for _ in range(patterns):
        W = torch.rand(6, 6, generator=g, dtype=F64) * (torch.rand(6, 6, generator=g) < 0.35)
        W = W + torch.diag((W.sum(-1) == 0).double())  # every row attends somewhere
        A = W / W.sum(-1, keepdim=True)
        pos = principal_cofactors(A, "minors") > 1e-12
        reach = _reach_all(A.T) if reverse else _reach_all(A)
        mismatches += int((pos != reach).sum())
        zeros += int((~pos).sum())
    return Check(mismatches == 0 and zeros > 0, dict(mismatches=mismatches, zeros=zeros,
                                                      patterns=patterns))  # fmt: skip


def _nonzero_eig_product(L: Tensor, zeros: int = 1) -> complex:
    ev = torch.linalg.eigvals(L)
    ev = ev[ev.abs().argsort()]
    return complex(ev[zeros:].prod())


def check_general_L(row_shift: float = 0.0) -> Check:
    """``c^T L = 0`` and ``sum c = prod`` of the nonzero eigenvalues for a random real ``L`` with
    zero row sums (``row_shift`` is added to ``L[0, 0]``: the rows no longer sum to zero)."""
    n = 6
    X = torch.randn(n, n, generator=_gen(6), dtype=F64)
    L = X - torch.diag(X.sum(-1))
    L[0, 0] += row_shift
    c = _minors(L)
    left = float((c @ L).abs().max()) / float(c.abs().max() * torch.linalg.matrix_norm(L, 2))
    prod = _nonzero_eig_product(L)
    margin_err = abs(float(c.sum()) - prod) / abs(prod)
    neg = bool((L - torch.diag(torch.diag(L)) < 0).any())
    complex_eigs = bool((torch.linalg.eigvals(L).imag.abs() > 1e-9).any())
    h = n // 2  # rank n - 2: two blocks with zero row sums
    L2 = torch.block_diag(L[:h, :h] - torch.diag(L[:h, :h].sum(-1)),
                          L[h:, h:] - torch.diag(L[h:, h:].sum(-1)))  # fmt: skip
    v = dict(left=left, margin_err=margin_err, neg=neg, complex=complex_eigs,
             rank2_sum=float(_minors(L2).sum()), rank2_prod=_nonzero_eig_product(L2, 2).real)  # fmt: skip
    return Check(left <= 1e-12 and margin_err <= 1e-12, v)


def check_row_stochastic(dim: int = -1) -> Check:
    """``|A 1 - 1| <= 4 n u`` for ``A = exp(Z)`` normalised along ``dim`` (``-1``: softmax)."""
    n = 16
    Z = 10 * torch.randn(n, n, generator=_gen(7), dtype=F64)
    E = torch.exp(Z - Z.max())
    A = torch.softmax(Z, -1) if dim == -1 else E / E.sum(dim, keepdim=True)
    err = float((A.sum(-1) - 1).abs().max())
    return Check(err <= 4 * n * U64, dict(err=err, bound=4 * n * U64, n=n))


def check_zero_eigenvalue(scale: float = 1.0) -> Check:
    """Smallest ``|eigenvalue|`` of ``L = I - scale A`` and ``|L 1|`` for a softmax ``A``."""
    n = 16
    A = scale * _softmax_head(n, 8, scale=5.0)
    L = torch.eye(n, dtype=F64) - A
    small = float(torch.linalg.eigvals(L).abs().min())
    res = float((L @ torch.ones(n, dtype=F64)).abs().max())
    return Check(small <= 1e-13 and res <= 1e-13, dict(small=small, res=res, n=n))


def check_softmax_rank(spread: float = 5.0) -> Check:
    """``rank(I - A) = n - 1`` for a softmax ``A`` of logits of scale ``spread`` (two smallest
    singular values); beside it the float64 underflow case (two blocks 800 logits apart)."""
    n = 8

    def sv(A: Tensor) -> Tensor:
        return torch.linalg.svdvals(torch.eye(n, dtype=F64) - A)

    s = sv(_softmax_head(n, 9, scale=spread))
    ok = float(s[-1]) <= 1e-14 * float(s[0]) and float(s[-2]) > 1e-8 * float(s[0])
    Z = torch.randn(n, n, generator=_gen(10), dtype=F64)
    h = n // 2
    Z[:h, h:] -= 800.0
    Z[h:, :h] -= 800.0
    Au = torch.softmax(Z, -1)
    su = sv(Au)
    v = dict(ratio=float(s[-2] / s[0]), last=float(s[-1]), zeros=int((Au == 0).sum()),
             u_ratio=float(su[-2] / su[0]), u_margin=float(principal_cofactors(Au, "minors").sum()))  # fmt: skip
    return Check(ok, v)


def _pi(c: Tensor, eps: float) -> Tensor:
    p = c.clamp_min(0) + eps
    return p / p.sum()


def check_pi(formula_eps: float = 1e-8, eps: float = 1e-8) -> Check:
    """``pi`` (with ``eps``) against ``s = c / sum c`` on a mixing head (``n = 8``), and the
    deviation against ``formula_eps |1 - n s|_1 / (m + n formula_eps)`` (to ``1e-6``: the
    deviation is a difference of numbers of size ``1 / n``, so round-off limits it); beside it a head of two
    blocks coupled at ``1e-9`` (``n = 12``)."""
    res = {}
    for name, A in (("mixing", _softmax_head(8, 11)),
                    ("near", toward_reducible("two closed blocks", 1e-9, n=12))):  # fmt: skip
        c = principal_cofactors(A, "minors")
        n, m = A.shape[-1], float(c.sum())
        s = c / c.sum()
        dev = float((_pi(c, eps) - s).abs().sum())
        closed = formula_eps * float((1 - n * s).abs().sum()) / (m + n * formula_eps)
        res[name] = dict(dev=dev, closed_err=abs(dev - closed) / dev, m=m, n=n,
                         s_from_u=float((s - 1 / n).abs().sum()),
                         pi_from_u=float((_pi(c, eps) - 1 / n).abs().sum()))  # fmt: skip
    mix = res["mixing"]
    ok = mix["dev"] <= 1e-6 and all(r["closed_err"] <= 1e-6 for r in res.values())
    return Check(ok, res)


def _e_coeffs(L: np.ndarray) -> np.ndarray:
    """Elementary symmetric functions ``e_0..e_n`` of the eigenvalues of ``L``."""
    poly = np.poly(L)  # det(tI - L) = sum_j (-1)^j e_j t^(n-j)
    return np.real(poly * (-1.0) ** np.arange(len(poly)))


def _grad_reference(Z: Tensor, eps: float, terms: int | None = None) -> Tensor:
    """``d(-log(m + eps))/dZ`` in closed form, ``m = e_{n-1}(L)``, ``L = I - softmax(Z)``."""
    A = torch.softmax(Z, -1).numpy()
    n = A.shape[0]
    L = np.eye(n) - A
    e = _e_coeffs(L)
    k = n - 1
    dm = np.zeros((n, n))
    P = np.eye(n)
    for j in range(k if terms is None else terms):  # d e_k / dL = (sum_j (-1)^j e_{k-1-j} L^j)^T
        dm += (-1) ** j * e[k - 1 - j] * P
        P = P @ L
    m = e[k]
    gA = dm.T / (m + eps)  # dloss/dA = -dloss/dL, dloss/dL = -dm/dL / (m + eps)
    gZ = A * (gA - (gA * A).sum(-1, keepdims=True))
    return torch.from_numpy(gZ)


def check_grad(terms: int | None = None) -> Check:
    """Autograd of the library's penalty (``minors`` and ``lu``, ``beta = 0``) against the
    closed form (``terms``: truncate its sum, for the negative control)."""
    Z = torch.randn(6, 6, generator=_gen(12), dtype=F64)
    ref = _grad_reference(Z, 1e-8, terms)
    errs = {}
    for method in ("minors", "lu"):
        Zg = Z.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(cofactor_penalty(torch.softmax(Zg, -1), method=method), Zg)
        errs[method] = _rel(g, ref)
    return Check(max(errs.values()) <= 1e-9, dict(errs=errs))


def _closed_form_head(n: int, alpha: float) -> tuple[Tensor, Tensor]:
    """``A = (1 - alpha) I + alpha 1 p^T`` and its cofactors ``alpha^(n-1) p`` (float64)."""
    p = torch.rand(n, generator=_gen(13), dtype=F64) + 0.1
    p = p / p.sum()
    A = (1 - alpha) * torch.eye(n, dtype=F64) + alpha * torch.ones(n, 1, dtype=F64) * p
    return A, alpha ** (n - 1) * p


def check_minors_float64(dtype: torch.dtype = F64) -> Check:
    """The library's explicit minors at ``n = 32`` in ``dtype`` against the closed form."""
    errs = {}
    for alpha in (0.5, 0.01, 0.001):
        A, c = _closed_form_head(32, alpha)
        got = principal_cofactors(A.to(dtype), "minors", check=False).to(F64)
        errs[alpha] = float(((got - c).abs() / c).max())
    return Check(max(errs.values()) <= 1e-10, dict(errs=errs))


def check_slogdet(
    dtype: torch.dtype = torch.float32, alphas: tuple[float, ...] = (0.5, 0.01)
) -> Check:
    """Cofactors by ``sign exp(log|det|)`` of each minor in ``dtype`` against the closed form at
    ``n = 32``; and, in float64, against ``det``."""
    errs, logdet_err, consistency = {}, {}, 0.0
    for alpha in alphas:
        A, c = _closed_form_head(32, alpha)
        L = (torch.eye(32, dtype=F64) - A).to(dtype)
        minors = torch.stack([L[[j for j in range(32) if j != i]][:, [j for j in range(32) if j != i]]
                              for i in range(32)])  # fmt: skip
        sign, logabs = torch.linalg.slogdet(minors)
        got = (sign * torch.exp(logabs)).to(F64)
        errs[alpha] = float(((got - c).abs() / c).max())
        logdet_err[alpha] = float((logabs.to(F64) - torch.log(c)).abs().max())
        s64, l64 = torch.linalg.slogdet(minors.to(F64))
        consistency = max(consistency, _rel(s64 * torch.exp(l64), torch.linalg.det(minors.to(F64))))
    ok = max(errs.values()) <= 1e-4 and consistency <= 1e-12
    return Check(ok, dict(errs=errs, logdet_err=logdet_err, consistency=consistency,
                          c_min=float(_closed_form_head(32, min(alphas))[1].min())))  # fmt: skip


# ============================================================================================
# structured masked attention
# ============================================================================================
def check_causal_cumsum(lower: bool = True) -> Check:
    """``(tril(1) o B) x`` (the library) against the loop ``sum_{j<=i} B_ij x_j`` and, for
    ``B = 1``, against ``cumsum`` (``lower=False`` masks with ``triu``)."""
    T = 12
    g = _gen(14)
    B = torch.randn(T, T, generator=g, dtype=F64)
    x = torch.randn(T, generator=g, dtype=F64)
    ones = torch.ones(T, T, dtype=F64)
    mask = torch.tril(ones) if lower else torch.triu(ones)
    ref = torch.stack([(B[i, : i + 1] * x[: i + 1]).sum() for i in range(T)])  # the seed's loop
    err = _rel(masked_attention(mask, B, x), ref)
    err1 = _rel(masked_attention(mask, ones, x), torch.cumsum(x, 0))
    return Check(max(err, err1) <= 1e-12, dict(err=err, err1=err1))


def check_unstructured(diagonal: int = 0) -> Check:
    """Entries of ``B`` that ``(tril(1, diagonal) o B) x`` depends on (Jacobian support)."""
    T = 10
    g = _gen(15)
    B = torch.randn(T, T, generator=g, dtype=F64)
    x = torch.rand(T, generator=g, dtype=F64) + 0.5
    mask = torch.tril(torch.ones(T, T, dtype=F64), diagonal)
    J = torch.autograd.functional.jacobian(lambda b: masked_attention(mask, b, x), B)
    used = int((J.abs().sum(0) > 0).sum())
    return Check(used == T * (T + 1) // 2, dict(used=used, T=T, want=T * (T + 1) // 2))


def check_causal_lowrank(dense: bool = False) -> Check:
    """``Semiseparable(U, V) @ x`` against ``tril(U V^T) x``, lower-block ranks (at ``T = 32``),
    and counted work over ``T = 32, 64, 128`` (``dense``: count the materialised product instead)."""
    p, errs, work, rank = 2, [], [], 0
    for T in (32, 64, 128):
        g = _gen(T)
        U, V = (torch.randn(T, p, generator=g, dtype=F64) for _ in range(2))
        x = torch.randn(T, generator=g, dtype=F64)
        S = Semiseparable(U, V)
        Md = torch.tril(U @ V.T)
        errs.append(_rel(S @ x, Md @ x))

        def product(S: Any = S, U: Tensor = U, V: Tensor = V, x: Tensor = x) -> Tensor:
            return (torch.tril(U @ V.T) @ x) if dense else S @ x

        work.append(count_work(product))
        if T == 32:
            rank = _lower_block_ranks(Md, 1e-10)[0]
    ok = max(errs) <= 1e-12 and rank <= p and _affine(work)
    return Check(ok, dict(err=max(errs), rank=rank, work=work, p=p))


def _ssm_instance(T: int, n: int, seed: int, singular: int | None = None):
    g = _gen(seed)
    A_blocks = 0.5 * torch.randn(T - 1, n, n, generator=g, dtype=F64)
    if singular is not None:
        A_blocks[singular, :, 0] = 0.0  # a zero column: rank n - 1
    B_blocks = torch.randn(T, n, 1, generator=g, dtype=F64)
    C_blocks = torch.randn(T, n, 1, generator=g, dtype=F64)
    x = torch.randn(T, 1, generator=g, dtype=F64)
    return A_blocks, B_blocks, C_blocks, x


def check_recurrence(dense: bool = False) -> Check:
    """Recurrence states against a dense solve, and its counted work over ``T = 16, 32, 64``
    (``dense``: count the dense solve instead)."""
    errs, work = [], []
    for T in (16, 32, 64):
        Ab, Bb, Cb, x = _ssm_instance(T, 3, T)
        h, _ = ssm_recurrence(Ab, Bb, Cb, x)
        A, B, _ = ssm_block_matrices(Ab, Bb, Cb)
        errs.append(_rel(h.reshape(-1), torch.linalg.solve(A, B @ x.reshape(-1))))

        def run(Ab=Ab, Bb=Bb, Cb=Cb, x=x, A=A, B=B):
            return (
                torch.linalg.solve(A, B @ x.reshape(-1)) if dense else ssm_recurrence(Ab, Bb, Cb, x)
            )

        work.append(count_work(run))
    return Check(max(errs) <= 1e-12 and _affine(work), dict(err=max(errs), work=work))


def check_invertible(singular: int | None = 1) -> Check:
    """Block bidiagonal ``A`` with transition ``A_singular`` of rank ``n - 1``: ``A`` invertible,
    ``A^{-1}`` = transition products, recurrence exact, and the generators' error."""
    T, n = 6, 3
    Ab, Bb, Cb, x = _ssm_instance(T, n, 16, singular)
    A, B, _ = ssm_block_matrices(Ab, Bb, Cb)
    det = float(torch.linalg.det(A))
    Ainv = torch.linalg.inv(A)
    prod_err = 0.0
    for i in range(T):
        for j in range(i + 1):
            P = torch.eye(n, dtype=F64)
            for k in range(j, i):
                P = Ab[k] @ P
            prod_err = max(prod_err, float((Ainv[i * n:(i + 1) * n, j * n:(j + 1) * n] - P).abs().max()))  # fmt: skip
    h, _ = ssm_recurrence(Ab, Bb, Cb, x)
    rec_err = _rel(h.reshape(-1), Ainv @ (B @ x.reshape(-1)))
    try:
        gen_err = _rel(bidiagonal_inverse_generators(Ab).dense(), Ainv)
    except RuntimeError as exc:  # torch.linalg.inv refuses an exactly singular product
        gen_err = float("inf") if "singular" in str(exc).lower() else float("nan")
    gen_fails = not (gen_err <= 1e-6)
    ok = abs(det - 1) <= 1e-12 and prod_err <= 1e-12 and rec_err <= 1e-12 and gen_fails
    return Check(ok, dict(det=det, prod_err=prod_err, rec_err=rec_err, gen_err=gen_err))


def _commutation(n: int, T: int) -> Tensor:
    """``P`` with ``P (a kron I_n) P^T = I_n kron a`` (time-major to state-major)."""
    P = torch.zeros(n * T, n * T, dtype=F64)
    for t in range(T):
        for k in range(n):
            P[k * T + t, t * n + k] = 1.0
    return P


def check_kron_orderings(shuffle: bool = True) -> Check:
    """``P (a kron I) P^T = I kron a`` and the outputs of both orderings (``shuffle=False``:
    ``P = I``)."""
    T, n = 5, 3
    g = _gen(17)
    a = torch.rand(T - 1, generator=g, dtype=F64) + 0.2
    Bn, Cn = (torch.randn(T, n, generator=g, dtype=F64) for _ in range(2))
    x = torch.randn(T, generator=g, dtype=F64)
    eye = torch.eye(n, dtype=F64)
    time_major = block_bidiagonal(a[:, None, None] * eye)
    kron_err = float((time_major - torch.kron(bidiagonal(a), eye)).abs().max())
    A_s, B_s, C_s = scalar_ssm_matrices(a, Bn, Cn)  # state-major
    P = _commutation(n, T) if shuffle else torch.eye(n * T, dtype=F64)
    perm_err = float((P @ time_major @ P.T - A_s).abs().max())
    y_state = C_s.T @ torch.linalg.solve(A_s, B_s @ x)
    _, y_time = ssm_recurrence(a[:, None, None] * eye, Bn[:, :, None], Cn[:, :, None], x[:, None])
    y_err = _rel(y_time[:, 0], y_state)
    ok = kron_err == 0 and perm_err == 0 and y_err <= 1e-12
    return Check(ok, dict(kron_err=kron_err, perm_err=perm_err, y_err=y_err))


def check_kron_inverse(swap: bool = False) -> Check:
    """``(X kron Y)^{-1}`` against ``X^{-1} kron Y^{-1}`` (``swap``: ``Y^{-1} kron X^{-1}``)."""
    g = _gen(18)
    X = torch.randn(3, 3, generator=g, dtype=F64) + 3 * torch.eye(3, dtype=F64)
    Y = bidiagonal(torch.rand(4, generator=g, dtype=F64) + 0.2)
    Xi, Yi = torch.linalg.inv(X).contiguous(), torch.linalg.inv(Y).contiguous()
    rhs = torch.kron(Yi, Xi) if swap else torch.kron(Xi, Yi)
    err = _rel(torch.linalg.inv(torch.kron(X, Y)), rhs)
    I3 = torch.eye(3, dtype=F64)
    err_i = _rel(torch.linalg.inv(torch.kron(I3, Y)), torch.kron(I3, Yi))
    return Check(max(err, err_i) <= 1e-12, dict(err=err, err_i=err_i))


def check_bidiagonal_inverse(matrix: Tensor | None = None) -> Check:
    """``bidiagonal(a)^{-1}`` against the closed form (the library's :func:`decay_mask`) and its
    lower-block ranks, for ``a`` in (0.2, 1.2) and with ``a_3 = 0``; the generator form's error
    at ``a_3 = 0``. ``matrix``: rank-test that matrix instead (negative control)."""
    T = 8
    a = torch.rand(T - 1, generator=_gen(19), dtype=F64) + 0.2
    a0 = a.clone()
    a0[3] = 0.0
    errs, ranks = [], []
    for aa in (a, a0):
        inv = torch.linalg.inv(bidiagonal(aa))
        errs.append(_rel(inv, decay_mask(aa)))
        ranks.append(_lower_block_ranks(inv if matrix is None else matrix, 1e-12)[0])
    gen = bidiagonal_inverse_generators(a0).dense()
    gen_finite = bool(torch.isfinite(gen).all())
    ok = max(errs) <= 1e-12 and max(ranks) <= 1
    return Check(ok, dict(err=max(errs), ranks=ranks, gen_finite=gen_finite))


def check_scalar_needed(distinct: bool = True) -> Check:
    """Lower-block ranks of the mask ``M o/ (C B^T)`` implied by scalar and per-state dynamics
    (``distinct=False``: every state gets the same dynamics, the negative control)."""
    T, n = 8, 3
    g = _gen(20)
    Bn = torch.rand(T, n, generator=g, dtype=F64) + 0.5
    Cn = torch.rand(T, n, generator=g, dtype=F64) + 0.5
    a = torch.rand(T - 1, generator=g, dtype=F64) * 0.8 + 0.2
    a_k = torch.rand(n, T - 1, generator=g, dtype=F64) * 0.8 + 0.2 if distinct else a.expand(n, -1)
    low = torch.tril(torch.ones(T, T, dtype=torch.bool))
    masks = {}
    for name, M in (("scalar", ssm_as_masked_attention(a, Bn, Cn)),
                    ("per-state", ssm_as_sum_of_masked_attentions(a_k, Bn, Cn))):  # fmt: skip
        masks[name] = _lower_block_ranks(torch.where(low, M / (Cn @ Bn.T), 0.0), 1e-8)
    ok = masks["scalar"][0] == 1 and masks["per-state"][1] > 1e-8
    return Check(ok, dict(masks=masks))


# ============================================================================================
# outcomes
# ============================================================================================
def _out(key: str, c: Check, yes: str, no: str, witness: str) -> tuple[str, Outcome]:
    return key, outcome_from_check(c.passed, yes, no, witness=witness, extra=dict(c.v))


def outcomes(smoke: bool = False) -> dict[str, Outcome]:
    """The outcome of every claim of ``attention_atlas.claims.cards`` that this module checks
    (``smoke`` changes nothing: every check is already at toy size). Runs on one intra-op
    thread (toy-sized ops gain nothing from more, and lose much on a loaded machine)."""
    del smoke
    with intra_op_threads(1):
        return _outcomes()


def _outcomes() -> dict[str, Outcome]:
    res: list[tuple[str, Outcome]] = []

    c, neg = check_softplus(), check_softplus(lambda t: t)
    under = c.v["underflow"]
    res.append(_out(
        "matroidal/softplus-nonneg", c,
        f"softplus is never negative on theta in [-1000, 1000] (minimum {c.v['min']:.3g}) and "
        f"inverts onto l in [1e-8, 1e3] to {c.v['inv_err']:.1e}; in float64 it underflows to "
        f"exactly 0 at theta <= {under:.0f}, still nonnegative",
        f"a coefficient is negative (minimum {c.v['min']:.3g}) or the inverse is off by "
        f"{c.v['inv_err']:.1e}",
        f"an unconstrained weight l = theta would reach {neg.v['min']:.0f}",
    ))  # fmt: skip
    c, neg = check_eps_ridge(), check_eps_ridge(shift=2e-4)
    lams = ", ".join(f"{f} {lam:.6g}" for f, lam, _, _ in c.v["rows"])
    res.append(_out(
        "matroidal/eps-ridge", c,
        f"lambda_min(M) equals eps = {c.v['eps']:g} for the incidence supports ({lams}) and is "
        f"{max(abs(r[2]) for r in c.v['rows']):.1e} without the ridge: eps alone makes M definite",
        f"lambda_min(M) differs from eps: {lams}",
        f"a metric {2e-4:g} lower has lambda_min {neg.v['rows'][0][1]:.3g}, which it rejects",
    ))  # fmt: skip
    c, neg = check_pseudocode(), check_pseudocode(1e-6)
    res.append(_out(
        "matroidal/pseudocode-exact", c,
        f"the pseudocode's logits equal -(z_i - z_j)^T M (z_i - z_j) / (2 tau) with M built by "
        f"hand to {c.v['err']:.1e} relative",
        f"the pseudocode's logits differ from the quadratic form by {c.v['err']:.1e}",
        f"M with one entry off by 1e-6 gives {neg.v['err']:.1e}, "
        f"{neg.v['err'] / max(c.v['err'], 1e-300):.0e} times the clean error",
    ))  # fmt: skip
    c, neg = check_prune(), check_prune("sparse_random")
    res.append(_out(
        "matroidal/prune-tu", c,
        f"pruning at delta = {c.v['delta']:.3g} keeps {c.v['kept']} of {c.v['m']} incidence "
        f"columns, still totally unimodular, and the metric equals the zeroed one to "
        f"{c.v['err']:.1e}",
        f"the pruned matrix is {'not ' if not c.v['tu'] else ''}totally unimodular and its metric "
        f"is off by {c.v['err']:.1e}",
        f"the same pruning of a sparse random +-1 support is rejected (totally unimodular: "
        f"{neg.v['tu']})",
    ))  # fmt: skip
    c, neg = check_m_sweep(), check_m_sweep(lambda d: d * d)
    res.append(_out(
        "matroidal/m-sweep-feasible", c,
        f"holds generically; fails for d <= {c.v['first'] - 1}: the library admits m = d, 2d, 4d "
        f"distinct incidence columns exactly where d(d-1)/2 >= 4d, first at d = {c.v['first']}; "
        f"8 heads of hidden {8 * 8} (d = 8) have only {c.v['edges8']} < {c.v['need8']} columns",
        f"the library's admissible d disagree with the count d(d-1)/2 >= 4d (first d "
        f"{c.v['first']})",
        "a count allowing d^2 columns (repeated or self edges) disagrees with the library",
    ))  # fmt: skip
    c, neg = check_matched_params(), check_matched_params(H=2)
    gaps = ", ".join(f"{k} {v:+.1%}" for k, v in c.v["gaps"].items())
    res.append(_out(
        "matroidal/matched-params", c,
        f"holds generically; fails for few heads: at hidden 128, 8 heads the counts are within "
        f"{max(c.v['gaps'].values()):.1%} of dot's {c.v['dot']:,} ({gaps}); the dense metric adds "
        f"1/(4H) of it, {neg.v['gaps']['dense']:.1%} at 2 heads",
        f"the counts differ from dot's {c.v['dot']:,} by more than 5%: {gaps}",
        f"at 2 heads the dense arm is {neg.v['gaps']['dense']:+.1%} off, which it rejects",
    ))  # fmt: skip
    c, neg = check_fewer_params(), check_fewer_params(16, 4, "sparse_random")
    res.append(_out(
        "matroidal/fewer-params", c,
        f"at head dim {c.v['d']} the matroidal metric has "
        f"{', '.join(str(v) for v in c.v['mats'].values())} parameters (m = d, 2d, 4d) against "
        f"{c.v['dense']} for the dense one",
        f"the matroidal metric has {max(c.v['mats'].values())} parameters, not fewer than the "
        f"dense {c.v['dense']}",
        f"at head dim 4, m = 4d = d^2 ties the dense count ({neg.v['mats'][4]} against "
        f"{neg.v['dense']}), which it rejects",
    ))  # fmt: skip

    c, neg = check_matrix_tree(), check_matrix_tree("out")
    res.append(_out(
        "cofactor/matrix-tree", c,
        f"at n = {c.v['n']} every c_i equals the sum over spanning in-trees toward i to "
        f"{c.v['err']:.1e} relative",
        f"the cofactors differ from the in-tree sums by {c.v['err']:.1e}",
        f"the out-tree orientation is off by {neg.v['err']:.2g}",
    ))  # fmt: skip
    c, neg = check_weak_access(), check_weak_access(reverse=True)
    res.append(_out(
        "cofactor/weak-access", c,
        f"over {c.v['patterns']} sparse patterns c_i > 0 exactly where every token reaches i "
        f"({c.v['zeros']} vanishing cofactors, {c.v['mismatches']} mismatches)",
        f"{c.v['mismatches']} cofactors disagree with reachability",
        f"the opposite direction (i reaches every token) gives {neg.v['mismatches']} mismatches",
    ))  # fmt: skip
    c, neg = check_general_L(), check_general_L(0.1)
    res.append(_out(
        "cofactor/general-L", c,
        f"for a random L with zero row sums (negative weights: {c.v['neg']}, complex "
        f"eigenvalues: {c.v['complex']}) c^T L = 0 to {c.v['left']:.1e} and sum c = prod of the "
        f"nonzero eigenvalues to {c.v['margin_err']:.1e}; the rank hypothesis is needed: at rank "
        f"n - 2, sum c = {c.v['rank2_sum']:.1e} but the nonzero eigenvalues multiply to "
        f"{c.v['rank2_prod']:.3g}",
        f"c^T L is {c.v['left']:.1e} and the margin is off by {c.v['margin_err']:.1e}",
        f"rows not summing to zero give c^T L = {neg.v['left']:.2g}",
    ))  # fmt: skip
    c, neg = check_row_stochastic(), check_row_stochastic(0)
    res.append(_out(
        "cofactor/row-stochastic", c,
        f"softmax rows sum to one within {c.v['err']:.1e} (bound 4 n u = {c.v['bound']:.1e}, "
        f"n = {c.v['n']})",
        f"softmax rows are off one by {c.v['err']:.1e}",
        f"column normalisation leaves rows off by {neg.v['err']:.2g}",
    ))  # fmt: skip
    c, neg = check_zero_eigenvalue(), check_zero_eigenvalue(0.999)
    res.append(_out(
        "cofactor/zero-eigenvalue", c,
        f"the smallest |eigenvalue| of I - A is {c.v['small']:.1e} and |L 1| = {c.v['res']:.1e}",
        f"the smallest |eigenvalue| of I - A is {c.v['small']:.1e}",
        f"a substochastic A (rows 0.999) gives {neg.v['small']:.1e}",
    ))  # fmt: skip
    c, neg = check_softmax_rank(), check_softmax_rank(800.0)
    res.append(_out(
        "cofactor/softmax-rank", c,
        f"holds generically; fails for float64 logits 800 apart: at moderate logits "
        f"sigma_(n-1) / sigma_1 = {c.v['ratio']:.3g} and sigma_n = {c.v['last']:.1e} (rank "
        f"n - 1), but blocks 800 logits apart underflow to {c.v['zeros']} exact zeros, "
        f"sigma_(n-1) / sigma_1 = {c.v['u_ratio']:.1e} and the margin is {c.v['u_margin']:.1e}",
        f"rank(I - A) < n - 1 at moderate logits (sigma_(n-1) / sigma_1 = {c.v['ratio']:.1e})",
        f"logits of scale 800 give sigma_(n-1) / sigma_1 = {neg.v['ratio']:.1e}, which it rejects",
    ))  # fmt: skip
    c, neg = check_pi(), check_pi(formula_eps=1e-7)
    mix, near = c.v["mixing"], c.v["near"]
    res.append(_out(
        "cofactor/pi-stationary", c,
        f"holds generically; fails when the margin is below n eps: on a mixing head pi is "
        f"{mix['dev']:.1e} from c / sum c (the closed form eps |1 - n s|_1 / (m + n eps) to "
        f"{mix['closed_err']:.1e}), but two blocks coupled at 1e-9 have m = {near['m']:.1e} < "
        f"n eps = {near['n'] * 1e-8:.1e}, and pi is {near['pi_from_u']:.1e} from uniform while "
        f"the stationary distribution is {near['s_from_u']:.2f} from it",
        f"pi is {mix['dev']:.1e} from c / sum c on a mixing head",
        f"the closed form with the wrong eps (1e-7) is off by {neg.v['mixing']['closed_err']:.2f}",
    ))  # fmt: skip
    c, neg = check_grad(), check_grad(terms=3)
    res.append(_out(
        "cofactor/grad", c,
        f"autograd through the minors and through the fast LU match the closed-form gradient to "
        f"{c.v['errs']['minors']:.1e} and {c.v['errs']['lu']:.1e}",
        f"the gradients differ from the closed form by {max(c.v['errs'].values()):.1e}",
        f"the closed form truncated to 3 terms is off by {neg.v['errs']['minors']:.2g}",
    ))  # fmt: skip
    c, neg = check_minors_float64(), check_minors_float64(torch.float32)
    e = c.v["errs"]
    res.append(_out(
        "cofactor/minors-float64", c,
        "at n = 32 the float64 minors match alpha^(n-1) p to "
        + ", ".join(f"{v:.1e} (alpha {k:g})" for k, v in e.items()),
        "the float64 minors are off by " + ", ".join(f"{v:.1e}" for v in e.values()),
        "the same minors in float32 are off by "
        + ", ".join(f"{v:.2g} (alpha {k:g})" for k, v in neg.v["errs"].items()),
    ))  # fmt: skip
    c, pos = check_slogdet(), check_slogdet(torch.float32, (0.5,))
    e = c.v["errs"]
    res.append(_out(
        "cofactor/slogdet", c,
        "in float32 the slogdet cofactors match the closed form to "
        + ", ".join(f"{v:.1e} (alpha {k:g})" for k, v in e.items()),
        f"in float32 the reconstruction sign exp(log|det|) is off by {e[0.01]:.2g} at alpha "
        f"0.01, n = 32: the cofactors (down to {c.v['c_min']:.1e}) underflow to zero although "
        f"log|det| itself is within {c.v['logdet_err'][0.01]:.1e}; only float64 (or staying in "
        f"log space) keeps them",
        f"at alpha 0.5 the same float32 check passes ({pos.v['errs'][0.5]:.1e}): the test can "
        f"pass; float64 slogdet agrees with det to {c.v['consistency']:.1e}",
    ))  # fmt: skip

    c, neg = check_causal_cumsum(), check_causal_cumsum(False)
    res.append(_out(
        "sma/causal-cumsum", c,
        f"(tril(1) o B) x equals the weighted cumulative sum to {c.v['err']:.1e} and the plain "
        f"cumulative sum for B = 1 to {c.v['err1']:.1e}",
        f"(tril(1) o B) x differs from the weighted cumulative sum by {c.v['err']:.1e}",
        f"an upper-triangular mask is off by {neg.v['err']:.2g}",
    ))  # fmt: skip
    c, neg = check_unstructured(), check_unstructured(-1)
    res.append(_out(
        "sma/unstructured-quadratic", c,
        f"at T = {c.v['T']} the product depends on {c.v['used']} = T(T+1)/2 entries of B",
        f"the product depends on {c.v['used']} entries of B, not T(T+1)/2 = {c.v['want']}",
        f"a strictly lower mask uses {neg.v['used']}, which it rejects",
    ))  # fmt: skip
    c, neg = check_causal_lowrank(), check_causal_lowrank(dense=True)
    res.append(_out(
        "sma/causal-lowrank", c,
        f"the prefix-sum product matches tril(U V^T) x to {c.v['err']:.1e}, every lower block "
        f"has rank <= {c.v['rank']} (p = {c.v['p']}), and the counted work "
        f"{', '.join(map(str, c.v['work']))} at T = 32, 64, 128 is linear",
        f"error {c.v['err']:.1e}, lower-block rank {c.v['rank']}, work {c.v['work']}",
        f"the dense product's work {', '.join(map(str, neg.v['work']))} is not linear",
    ))  # fmt: skip
    c, neg = check_recurrence(), check_recurrence(dense=True)
    res.append(_out(
        "sma/recurrence-linear", c,
        f"the recurrence matches the dense solve to {c.v['err']:.1e} with counted work "
        f"{', '.join(map(str, c.v['work']))} at T = 16, 32, 64: affine in T",
        f"error {c.v['err']:.1e}, work {c.v['work']} not affine",
        f"the dense solve's work {', '.join(map(str, neg.v['work']))} is not affine",
    ))  # fmt: skip
    c, neg = check_invertible(), check_invertible(None)
    res.append(_out(
        "sma/invertible-needed", c,
        f"with a singular transition det A = {c.v['det']:.15g}, the blocks of A^-1 are the "
        f"transition products to {c.v['prod_err']:.1e} and the recurrence agrees to "
        f"{c.v['rec_err']:.1e}, while the generator form is off by {c.v['gen_err']:.3g}",
        f"det A = {c.v['det']:.6g}, products {c.v['prod_err']:.1e}, recurrence "
        f"{c.v['rec_err']:.1e}, generators {c.v['gen_err']:.3g}",
        f"with invertible transitions the generators agree ({neg.v['gen_err']:.1e}): nothing to "
        f"show, and the check says so",
    ))  # fmt: skip
    c, neg = check_kron_orderings(), check_kron_orderings(False)
    res.append(_out(
        "sma/kron-orderings", c,
        f"the perfect shuffle maps a kron I_n onto I_n kron a exactly (error "
        f"{c.v['perm_err']:g}) and both orderings' outputs agree to {c.v['y_err']:.1e}",
        f"shuffle error {c.v['perm_err']:g}, output error {c.v['y_err']:.1e}",
        f"without the shuffle the orderings differ by {neg.v['perm_err']:g}",
    ))  # fmt: skip
    c, neg = check_kron_inverse(), check_kron_inverse(True)
    res.append(_out(
        "sma/kron-inverse", c,
        f"(X kron Y)^-1 = X^-1 kron Y^-1 to {c.v['err']:.1e} and (I kron a)^-1 = I kron a^-1 "
        f"to {c.v['err_i']:.1e}",
        f"the inverses differ by {c.v['err']:.1e}",
        f"the swapped order is off by {neg.v['err']:.2g}",
    ))  # fmt: skip
    rnd = torch.tril(torch.randn(8, 8, generator=_gen(21), dtype=F64))
    c, neg = check_bidiagonal_inverse(), check_bidiagonal_inverse(rnd)
    res.append(_out(
        "sma/bidiagonal-semiseparable", c,
        f"the inverse matches a_s ... a_(t-1) to {c.v['err']:.1e} with lower-block ranks "
        f"{c.v['ranks']} (a_i > 0, and with a_3 = 0, where the generator form is "
        f"{'finite' if c.v['gen_finite'] else 'not finite'})",
        f"error {c.v['err']:.1e}, lower-block ranks {c.v['ranks']}",
        f"a random lower-triangular matrix has lower-block rank {neg.v['ranks'][0]}",
    ))  # fmt: skip
    c, neg = check_scalar_needed(), check_scalar_needed(False)
    m = c.v["masks"]
    res.append(_out(
        "sma/scalar-needed", c,
        f"the implied mask has lower-block rank {m['scalar'][0]} (sigma_2/sigma_1 "
        f"{m['scalar'][1]:.1e}) for scalar dynamics and sigma_2/sigma_1 = {m['per-state'][1]:.2g} "
        f"for per-state dynamics",
        f"scalar rank {m['scalar'][0]}, per-state sigma_2/sigma_1 {m['per-state'][1]:.1e}",
        f"equal per-state dynamics give sigma_2/sigma_1 = {neg.v['masks']['per-state'][1]:.1e}, "
        f"which it rejects",
    ))  # fmt: skip
    return dict(res)

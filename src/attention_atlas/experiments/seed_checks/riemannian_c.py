"""Float64 checks of the register's claims in ``attention_atlas.claims.riemannian_c`` (see the package
docstring): Sections 6 to 8 of the Riemannian-attention paper.

Every check takes the thing it checks as an argument (an instance, an implementation or a
penalty), so a test can hand it a wrong one and see it rejected; each returns a dict with
``passed`` and the numbers the outcome's sentences quote. :func:`outcomes` runs them all in
float64 on small fixed instances (well under a second) and computes every witness (a wrong
instance each check rejects) in the same run.

One idea: the register's exact checks of one part of one seed, each a small function beside
the sentence that reports it; splitting them would scatter a claim's check from its outcome.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode

from attention_atlas.attention.riemannian import (
    MetricNet,
    anti_flatness_loss,
    curvature_smoothness_loss,
    geodesic_scores,
    metric_diversity_loss,
    metric_preconditioned_update,
)
from attention_atlas.linalg import (
    lowrank_gram_distance_sq,
    lowrank_gram_distance_sq_dense,
    numerical_rank,
)
from attention_atlas.verdicts import Outcome, outcome_from_check

__all__ = [
    "ToyBlend",
    "a1_smoothness_check",
    "alibi_check",
    "anti_flatness_check",
    "blend_mismatch_check",
    "distance_dot_check",
    "diversity_cost_check",
    "diversity_homogeneous_check",
    "diversity_identity_check",
    "diversity_scaling_check",
    "euclidean_point_check",
    "gram_vs_metric_check",
    "kappa_homogeneous_check",
    "nonconvex_check",
    "outcomes",
    "precondition_check",
    "smoothness_check",
    "specific_input_check",
    "stochastic_product_check",
    "weight_decay_check",
]

DT = torch.float64
TOL = 1e-12  # relative tolerance of the float64 identities


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape: int, g: torch.Generator, scale: float = 1.0) -> Tensor:
    return scale * torch.randn(*shape, generator=g, dtype=DT)


def _orthogonal(n: int, g: torch.Generator) -> Tensor:
    """A random ``(n, n)`` orthogonal matrix (QR of a Gaussian)."""
    q, r = torch.linalg.qr(_randn(n, n, g=g))
    return q * torch.sign(torch.diagonal(r))


def _rel(a: Tensor, b: Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


# ---------------------------------------------------------------------------------------------
# Section 6.1: constant kappa_t is not a global metric
# ---------------------------------------------------------------------------------------------


def kappa_homogeneous_check(U: Tensor, *, seed: int = 0, tau: float = 1.0) -> dict[str, Any]:
    """Does a constant ``kappa_t = |U_t|_F^2`` make the score a global-metric one?

    ``U (L, d, r)`` with (near) equal ``kappa_t``. A global metric gives a score matrix of rank
    at most ``d + 2`` (``-(q^T g q - 2 q^T g k + k^T g k) / tau``); ``passed`` when the
    geodesic score of ``U`` on random ``q, k (L, d)`` has rank ``<= d + 2`` (numerical rank,
    relative tolerance 1e-9), as the seed's reading of Theorem 3.2 says."""
    seq, d, _ = U.shape
    g = _gen(seed)
    q, k = _randn(seq, d, g=g), _randn(seq, d, g=g)
    kappa = (U * U).sum((-1, -2))
    A = U @ U.transpose(-1, -2)
    spread = float((A - A[0]).flatten(1).norm(dim=-1).max())
    rank = int(numerical_rank(geodesic_scores(q, k, U, tau), rtol=1e-9))
    return {"passed": rank <= d + 2, "rank": rank, "bound": d + 2, "metric_spread": spread,
            "kappa_spread": float(kappa.max() - kappa.min()), "L": seq, "d": d}  # fmt: skip


def constant_kappa_factors(seq: int, d: int, kappa: float = 2.0) -> Tensor:
    """``U_t = sqrt(kappa) e_{t mod d}`` (rank 1): every ``kappa_t = kappa``, ``d`` different
    metrics. ``(seq, d, 1)``."""
    U = torch.zeros(seq, d, 1, dtype=DT)
    U[torch.arange(seq), torch.arange(seq) % d, 0] = math.sqrt(kappa)
    return U


# ---------------------------------------------------------------------------------------------
# Section 6.2: Proposition 6.2 on a toy blended-attention loss
# ---------------------------------------------------------------------------------------------


class ToyBlend:
    """A blended Riemannian attention loss ``L(W_Q, alpha)`` small enough for exact Newton.

    ``q = x W_Q`` (``W_Q (d, d)``), keys ``k``, values ``v`` and targets ``y`` fixed ``(L, d)``;
    the scores are eq. (27) with the distance baseline, ``S(alpha) = S(0) + alpha (S(1) -
    S(0))`` (:func:`geodesic_scores` at ``alpha`` 0 and 1: linear in ``alpha``), and
    ``L = |softmax(S) v - y|^2 + ridge |W_Q|^2``."""

    def __init__(self, U: Tensor, *, seed: int = 1, tau: float = 1.0, ridge: float = 0.1):
        seq, d, _ = U.shape
        g = _gen(seed)
        self.U, self.tau, self.ridge, self.d = U, tau, ridge, d
        self.x, self.k = _randn(seq, d, g=g), _randn(seq, d, g=g)
        self.v, self.y = _randn(seq, d, g=g), _randn(seq, d, g=g)

    def loss(self, z: Tensor) -> Tensor:
        """``z = (vec W_Q, alpha)``, ``(d^2 + 1,)`` -> scalar."""
        d = self.d
        q = self.x @ z[: d * d].view(d, d)
        s0 = geodesic_scores(q, self.k, self.U, self.tau, alpha=0.0)
        s1 = geodesic_scores(q, self.k, self.U, self.tau, alpha=1.0)
        s = s0 + z[-1] * (s1 - s0)
        out = torch.softmax(s, -1) @ self.v
        return ((out - self.y) ** 2).sum() + self.ridge * (z[: d * d] ** 2).sum()

    def at(self, w: Tensor, alpha: float) -> float:
        return float(self.loss(torch.cat([w, torch.tensor([alpha], dtype=DT)])))

    def hessian(self, w: Tensor, alpha: float) -> Tensor:
        """The Hessian in ``(vec W_Q, alpha)``, ``(d^2 + 1, d^2 + 1)``."""
        z = torch.cat([w, torch.tensor([alpha], dtype=DT)])
        return torch.autograd.functional.hessian(self.loss, z, vectorize=True)

    def grad(self, w: Tensor, alpha: float) -> Tensor:
        z = torch.cat([w, torch.tensor([alpha], dtype=DT)]).requires_grad_(True)
        (gz,) = torch.autograd.grad(self.loss(z), z)
        return gz

    def minimiser(self, alpha: float, w0: Tensor | None = None) -> Tensor:
        """A strict local minimiser of ``L(., alpha)`` by damped Newton, ``(d^2,)``."""
        n = self.d * self.d
        w = torch.zeros(n, dtype=DT) if w0 is None else w0.clone()
        for _ in range(60):
            gr = self.grad(w, alpha)[:n]
            if float(gr.norm()) < 1e-13:
                break
            H = self.hessian(w, alpha)[:n, :n]
            lam = float(torch.linalg.eigvalsh(H)[0])
            step = torch.linalg.solve(H + max(0.0, 1e-3 - lam) * torch.eye(n, dtype=DT), gr)
            t, base = 1.0, self.at(w, alpha)
            while self.at(w - t * step, alpha) > base + 1e-15 and t > 1e-8:
                t /= 2
            w = w - t * step
        return w


def blend_mismatch_check(toy: ToyBlend, alpha_train: float = 0.5,
                         deltas: tuple[float, ...] = (1e-2, -1e-2, 1e-3, -1e-3)) -> dict[str, Any]:  # fmt: skip
    """Proposition 6.2 and eq. (30) on ``toy``.

    At ``W* = W*(alpha_train)``: ``H`` (the ``W_Q`` Hessian), ``c`` (the cross-derivative),
    the implicit-function slope ``-H^{-1} c`` against the central difference of re-solved
    minimisers (``eq30_error``, relative), the gaps ``L(W*, a) - L(W*(a), a)`` at
    ``a = alpha_train + delta`` (eq. (29): all positive) and the first-order change
    ``dL/dalpha`` at ``W*`` (the remark: some mismatch lowers the loss)."""
    n = toy.d * toy.d
    w = toy.minimiser(alpha_train)
    Hz = toy.hessian(w, alpha_train)
    H, c = Hz[:n, :n], Hz[:n, n]
    h_min = float(torch.linalg.eigvalsh(H)[0])
    slope = -torch.linalg.solve(H, c)
    eps = 1e-5
    fd = (toy.minimiser(alpha_train + eps, w) - toy.minimiser(alpha_train - eps, w)) / (2 * eps)
    eq30 = float((fd - slope).norm() / slope.norm().clamp_min(1e-300))
    eq30_wrong = float((fd + slope).norm() / slope.norm().clamp_min(1e-300))  # +H^-1 c
    gaps, predicted = [], []
    for dl in deltas:
        a = alpha_train + dl
        gaps.append(toy.at(w, a) - toy.at(toy.minimiser(a, w), a))
        predicted.append(0.5 * dl * dl * float(c @ torch.linalg.solve(H, c)))
    d_alpha = float(toy.grad(w, alpha_train)[n])
    step = -math.copysign(1e-2, d_alpha) if d_alpha != 0 else 1e-2
    lowered = toy.at(w, alpha_train + step) - toy.at(w, alpha_train)
    return {"h_min": h_min, "c_norm": float(c.norm()), "eq30_error": eq30,
            "eq30_wrong_sign": eq30_wrong, "gaps": gaps,
            "predicted": predicted, "deltas": list(deltas), "d_alpha": d_alpha,
            "lowered": lowered, "step": step, "grad_norm": float(toy.grad(w, alpha_train)[:n].norm())}  # fmt: skip


def nonconvex_check(loss: Callable[[Tensor], Tensor], n: int, *, seed: int = 2,
                    draws: int = 8, scale: float = 2.0) -> dict[str, Any]:  # fmt: skip
    """Is ``loss`` (of an ``(n,)`` vector) non-convex? The smallest Hessian eigenvalue over
    ``draws`` random points ``N(0, scale^2)``: ``passed`` (non-convex) when one is below
    ``-1e-8`` (a convex function has a positive-semidefinite Hessian everywhere)."""
    g = _gen(seed)
    worst = math.inf
    for _ in range(draws):
        z = _randn(n, g=g, scale=scale)
        worst = min(
            worst, float(torch.linalg.eigvalsh(torch.autograd.functional.hessian(loss, z))[0])
        )
    return {"passed": worst < -1e-8, "min_eig": worst, "draws": draws}


def a1_smoothness_check(loss: Callable[[Tensor], Tensor], at: float, *, h: float = 1e-4) -> dict[str, Any]:  # fmt: skip
    """Is the scalar ``loss`` twice continuously differentiable at ``at``? One-sided second
    differences on each side of ``at`` (step ``h``) and the first-derivative jump: ``passed``
    (C^2 there) when the second differences agree within ``1e-3`` relative and the first
    derivative is continuous."""
    x = torch.tensor([at - 2 * h, at - h, at, at + h, at + 2 * h], dtype=DT)
    f = torch.stack([loss(v) for v in x])
    left = float((f[0] - 2 * f[1] + f[2]) / h**2)
    right = float((f[2] - 2 * f[3] + f[4]) / h**2)
    d_left, d_right = float((f[2] - f[1]) / h), float((f[3] - f[2]) / h)
    smooth = abs(left - right) <= 1e-3 * max(1.0, abs(left), abs(right))
    return {"passed": smooth and abs(d_left - d_right) <= 10 * h * max(1.0, abs(left), abs(right)),
            "left": left, "right": right, "jump": right - left}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Section 6.3: the Euclidean point U = 0
# ---------------------------------------------------------------------------------------------


def distance_dot_check(q: Tensor, k: Tensor, tau: float = 1.0) -> dict[str, Any]:
    """At ``U = 0`` the geodesic score is ``-|q_i - k_j|^2 / tau``; its softmax against the
    dot-product attention ``softmax(2 q k^T / tau)``. ``q, k (L, d)``. ``passed`` when the score
    is the Euclidean distance (``TOL``) and the two attention matrices agree within ``TOL``
    (they must, when every key has the same norm)."""
    seq, d = q.shape
    U0 = torch.zeros(seq, d, 1, dtype=DT)
    s = geodesic_scores(q, k, U0, tau)
    dist = -((q[:, None] - k[None]) ** 2).sum(-1) / tau
    a_dist, a_dot = torch.softmax(s, -1), torch.softmax(2 * q @ k.T / tau, -1)
    diff = float((a_dist - a_dot).abs().max())
    norms = k.norm(dim=-1)
    return {"passed": _rel(s, dist) <= TOL and diff <= TOL, "score_error": _rel(s, dist),
            "attention_diff": diff, "norm_spread": float(norms.max() - norms.min())}  # fmt: skip


def euclidean_point_check(*, l2: float = 0.0, seed: int = 3, seq: int = 4, d: int = 2,
                          r: int = 1, tau: float = 1.0) -> dict[str, Any]:  # fmt: skip
    """Is ``U = 0`` (the Euclidean Transformer) a local minimum of a Riemannian attention loss?

    The toy of :class:`ToyBlend` at ``alpha = 1`` (pure geodesic scores), with ``W_Q`` first
    trained to the Euclidean optimum (``U = 0``) and the metric factors ``U (L, d, r)`` free,
    plus ``l2 |U|^2``. At ``(W*, U = 0)``: the gradient in ``U``, the cross block
    ``d^2 L / dW dU`` and the eigenvalues of ``d^2 L / dU^2``, with the second difference of
    the loss along the eigenvector of the smallest one as an independent check. ``passed``
    when ``U = 0`` is a local minimum (smallest eigenvalue ``>= -1e-10``)."""
    toy = ToyBlend(torch.zeros(seq, d, r, dtype=DT), seed=seed, tau=tau)
    n = d * d
    w = toy.minimiser(0.0)

    def joint(z: Tensor) -> Tensor:
        q = toy.x @ z[:n].view(d, d)
        U = z[n:].view(seq, d, r)
        out = torch.softmax(geodesic_scores(q, toy.k, U, tau), -1) @ toy.v
        return ((out - toy.y) ** 2).sum() + toy.ridge * (z[:n] ** 2).sum() + l2 * (z[n:] ** 2).sum()

    z0 = torch.cat([w, torch.zeros(seq * d * r, dtype=DT)]).requires_grad_(True)
    (gz,) = torch.autograd.grad(joint(z0), z0)
    Hz = torch.autograd.functional.hessian(joint, z0.detach())
    huu = Hz[n:, n:]
    eig, vec = torch.linalg.eigh(huu)
    e = vec[:, 0]
    h = 1e-4
    z = z0.detach()
    pad = torch.cat([torch.zeros(n, dtype=DT), e])
    second = float((joint(z + h * pad) + joint(z - h * pad) - 2 * joint(z)) / h**2)
    return {"passed": float(eig[0]) >= -1e-10, "min_eig": float(eig[0]), "max_eig": float(eig[-1]),
            "grad_u": float(gz[n:].abs().max()), "grad_w": float(gz[:n].abs().max()),
            "cross": float(Hz[:n, n:].abs().max()), "second_difference": second, "l2": l2}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Section 6.4: the regularisers (31) to (34)
# ---------------------------------------------------------------------------------------------


def anti_flatness_check(U: Tensor, kappa_min: float,
                        loss: Callable[[Tensor, float], Tensor] = anti_flatness_loss) -> dict[str, Any]:  # fmt: skip
    """Eq. (31) as implemented (``loss``) against ``mean_t ReLU(kappa_min - |U_t|_F^2)``, on
    ``U (L, d, r)`` and on ``U`` rescaled so every ``kappa_t`` is above the floor (it must
    vanish there), and its gradient at ``U_t = 0`` (the exactly collapsed metric)."""
    kappa = (U * U).sum((-1, -2))
    ref = torch.relu(kappa_min - kappa).mean()
    err = abs(float(loss(U, kappa_min) - ref)) / max(float(ref), 1e-300)
    above = U * math.sqrt(2 * kappa_min / float(kappa.min()))
    at_floor = float(loss(above, kappa_min))
    z = torch.zeros_like(U).requires_grad_(True)
    (gz,) = torch.autograd.grad(loss(z, kappa_min), z)
    below = float(ref) > 0
    return {"passed": err <= TOL and at_floor == 0.0 and below, "error": err,
            "above": at_floor, "value": float(ref), "grad_at_zero": float(gz.abs().max()),
            "value_at_zero": float(loss(torch.zeros_like(U), kappa_min))}  # fmt: skip


def diversity_identity_check(Ui: Tensor, Uj: Tensor,
                             dist: Callable[[Tensor, Tensor], Tensor] = lowrank_gram_distance_sq) -> dict[str, Any]:  # fmt: skip
    """The identity of Section 6.4, ``|A_i - A_j|_F^2 = |U_i^T U_i|^2 - 2 |U_i^T U_j|^2 +
    |U_j^T U_j|^2`` (``dist``), against the materialised ``d x d`` difference, on batches
    ``Ui, Uj (..., d, r)``: the largest relative error."""
    err = _rel(dist(Ui, Uj), lowrank_gram_distance_sq_dense(Ui, Uj))
    return {"passed": err <= TOL, "error": err}


def diversity_cost_check(sizes: tuple[tuple[int, int], ...] = ((8, 2), (16, 4), (64, 3), (128, 8)),
                         dist: Callable[[Tensor, Tensor], Tensor] = lowrank_gram_distance_sq) -> dict[str, Any]:  # fmt: skip
    """Matrix-product FLOPs of one pair's distance (``dist``), counted by torch's
    ``FlopCounterMode``, against ``6 r^2 d`` (three ``r x r`` Gram products of ``2 r^2 d``):
    ``passed`` when every count is exactly that."""
    counts, dense = [], []
    for d, r in sizes:
        ui, uj = torch.ones(d, r, dtype=DT), torch.ones(d, r, dtype=DT)
        with FlopCounterMode(display=False) as fc:
            dist(ui, uj)
        counts.append(int(fc.get_total_flops()))
        with FlopCounterMode(display=False) as fd:
            lowrank_gram_distance_sq_dense(ui, uj)
        dense.append(int(fd.get_total_flops()))
    want = [6 * r * r * d for d, r in sizes]
    return {"passed": counts == want, "counts": counts, "want": want, "dense": dense,
            "sizes": list(sizes)}  # fmt: skip


def gram_vs_metric_check(Ui: Tensor, Q: Tensor) -> dict[str, Any]:
    """Section 6.4's reason for ``U U^T``: ``U_j = Q U_i`` with ``Q (d, d)`` orthogonal has the
    same ``U^T U`` but (for ``Q`` that moves the column space) another metric. ``passed`` when
    the column Grams agree (``TOL``) and the metrics differ by more than 1e-6 relative."""
    Uj = Q @ Ui
    gram_err = _rel(Uj.T @ Uj, Ui.T @ Ui)
    metric_gap = float(lowrank_gram_distance_sq(Ui, Uj)) / float((Ui.T @ Ui).square().sum())
    return {"passed": gram_err <= TOL and metric_gap > 1e-6, "gram_error": gram_err,
            "metric_gap": metric_gap}  # fmt: skip


def homogeneous_factors(seq: int, d: int, r: int, *, seed: int = 4) -> Tensor:
    """``U_t = U_0 R_t`` with random orthogonal ``R_t (r, r)``: different factors, one metric
    ``U_0 U_0^T``. ``(seq, d, r)``."""
    g = _gen(seed)
    u0 = _randn(d, r, g=g)
    return torch.stack([u0 @ _orthogonal(r, g) for _ in range(seq)])


def diversity_homogeneous_check(U_hom: Tensor, U_het: Tensor,
                                loss: Callable[[Tensor], Tensor] = metric_diversity_loss) -> dict[str, Any]:  # fmt: skip
    """Eq. (32) (``loss``): zero on a homogeneous metric ``U_hom (L, d, r)`` (relative to its
    scale ``|A|_F^2``), negative on a heterogeneous ``U_het``, and equal there to the mean over
    ordered pairs ``i != j`` of the materialised ``-|A_i - A_j|_F^2``."""
    seq = U_het.shape[0]
    A = U_het @ U_het.transpose(-1, -2)
    D = ((A[:, None] - A[None]) ** 2).sum((-1, -2))
    ref = -D.sum() / (seq * (seq - 1))
    err = abs(float(loss(U_het) - ref)) / abs(float(ref))
    scale = float((U_hom[0] @ U_hom[0].T).square().sum())
    hom = abs(float(loss(U_hom))) / scale
    return {"passed": err <= TOL and hom <= TOL and float(loss(U_het)) < 0, "error": err,
            "homogeneous": hom, "value": float(ref)}  # fmt: skip


def diversity_scaling_check(U: Tensor, loss: Callable[[Tensor], Tensor] = metric_diversity_loss,
                            lams: tuple[float, ...] = (0.5, 2.0, 10.0, 100.0)) -> dict[str, Any]:  # fmt: skip
    """Eq. (32) along ``lam U``: ``passed`` when ``L_div(lam U) = lam^4 L_div(U)`` (``TOL``,
    relative) with ``L_div(U) < 0``, i.e. unbounded below as ``|U_t|_F^2`` grows."""
    base = float(loss(U))
    errs = [abs(float(loss(lam * U)) - lam**4 * base) / abs(lam**4 * base) for lam in lams]
    return {"passed": base < 0 and max(errs) <= TOL, "error": max(errs), "base": base,
            "at_top": float(loss(lams[-1] * U)), "top": lams[-1]}  # fmt: skip


def smoothness_check(U: Tensor, loss: Callable[[Tensor], Tensor] = curvature_smoothness_loss) -> dict[str, Any]:  # fmt: skip
    """Eq. (33) (``loss``) against the materialised ``mean_t |A_t - A_{t+1}|_F^2`` on
    ``U (L, d, r)``, and zero on a sequence whose adjacent metrics agree."""
    A = U @ U.transpose(-1, -2)
    ref = ((A[:-1] - A[1:]) ** 2).sum((-1, -2)).mean()
    err = abs(float(loss(U) - ref)) / float(ref)
    seq, d, r = U.shape
    hom = homogeneous_factors(seq, d, r)
    flat = abs(float(loss(hom))) / float((hom[0] @ hom[0].T).square().sum())
    return {"passed": err <= TOL and flat <= TOL, "error": err, "flat": flat, "value": float(ref)}


def weight_decay_check(penalty: Callable[[MetricNet], Tensor] | None = None, *, seed: int = 5,
                       lams: tuple[float, ...] = (1.0, 10.0, 100.0, 1000.0)) -> dict[str, Any]:  # fmt: skip
    """Does weight decay on MetricNet bound the metric against eq. (32)? A float64 MetricNet
    ``(D, H, d, r) = (8, 1, 4, 2)``, its last layer (weight and bias) scaled by ``lam`` (which
    scales ``U`` by ``lam``: checked), and ``L_div(U) + penalty(net)`` (default: weight decay
    ``sum |theta|^2``) at each scale: ``passed`` (bounded) when the sum at the largest scale is
    no lower than at ``lam = 1``."""
    torch.manual_seed(seed)
    net = MetricNet(8, 1, 4, rank=2, init_std=1.0).to(DT)
    x = _randn(1, 6, 8, g=_gen(seed))

    def decay(m: MetricNet) -> Tensor:
        return torch.stack([(p * p).sum() for p in m.parameters()]).sum()

    pen = penalty or decay
    w0, b0 = net.fc2.weight.detach().clone(), net.fc2.bias.detach().clone()
    u1 = net(x)
    totals, scale_err = [], 0.0
    with torch.no_grad():
        for lam in lams:
            net.fc2.weight.copy_(lam * w0)
            net.fc2.bias.copy_(lam * b0)
            U = net(x)
            scale_err = max(scale_err, _rel(U, lam * u1))
            totals.append(float(metric_diversity_loss(U) + pen(net)))
        net.fc2.weight.copy_(w0)
        net.fc2.bias.copy_(b0)
    return {"passed": totals[-1] >= totals[0], "totals": totals, "lams": list(lams),
            "scale_error": scale_err}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Sections 7 and 8
# ---------------------------------------------------------------------------------------------


def alibi_check(q: Tensor, k: Tensor, U: Tensor, *, seed: int = 6, tau: float = 1.0) -> dict[str, Any]:  # fmt: skip
    """``Delta S = S(U) - S(0)`` (eq. (11)) as a bias on the scores: is it content-dependent
    (changes when ``q, k`` are redrawn, positions fixed, unlike an ALiBi bias ``-m |i - j|``)
    and pair-dependent (the double-centred ``J Delta S J`` is not zero, so it is no sum of a
    per-query and a per-key term)? ``q, k (L, d)``, ``U (L, d, r)``; relative sizes."""
    seq, d = q.shape
    zero = torch.zeros_like(U)
    ds = geodesic_scores(q, k, U, tau) - geodesic_scores(q, k, zero, tau)
    g = _gen(seed)
    q2, k2 = _randn(seq, d, g=g), _randn(seq, d, g=g)
    ds2 = geodesic_scores(q2, k2, U, tau) - geodesic_scores(q2, k2, zero, tau)
    J = torch.eye(seq, dtype=DT) - 1.0 / seq
    size = float(ds.norm().clamp_min(1e-300))
    pair = float((J @ ds @ J).norm()) / size
    content = float((ds2 - ds).norm()) / size
    pos = torch.arange(seq, dtype=DT)
    alibi = -(pos[:, None] - pos[None]).abs()
    alibi_pair = float((J @ alibi @ J).norm() / alibi.norm())
    return {"passed": float(ds.norm()) > 0 and pair > 1e-6 and content > 1e-6, "pair": pair,
            "content": content, "alibi_pair": alibi_pair}  # fmt: skip


def precondition_check(U: Tensor, apply: Callable[[Tensor, Tensor, Tensor], Tensor] =
                       metric_preconditioned_update, *, seed: int = 7, draws: int = 64) -> dict[str, Any]:  # fmt: skip
    """Section 8.3: ``g^{-1}`` with ``g = I + U U^T`` never amplifies. ``apply(h, U, v)`` is the
    update ``h + g^{-1} v`` (eq. (26)); with ``h = 0``, the largest ``|g^{-1} v| / |v|`` over
    ``draws`` random ``v`` and over the eigenvectors of ``g`` (``passed`` when ``<= 1 + TOL``),
    the change of a ``v`` orthogonal to ``U``'s columns (untouched: ``TOL``), and the smallest
    eigenvalue of ``I + U U^T - V V^T`` for a random ``V`` (the alternative the text names)."""
    d, r = U.shape
    g = _gen(seed)
    vs = torch.cat(
        [_randn(draws, d, g=g), torch.linalg.eigh(torch.eye(d, dtype=DT) + U @ U.T)[1].T]
    )
    out = apply(torch.zeros_like(vs), U.expand(vs.shape[0], d, r), vs)
    ratio = float((out.norm(dim=-1) / vs.norm(dim=-1)).max())
    basis = torch.linalg.qr(U, mode="complete")[0][:, r:]
    perp = basis @ _randn(d - r, g=g)
    moved = float((apply(torch.zeros(d, dtype=DT), U, perp) - perp).norm() / perp.norm())
    V = _randn(d, r, g=g)
    alt = float(torch.linalg.eigvalsh(torch.eye(d, dtype=DT) + U @ U.T - V @ V.T)[0])
    return {"passed": ratio <= 1 + TOL and moved <= TOL, "ratio": ratio, "moved": moved,
            "alt_min": alt, "min_shrink": float((out.norm(dim=-1) / vs.norm(dim=-1)).min())}  # fmt: skip


def specific_input_check(S: Tensor, width: int) -> dict[str, Any]:
    """Section 8.3: an ``(L, L)`` score matrix ``S`` has an exact factorisation
    ``S = Phi Psi^T`` of ``width`` (truncated SVD): its relative residual (``passed`` when
    ``<= 1e-10``) and the numerical rank."""
    u, s, vh = torch.linalg.svd(S)
    approx = (u[:, :width] * s[:width]) @ vh[:width]
    res = float((approx - S).norm() / S.norm())
    return {"passed": res <= 1e-10, "residual": res, "rank": int(numerical_rank(S, rtol=1e-9))}


def dobrushin(P: Tensor) -> float:
    """Dobrushin's ergodicity coefficient ``1 - min_{i, i'} sum_j min(P_ij, P_i'j)`` of a
    row-stochastic ``P (L, L)``: 0 exactly when every row is the same (rank one)."""
    return float(1 - torch.minimum(P[:, None], P[None]).sum(-1).min())


def stochastic_product_check(mats: list[Tensor], tol: float = 1e-8) -> dict[str, Any]:
    """Products of row-stochastic matrices ``mats`` (each ``(L, L)``): the Dobrushin
    coefficient of the product (``passed`` (converged to rank one) when below ``tol``), its
    sub-multiplicative bound ``prod_l delta(P_l)`` (Seneta 2006, Theorem 3.1) and the rows'
    largest deviation from row-stochastic."""
    prod = torch.eye(mats[0].shape[0], dtype=DT)
    for P in mats:
        prod = P @ prod
    bound = math.prod(dobrushin(P) for P in mats)
    stoch = max(float((P.sum(-1) - 1).abs().max()) for P in mats)
    delta = dobrushin(prod)
    return {"passed": delta <= tol, "delta": delta, "bound": bound, "stochastic": stoch,
            "bound_holds": delta <= bound + 1e-12, "depth": len(mats)}  # fmt: skip


def softmax_stack(depth: int, seq: int, *, growth: float = 0.0, seed: int = 8) -> list[Tensor]:
    """``depth`` softmax attention matrices ``(seq, seq)``: random ``N(0, 1)`` scores
    (``growth = 0``), or diagonal scores ``growth (l + 1)^2`` at layer ``l`` (entries off the
    diagonal go to zero along the stack)."""
    g = _gen(seed)
    if growth == 0.0:
        return [torch.softmax(_randn(seq, seq, g=g), -1) for _ in range(depth)]
    eye = torch.eye(seq, dtype=DT)
    return [torch.softmax(growth * (layer + 1) ** 2 * eye, -1) for layer in range(depth)]


# ---------------------------------------------------------------------------------------------
# the outcomes
# ---------------------------------------------------------------------------------------------


def _huber(x: Tensor) -> Tensor:
    return F.smooth_l1_loss(x, torch.zeros_like(x), beta=1.0)


def outcomes(smoke: bool = False) -> dict[str, Outcome]:
    """The outcome of every claim of ``attention_atlas.claims.riemannian_c`` that this module
    checks (``smoke``: the same sizes; every check is already toy-sized). Runs on one CPU
    thread (restored after): the matrices are a few entries wide, and on a busy machine
    thread hand-offs cost twenty times the arithmetic."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _outcomes()
    finally:
        torch.set_num_threads(threads)


def _outcomes() -> dict[str, Outcome]:
    """:func:`outcomes`, on the current threads."""
    out: dict[str, Outcome] = {}
    g = _gen(0)

    # -- 6.1: constant kappa is not a global metric
    seq, d = 12, 3
    kh = kappa_homogeneous_check(constant_kappa_factors(seq, d))
    shared = constant_kappa_factors(seq, d)[:1].expand(seq, d, 1).contiguous()
    kh_ctrl = kappa_homogeneous_check(shared)
    out["riemannian/kappa-homogeneous"] = outcome_from_check(
        kh["passed"],
        f"constant kappa_t gives a score matrix of rank {kh['rank']} <= d + 2 = {kh['bound']}",
        f"U_t = sqrt(2) e_(t mod {d}) has every kappa_t equal (spread {kh['kappa_spread']:.1e}) "
        f"but {d} different metrics (largest |A_t - A_0|_F = {kh['metric_spread']:.3g}); its "
        f"({seq}, {seq}) score matrix has rank {kh['rank']}, above the {kh['bound']} of any "
        "global metric: equal kappa_t is not a global metric",
        witness=f"the same check on one shared metric finds rank {kh_ctrl['rank']} <= "
        f"{kh_ctrl['bound']} and would have supported the claim",
    )

    # -- 6.2: Proposition 6.2 on the toy blended loss
    Ut = _randn(5, 2, 1, g=_gen(11), scale=0.8)
    bm = blend_mismatch_check(ToyBlend(Ut))
    bm0 = blend_mismatch_check(ToyBlend(torch.zeros(5, 2, 1, dtype=DT)))
    gap_txt = ", ".join(f"{x:.3g}" for x in bm["gaps"])
    ok62 = bm["h_min"] > 0 and bm["c_norm"] > 1e-8 and min(bm["gaps"]) > 0
    out["riemannian/prop-6.2"] = outcome_from_check(
        ok62,
        f"on a toy blended attention loss (W_Q 2 x 2, L = 5, alpha_train = 0.5; smallest Hessian "
        f"eigenvalue {bm['h_min']:.3g}, |c| = {bm['c_norm']:.3g}) the gaps L(W*(a_t), a) - "
        f"L(W*(a), a) at a - a_t = {bm['deltas']} are {gap_txt}: all positive",
        f"on the toy blended loss (smallest Hessian eigenvalue {bm['h_min']:.3g}, |c| = "
        f"{bm['c_norm']:.3g}) the gaps are {gap_txt}: not all positive",
        witness=f"the gaps match 0.5 delta^2 c^T H^-1 c ({bm['predicted'][0]:.3g} at delta = "
        f"{bm['deltas'][0]}); with U = 0 (c = {bm0['c_norm']:.1e}) the largest gap is "
        f"{max(abs(x) for x in bm0['gaps']):.1e}, which the check rejects",
    )
    out["riemannian/eq-30"] = outcome_from_check(
        bm["eq30_error"] <= 1e-6,
        f"-H^-1 c matches the central difference of re-solved minimisers (step 1e-5) to "
        f"{bm['eq30_error']:.1e} relative",
        f"-H^-1 c differs from the central difference of re-solved minimisers by "
        f"{bm['eq30_error']:.3g} relative",
        witness=f"the opposite sign, +H^-1 c, is off by {bm['eq30_wrong_sign']:.3g} relative "
        f"(|c| = {bm['c_norm']:.3g}), which the check rejects",
    )
    ok_a3 = bm0["c_norm"] <= 1e-12 and max(abs(x) for x in bm0["gaps"]) <= 1e-12
    out["riemannian/prop-6.2-a3"] = outcome_from_check(
        ok_a3,
        f"with Delta s^geo = 0 (U = 0) the cross-derivative is |c| = {bm0['c_norm']:.1e} and "
        f"retraining at another alpha gains at most {max(abs(x) for x in bm0['gaps']):.1e}",
        f"with Delta s^geo = 0 the cross-derivative is |c| = {bm0['c_norm']:.3g}",
        witness=f"with U != 0 the same check finds |c| = {bm['c_norm']:.3g} and gaps up to "
        f"{max(bm['gaps']):.3g}, which it rejects",
    )
    out["riemannian/prop-6.2-lower"] = outcome_from_check(
        bm["lowered"] < 0,
        f"evaluating W*(0.5) at alpha = {0.5 + bm['step']:.3g} instead of 0.5 changes its loss by "
        f"{bm['lowered']:.3g} (dL/dalpha = {bm['d_alpha']:.3g}): a mismatched alpha can lower "
        "the loss, so only the comparison with retraining is signed",
        f"no mismatched alpha lowered the loss (change {bm['lowered']:.3g})",
        witness=f"with U = 0 the loss does not depend on alpha (change {bm0['lowered']:.1e}), and "
        "the check rejects that instance",
    )
    toy_nc = ToyBlend(Ut, ridge=0.0)
    nc = nonconvex_check(lambda z: toy_nc.loss(torch.cat([z, torch.tensor([0.5], dtype=DT)])), 4)
    quad = nonconvex_check(lambda z: (z * z).sum(), 4)
    out["riemannian/nonconvex-wq"] = outcome_from_check(
        nc["passed"],
        f"the toy attention loss has a Hessian eigenvalue {nc['min_eig']:.3g} < 0 in W_Q at one "
        f"of {nc['draws']} random points: not convex",
        f"every Hessian eigenvalue at {nc['draws']} random points is >= {nc['min_eig']:.3g}",
        witness=f"on the convex |W|^2 the same check finds smallest eigenvalue {quad['min_eig']:.3g} "
        "and rejects it",
    )
    hub = a1_smoothness_check(_huber, 1.0)
    mse = a1_smoothness_check(lambda x: x * x, 1.0)
    out["riemannian/a1-differentiable"] = outcome_from_check(
        hub["passed"],
        "the Huber loss is twice continuously differentiable at its knot",
        f"the Huber (smooth-L1) loss is differentiable but its second derivative jumps from "
        f"{hub['left']:.3g} to {hub['right']:.3g} at the knot |x| = 1: a differentiable loss that "
        "breaks (a1)",
        witness=f"on x^2 the one-sided second differences agree ({mse['left']:.6g} and "
        f"{mse['right']:.6g}) and the check accepts it",
    )

    # -- 6.3: the Euclidean point
    q, k = _randn(6, 3, g=g), _randn(6, 3, g=g)
    k_eq = k / k.norm(dim=-1, keepdim=True) * 1.3
    dd = distance_dot_check(q, k_eq)
    dd_bad = distance_dot_check(q, k)
    out["riemannian/conj-6.3-distance-dot"] = outcome_from_check(
        dd["passed"] and not dd_bad["passed"],
        f"at U = 0 the score is -|q - k|^2 / tau (error {dd['score_error']:.1e}); with equal key "
        f"norms its softmax equals softmax(2 q k^T / tau) to {dd['attention_diff']:.1e}; with key "
        f"norms spread by {dd_bad['norm_spread']:.3g} they differ by {dd_bad['attention_diff']:.3g}",
        f"distance attention at U = 0 against dot-product attention: {dd['attention_diff']:.3g} "
        f"apart with equal key norms, {dd_bad['attention_diff']:.3g} with unequal ones",
        witness=f"unequal key norms move the attention by {dd_bad['attention_diff']:.3g}, "
        f"{dd_bad['attention_diff'] / TOL:.1e} times the tolerance",
    )
    ep = euclidean_point_check()
    ep_l2 = euclidean_point_check(l2=1.0 + abs(ep["min_eig"]))
    out["riemannian/euclidean-saddle"] = outcome_from_check(
        ep["passed"],
        f"U = 0 is a local minimum (smallest Hessian eigenvalue {ep['min_eig']:.3g})",
        f"at the Euclidean optimum (W_Q trained, |dL/dW| = {ep['grad_w']:.1e}) of a toy attention "
        f"loss, U = 0 is stationary (|dL/dU| = {ep['grad_u']:.1e}, cross block "
        f"{ep['cross']:.1e}) but a saddle: the U-Hessian has eigenvalues from {ep['min_eig']:.3g} "
        f"to {ep['max_eig']:.3g} (second difference along the lowest: "
        f"{ep['second_difference']:.3g}); gradient descent started exactly at U = 0 stays, but "
        "not because it is a local minimum",
        witness=f"with an l2 penalty {ep_l2['l2']:.3g} |U|^2 (the 'standard regularization' of "
        f"Conjecture 6.3) the smallest eigenvalue is {ep_l2['min_eig']:.3g} and the check "
        "accepts U = 0 as a local minimum",
    )
    out["riemannian/O2-nonconvex"] = outcome_from_check(
        ep["min_eig"] < -1e-8,
        f"the loss is not convex in U_t: its Hessian at U = 0 has eigenvalues "
        f"{ep['min_eig']:.3g} and {ep['max_eig']:.3g} (a convex function's is positive "
        "semidefinite)",
        f"the Hessian in U at U = 0 is positive semidefinite (smallest {ep['min_eig']:.3g})",
        witness=f"adding {ep_l2['l2']:.3g} |U|^2 makes it positive definite (smallest "
        f"{ep_l2['min_eig']:.3g}), which the check would not count as non-convex",
    )

    # -- 6.4: the regularisers
    U = _randn(10, 4, 2, g=g, scale=0.5)
    af = anti_flatness_check(U, 2.0)
    af_bad = anti_flatness_check(
        U, 2.0, loss=lambda u, m: torch.relu(m - u.norm(dim=(-1, -2))).mean()
    )
    out["riemannian/eq-31"] = outcome_from_check(
        af["passed"],
        f"eq. (31) matches mean_t ReLU(kappa_min - kappa_t) to {af['error']:.1e}, is "
        f"{af['above']:g} once every kappa_t >= kappa_min and positive ({af['value']:.3g}) "
        f"below; holds generically; fails for U_t = 0 exactly, where the penalty is at its "
        f"largest ({af['value_at_zero']:.3g}) but its gradient is {af['grad_at_zero']:g}, so it "
        "cannot lift an exactly collapsed metric",
        f"eq. (31) as implemented is off by {af['error']:.3g} or does not vanish above the floor "
        f"({af['above']:.3g})",
        witness=f"an unsquared floor ReLU(kappa_min - |U_t|_F) is off by {af_bad['error']:.3g}, "
        "which the check rejects",
    )
    Ui, Uj = _randn(16, 8, 3, g=g), _randn(16, 8, 3, g=g)
    di = diversity_identity_check(Ui, Uj)
    di_bad = diversity_identity_check(Ui, Uj, dist=lambda a, b: (
        (a.mT @ a).square().sum((-1, -2)) - (a.mT @ b).square().sum((-1, -2))
        + (b.mT @ b).square().sum((-1, -2))))  # fmt: skip
    out["riemannian/eq-32-identity"] = outcome_from_check(
        di["passed"],
        f"|A_i - A_j|_F^2 by the r x r identity matches the materialised d x d difference to "
        f"{di['error']:.1e} (16 pairs, d = 8, r = 3)",
        f"the identity is off by {di['error']:.3g} relative",
        witness=f"the identity with -1 instead of -2 is off by {di_bad['error']:.3g}",
    )
    dc = diversity_cost_check()
    out["riemannian/eq-32-cost"] = outcome_from_check(
        dc["passed"],
        f"the library's pair distance costs exactly 6 r^2 d matrix-product FLOPs at (d, r) = "
        f"{dc['sizes']} ({dc['counts']}), against {dc['dense']} for the materialised d x d form",
        f"counted FLOPs {dc['counts']} differ from 6 r^2 d = {dc['want']}",
        witness=f"the materialised form's counts {dc['dense']} are not 6 r^2 d and the check "
        "rejects them",
    )
    Ug = _randn(6, 2, g=g)
    gm = gram_vs_metric_check(Ug, _orthogonal(6, g))
    gm_id = gram_vs_metric_check(Ug, torch.eye(6, dtype=DT))
    out["riemannian/eq-32-gram"] = outcome_from_check(
        gm["passed"],
        f"U_j = Q U_i (Q orthogonal) has U_j^T U_j = U_i^T U_i (error {gm['gram_error']:.1e}) but "
        f"|A_i - A_j|_F^2 = {gm['metric_gap']:.3g} |U_i^T U_i|_F^2: another metric",
        f"equal column Grams gave equal metrics (gap {gm['metric_gap']:.3g})",
        witness=f"with Q = I the metrics agree (gap {gm_id['metric_gap']:.1e}) and the check "
        "rejects the instance",
    )
    Uh, Uhet = homogeneous_factors(8, 5, 2), _randn(8, 5, 2, g=g)
    dh = diversity_homogeneous_check(Uh, Uhet)
    factor_div = lambda u: -((u[:, None] - u[None]) ** 2).sum() / (u.shape[0] * (u.shape[0] - 1))  # noqa: E731
    dh_bad = diversity_homogeneous_check(Uh, Uhet, loss=factor_div)
    out["riemannian/eq-32-homogeneous"] = outcome_from_check(
        dh["passed"],
        f"eq. (32) is {dh['value']:.3g} < 0 on random metrics (matching the materialised pair "
        f"mean to {dh['error']:.1e}) and {dh['homogeneous']:.1e} (relative) on one metric carried "
        "by different factors U_t = U_0 R_t: it is zero exactly on homogeneous metrics",
        f"eq. (32) is {dh['homogeneous']:.3g} on a homogeneous metric or off by {dh['error']:.3g}",
        witness=f"a diversity of the factors, -mean |U_i - U_j|_F^2, is "
        f"{dh_bad['homogeneous']:.3g} on the homogeneous metric and the check rejects it",
    )
    ds_ = diversity_scaling_check(Uhet)
    ds_bad = diversity_scaling_check(Uhet, loss=lambda u: -(u * u).sum())
    out["riemannian/eq-32-unbounded"] = outcome_from_check(
        ds_["passed"],
        f"L_div(lam U) = lam^4 L_div(U) to {ds_['error']:.1e} with L_div(U) = {ds_['base']:.3g}: "
        f"it reaches {ds_['at_top']:.3g} at lam = {ds_['top']:g} and is unbounded below as "
        "|U_t|_F^2 grows",
        f"L_div is not quartic along lam U (error {ds_['error']:.3g})",
        witness=f"a quadratic penalty fails the lam^4 law by {ds_bad['error']:.3g}",
    )
    sm = smoothness_check(Uhet)
    sm_bad = smoothness_check(
        Uhet, loss=lambda u: curvature_smoothness_loss(u) * (u.shape[0] - 1) / u.shape[0]
    )
    out["riemannian/eq-33"] = outcome_from_check(
        sm["passed"],
        f"eq. (33) (by the r x r identity) matches the materialised mean_t |A_t - A_(t+1)|_F^2 to "
        f"{sm['error']:.1e} and is {sm['flat']:.1e} (relative) on a sequence of one metric",
        f"eq. (33) is off by {sm['error']:.3g} or nonzero ({sm['flat']:.3g}) on equal metrics",
        witness=f"the normaliser 1/L instead of 1/(L-1) is off by {sm_bad['error']:.3g}",
    )
    wd = weight_decay_check()
    wd_q = weight_decay_check(
        lambda m: 10.0 * torch.stack([(p * p).sum() for p in m.parameters()]).sum() ** 2
    )
    tot = ", ".join(f"{x:.3g}" for x in wd["totals"])
    out["riemannian/weight-decay-cap"] = outcome_from_check(
        wd["passed"],
        f"diversity plus weight decay stays bounded along the scaled MetricNet ({tot})",
        f"scaling MetricNet's last layer by lam scales U by lam (error {wd['scale_error']:.1e}); "
        f"the diversity term (32) is quartic and weight decay quadratic, so their sum is {tot} at "
        f"lam = {wd['lams']}: unbounded below, no upper bound on |U_t|_F^2",
        witness=f"a quartic penalty 10 |theta|^4 in its place keeps the sum bounded "
        f"({wd_q['totals'][0]:.3g} at lam = 1, {wd_q['totals'][-1]:.3g} at lam = "
        f"{wd_q['lams'][-1]:g}) and the check accepts it",
    )

    # -- 7: ALiBi
    qa, ka, Ua = _randn(7, 3, g=g), _randn(7, 3, g=g), _randn(7, 3, 2, g=g)
    al = alibi_check(qa, ka, Ua)
    perp = torch.zeros(7, 4, 1, dtype=DT)
    perp[:, 3, 0] = 1.0  # columns orthogonal to every q, k (which live in the first 3 axes)
    pad = lambda x: torch.cat([x, torch.zeros(7, 1, dtype=DT)], -1)  # noqa: E731
    al_null = alibi_check(pad(qa), pad(ka), perp)
    out["riemannian/alibi"] = outcome_from_check(
        al["passed"],
        f"Delta S changes by {al['content']:.3g} (relative) when q, k are redrawn at fixed "
        f"positions, and its double-centred part is {al['pair']:.3g} of it: a content- and "
        f"pair-dependent bias (an ALiBi bias is pair-dependent too, double-centred part "
        f"{al['alibi_pair']:.3g} of it, but does not change with content)",
        f"Delta S is content-independent ({al['content']:.3g}) or separable ({al['pair']:.3g})",
        witness=f"metric factors orthogonal to every q and k give Delta S = 0 "
        f"(pair part {al_null['pair']:.1e}) and the check rejects them",
    )

    # -- 8.3, 8.4
    Up = _randn(6, 2, g=g)
    pc = precondition_check(Up)
    pc_bad = precondition_check(
        Up, apply=lambda h, u, v: h + v + (u @ (u.mT @ v.unsqueeze(-1))).squeeze(-1)
    )
    out["riemannian/precondition-contracts"] = outcome_from_check(
        pc["passed"] and pc["alt_min"] < 1,
        f"g^-1 v never grows: the largest |g^-1 v| / |v| is {pc['ratio']:.15g} (smallest "
        f"{pc['min_shrink']:.3g}), a v orthogonal to U moves by {pc['moved']:.1e}; I + U U^T - V "
        f"V^T has smallest eigenvalue {pc['alt_min']:.3g} < 1, so it could amplify",
        f"g^-1 amplified a vector (ratio {pc['ratio']:.6g}) or moved an orthogonal one "
        f"({pc['moved']:.3g})",
        witness=f"the update with g in place of g^-1 reaches ratio {pc_bad['ratio']:.3g}, which "
        "the check rejects",
    )
    Us = _randn(4, 4, 2, g=g)
    S4 = geodesic_scores(_randn(4, 4, g=g), _randn(4, 4, g=g), Us, 1.0)
    si = specific_input_check(S4, 4)
    si_short = specific_input_check(S4, 3)
    out["riemannian/specific-input"] = outcome_from_check(
        si["passed"],
        f"a heterogeneous (4, 4) score matrix with d = 4 has rank {si['rank']} <= L and a width-4 "
        f"factorisation reproduces it to {si['residual']:.1e}",
        f"the width-L factorisation leaves {si['residual']:.3g}",
        witness=f"width 3 leaves a residual of {si_short['residual']:.3g}, which the check rejects",
    )
    sp = stochastic_product_check(softmax_stack(40, 6))
    sp_grow = stochastic_product_check(softmax_stack(40, 6, growth=1.0))
    sp_id = stochastic_product_check([torch.eye(6, dtype=DT)] * 40)
    out["riemannian/stochastic-products"] = outcome_from_check(
        sp["passed"] and sp["bound_holds"],
        f"holds generically: the product of {sp['depth']} softmax matrices of N(0, 1) scores has "
        f"Dobrushin coefficient {sp['delta']:.1e} (bound {sp['bound']:.1e}); fails for "
        f"row-stochastic matrices with vanishing entries: the identity keeps "
        f"{sp_id['delta']:g}, and softmax of diagonal scores (l + 1)^2 keeps {sp_grow['delta']:.3g} "
        f"after {sp_grow['depth']} layers",
        f"the product of {sp['depth']} softmax matrices has Dobrushin coefficient {sp['delta']:.3g}",
        witness=f"the identity stack keeps coefficient {sp_id['delta']:g} and the check rejects it",
    )
    return out

"""Independent references and the families of attention matrices the cofactor checks use.

Each reference computes what :mod:`attention_atlas.cofactor.cofactors` computes by another
route, so a test or a chapter can compare the two:

* :func:`exact_cofactors`: the principal cofactors by ``mpmath`` determinants at 50 digits;
* :func:`nonzero_eigen_product`: ``prod_{k>=2} lambda_k(I - A)`` from a dense eigensolver (the
  stability margin);
* :func:`left_perron_vector`: the stationary distribution as the left eigenvector of ``A`` for
  the eigenvalue 1 (numpy's ``eig``).

The families (float64, from a seeded generator, so every caller gets the same matrices):
:func:`softmax_matrices` (softmax of Gaussian logits, optionally causal or banded),
:func:`coupled_blocks` (two blocks that exchange a fraction ``coupling`` of their attention:
nearly reducible as the coupling goes to zero) and :func:`softmax_family`, the four families of
chapter 6 by name.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "FAMILIES",
    "coupled_blocks",
    "exact_cofactors",
    "left_perron_vector",
    "nonzero_eigen_product",
    "softmax_family",
    "softmax_matrices",
    "toward_reducible",
]

F64 = torch.float64
#: the matrix families of :func:`softmax_family`
FAMILIES = ("random", "banded", "causal", "nearly_reducible")
#: the targets of :func:`toward_reducible`
TARGETS = ("two closed blocks", "an absorbing token", "a cycle")
#: softmax temperatures of the "random" family, cycled over the matrices of a batch
RANDOM_SCALES = (0.5, 2.0, 5.0)


def softmax_matrices(
    *shape: int, scale: float | Tensor = 1.0, seed: int = 0, mask: str | None = None, width: int = 2
) -> Tensor:
    """``softmax(scale * Z)`` over the last axis, ``Z`` standard normal, ``shape (..., n, n)``.

    Args:
        shape: the shape of the batch of matrices, the last two equal.
        scale: the logits' scale (a number, or a tensor broadcast against ``Z``).
        seed: seed of the generator that draws ``Z`` (float64).
        mask: ``None`` (every entry positive: irreducible), ``"causal"`` (token ``i`` attends to
            ``j <= i``: lower triangular) or ``"banded"`` (``|i - j| <= width``: irreducible and
            sparse).
    """
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise ValueError(f"shape must be (..., n, n), got {shape}")
    g = torch.Generator().manual_seed(seed)
    z = scale * torch.randn(*shape, generator=g, dtype=F64)
    n = shape[-1]
    i = torch.arange(n)
    if mask == "causal":
        z = z.masked_fill(i[None, :] > i[:, None], -math.inf)
    elif mask == "banded":
        z = z.masked_fill((i[:, None] - i[None, :]).abs() > width, -math.inf)
    elif mask is not None:
        raise ValueError(f"mask must be None, 'causal' or 'banded', got {mask!r}")
    return torch.softmax(z, -1)


def coupled_blocks(
    n1: int, n2: int, coupling: float, count: int | None = None, seed: int = 0
) -> Tensor:
    """Two softmax blocks of ``n1`` and ``n2`` tokens; every row keeps ``1 - coupling`` of its
    mass in its own block and spreads ``coupling`` uniformly over the other.

    At ``coupling = 0`` the chain has two closed classes (every cofactor is zero); the margin and
    the spectral gap vanish linearly as ``coupling -> 0``. Shape ``(n, n)`` with ``n = n1 + n2``,
    or ``(count, n, n)``.
    """
    if not 0.0 <= coupling <= 1.0:
        raise ValueError(f"coupling must be in [0, 1], got {coupling}")
    g = torch.Generator().manual_seed(seed)
    batch = () if count is None else (count,)
    a = torch.softmax(torch.randn(*batch, n1, n1, generator=g, dtype=F64), -1)
    b = torch.softmax(torch.randn(*batch, n2, n2, generator=g, dtype=F64), -1)
    A = torch.zeros(*batch, n1 + n2, n1 + n2, dtype=F64)
    A[..., :n1, :n1] = (1 - coupling) * a
    A[..., n1:, n1:] = (1 - coupling) * b
    A[..., :n1, n1:] = coupling / n2
    A[..., n1:, :n1] = coupling / n1
    return A


def softmax_family(kind: str, n: int, count: int, seed: int = 0, coupling: float = 1e-3) -> Tensor:
    """``count`` matrices ``(count, n, n)`` of one of the :data:`FAMILIES`.

    * ``"random"``: softmax of Gaussian logits at the temperatures ``RANDOM_SCALES`` in turn
      (irreducible, every entry positive);
    * ``"banded"``: each token attends within ``+-2`` (irreducible, sparse);
    * ``"causal"``: the causal mask of a decoder (lower triangular, token 0 absorbing);
    * ``"nearly_reducible"``: :func:`coupled_blocks` of ``n // 2`` and ``n - n // 2`` tokens.
    """
    if kind == "random":
        scale = torch.tensor(RANDOM_SCALES, dtype=F64).repeat(count)[:count].view(count, 1, 1)
        return softmax_matrices(count, n, n, scale=scale, seed=seed)
    if kind in ("banded", "causal"):
        return softmax_matrices(count, n, n, seed=seed, mask=kind)
    if kind == "nearly_reducible":
        return coupled_blocks(n // 2, n - n // 2, coupling, count, seed)
    raise ValueError(f"kind must be one of {FAMILIES}, got {kind!r}")


def toward_reducible(target: str, eps: float, n: int = 12, seed: int = 0) -> Tensor:
    """``A(eps) = eps A_0 + (1 - eps) R (n, n)``: a dense softmax matrix ``A_0`` (irreducible)
    moved toward a target ``R`` as ``eps -> 0`` (one of :data:`TARGETS`):

    * ``"two closed blocks"``: ``R`` = two softmax blocks of ``n / 2`` tokens that never attend
      to each other (two closed classes: ``rank L = n - 2`` at ``eps = 0``, every cofactor 0);
    * ``"an absorbing token"``: ``R`` = ``A_0`` with token 0 attending only to itself (one
      closed class ``{0}``: ``rank L = n - 1`` still, ``c -> c_0 e_0``, like a causal head);
    * ``"a cycle"``: ``R`` = the cyclic shift, token ``i`` attending to ``i + 1`` (irreducible
      but periodic: the spectral gap closes while the margin grows to ``n``).
    """
    if not 0.0 <= eps <= 1.0:
        raise ValueError(f"eps must be in [0, 1], got {eps}")
    A0 = softmax_matrices(n, n, seed=seed)
    if target == "two closed blocks":
        h = n // 2
        R = torch.block_diag(softmax_matrices(h, h, seed=seed + 1),
                             softmax_matrices(n - h, n - h, seed=seed + 2))  # fmt: skip
    elif target == "an absorbing token":
        R = A0.clone()
        R[0] = 0.0
        R[0, 0] = 1.0
    elif target == "a cycle":
        R = torch.roll(torch.eye(n, dtype=F64), 1, dims=1)
    else:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    return eps * A0 + (1 - eps) * R


def nonzero_eigen_product(A: Tensor) -> Tensor:
    """``prod_{k>=2} lambda_k(I - A)`` (``(...)``, float64): the eigenvalues of ``I - A`` from
    ``torch.linalg.eigvals``, the one of smallest modulus (the zero of ``L 1 = 0``) left out."""
    L = torch.eye(A.shape[-1], dtype=F64, device=A.device) - A.to(F64)
    ev = torch.linalg.eigvals(L)
    ev = torch.gather(ev, -1, ev.abs().argsort(-1))  # the zero eigenvalue first
    return ev[..., 1:].prod(-1).real


def left_perron_vector(A: Tensor) -> Tensor:
    """The stationary distribution of each ``A (..., n, n)``: the eigenvector of ``A^T`` for the
    eigenvalue nearest 1 (numpy's dense ``eig``), normalised to sum one. ``(..., n)``, float64."""
    n = A.shape[-1]
    out = []
    for a in A.detach().to(F64).cpu().reshape(-1, n, n).numpy():
        w, v = np.linalg.eig(a.T)
        p = np.real(v[:, np.argmin(np.abs(w - 1))])
        out.append(p / p.sum())
    return torch.tensor(np.array(out)).reshape(A.shape[:-1]).to(A.device)


def exact_cofactors(A: Tensor, dps: int = 50) -> Tensor:
    """High-precision reference: the principal cofactors of one ``A (n, n)`` by ``mpmath``
    determinants at ``dps`` decimal digits, returned in float64 ``(n,)`` (no gradient).

    ``L`` is formed from the float64 entries of ``A`` exactly as :func:`~attention_atlas.cofactor.cofactors.laplacian` does, so the
    result is the exact cofactor vector of the matrix actually passed, rounded once.
    """
    import mpmath

    if A.dim() != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"exact_cofactors takes one square matrix (n, n), got {tuple(A.shape)}")
    a = A.detach().to(torch.float64).cpu().tolist()
    n = len(a)
    with mpmath.workdps(dps):
        L = mpmath.matrix(n, n)
        for i in range(n):
            for j in range(n):
                if i != j:
                    L[i, j] = -mpmath.mpf(a[i][j])
            L[i, i] = mpmath.fsum(mpmath.mpf(a[i][j]) for j in range(n) if j != i)
        out = []
        for i in range(n):
            keep = [j for j in range(n) if j != i]
            minor = mpmath.matrix([[L[r, c] for c in keep] for r in keep]) if keep else None
            out.append(float(mpmath.det(minor)) if minor is not None else 1.0)
    return torch.tensor(out, dtype=torch.float64, device=A.device)

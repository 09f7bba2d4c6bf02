"""Graph covector matrices and total unimodularity (the support of the matroidal metric).

The matroidal metric of chapter 5 is built from a fixed sparse covector matrix ``A (d, m)``. The
seed restricts its columns to graph incidence vectors ``e_i - e_j``: the incidence matrix of a
directed graph is totally unimodular (every square submatrix has determinant in {-1, 0, 1}).
This module names the graph families (:func:`graph_edges`), builds their incidence and covector
matrices (:func:`incidence_matrix`, :func:`covector_matrix`, with two non-incidence contrast
families), and checks total unimodularity structurally (:func:`is_signed_incidence`) and
exhaustively (:func:`is_totally_unimodular`).

Every incidence column ``e_i - e_j`` is orthogonal to the all-ones vector, so an incidence
matrix never spans ``R^d``: ``A^T 1 = 0`` and the metric ``A diag(l) A^T + eps I`` has
eigenvalue ``eps`` along ``1`` (one null direction per connected component of the graph).
``grounded=True`` appends one unit column ``e_r`` per component (``r`` its lowest node: a
"half-edge" to ground), which keeps ``A`` a signed incidence matrix, hence totally unimodular,
and makes it span ``R^d`` (:func:`ground_columns`).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "CONTRAST_FAMILIES",
    "GRAPH_FAMILIES",
    "covector_matrix",
    "graph_edges",
    "graph_family_admits",
    "ground_columns",
    "incidence_matrix",
    "is_signed_incidence",
    "is_totally_unimodular",
]

GRAPH_FAMILIES: tuple[str, ...] = ("ring", "ring_chords", "knn", "complete", "random")
"""Graph families whose signed incidence columns ``e_i - e_j`` make the covector matrix."""

CONTRAST_FAMILIES: tuple[str, ...] = ("unsigned", "sparse_random")
"""Sparse non-incidence families, for contrast: ``unsigned`` has columns ``e_i + e_j`` over the
ring-plus-chords edges (totally unimodular only when that graph is bipartite); ``sparse_random``
has three random entries in ``{-1, +1}`` per column (generically not totally unimodular)."""


def _check_graph_size(family: str, d: int, m: int) -> None:
    if d < 3:
        raise ValueError(f"graph family {family!r} needs d >= 3 nodes, got d={d}")
    if m < 1:
        raise ValueError(f"the number of edges m must be positive, got m={m}")
    most = d * (d - 1) // 2
    if m > most:
        raise ValueError(
            f"graph family {family!r} on d={d} nodes has at most d(d-1)/2={most} edges "
            f"(simple graph), but m={m} were asked for"
        )


def graph_family_admits(family: str, d: int, m: int) -> bool:
    """Whether graph family ``family`` has a graph on ``d`` vertices with exactly ``m`` edges
    (the condition under which :func:`graph_edges` returns instead of raising)."""
    try:
        graph_edges(family, d, m)
    except ValueError:
        return False
    return True


def graph_edges(family: str, d: int, m: int, *, seed: int = 0) -> list[tuple[int, int]]:
    """Exactly ``m`` distinct undirected edges ``(i, j)``, ``i < j``, on ``d`` nodes.

    Families:
        ``ring``: the cycle ``i -- i+1 (mod d)``; needs ``m == d``.
        ``ring_chords``: the ring plus ``m - d`` chords drawn at random (``seed``); ``m >= d``.
        ``knn``: circulant k-nearest-neighbour graph, node ``i`` joined to ``i +- 1, ..., i +- k``
            on the circle; needs ``m = k d`` with ``1 <= k < d / 2``.
        ``complete``: all pairs; needs ``m == d (d - 1) / 2``.
        ``random``: ``m`` pairs drawn uniformly at random (``seed``).

    Raises:
        ValueError: an unknown family, or an ``m`` the family cannot have on ``d`` nodes.
    """
    if family not in GRAPH_FAMILIES + ("unsigned",):
        raise ValueError(f"unknown graph family {family!r}; known: {', '.join(GRAPH_FAMILIES)}")
    _check_graph_size(family, d, m)
    ring = [(min(i, (i + 1) % d), max(i, (i + 1) % d)) for i in range(d)]
    all_pairs = [(i, j) for i in range(d) for j in range(i + 1, d)]
    gen = torch.Generator().manual_seed(seed)
    if family == "ring":
        if m != d:
            raise ValueError(f"a ring on d={d} nodes has exactly d={d} edges, got m={m}")
        return ring
    if family in ("ring_chords", "unsigned"):
        if m < d:
            raise ValueError(f"{family!r} on d={d} nodes needs m >= d={d} (the ring), got m={m}")
        chords = [p for p in all_pairs if p not in set(ring)]
        pick = torch.randperm(len(chords), generator=gen)[: m - d].tolist()
        return ring + [chords[i] for i in sorted(pick)]
    if family == "knn":
        k, rest = divmod(m, d)
        if rest or not 1 <= k < d / 2:
            raise ValueError(
                f"the circulant k-nearest graph on d={d} nodes has m = k*d edges with "
                f"1 <= k < d/2 (k <= {(d - 1) // 2}), got m={m}"
            )
        return [
            (min(i, (i + s) % d), max(i, (i + s) % d)) for s in range(1, k + 1) for i in range(d)
        ]
    if family == "complete":
        if m != len(all_pairs):
            raise ValueError(
                f"the complete graph on d={d} nodes has exactly d(d-1)/2={len(all_pairs)} "
                f"edges, got m={m}"
            )
        return all_pairs
    pick = torch.randperm(len(all_pairs), generator=gen)[:m].tolist()  # family == "random"
    return [all_pairs[i] for i in sorted(pick)]


def incidence_matrix(
    edges: list[tuple[int, int]], d: int, *, signed: bool = True, dtype: torch.dtype = torch.float32
) -> Tensor:
    """Incidence matrix ``(d, m)``: column ``e`` is ``e_i - e_j`` (or ``e_i + e_j`` if unsigned)."""
    A = torch.zeros(d, len(edges), dtype=dtype)
    for col, (i, j) in enumerate(edges):
        if not (0 <= i < d and 0 <= j < d) or i == j:
            raise ValueError(f"edge {col} = {(i, j)} is not a pair of distinct nodes in [0, {d})")
        A[i, col] = 1.0
        A[j, col] = -1.0 if signed else 1.0
    return A


def ground_columns(
    edges: list[tuple[int, int]], d: int, *, dtype: torch.dtype = torch.float32
) -> Tensor:
    """Unit columns ``e_r (d, c)``, one per connected component of the graph ``edges`` on ``d``
    nodes (``r`` the component's lowest node; an isolated node is its own component), in
    increasing ``r``. ``[incidence | ground]`` has rank ``d``: each component's incidence spans
    the vectors summing to zero on it, and ``e_r`` adds the component's all-ones direction."""
    parent = list(range(d))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, j in edges:
        a, b = root(i), root(j)
        parent[max(a, b)] = min(a, b)  # the root of a component stays its lowest node
    roots = sorted({root(i) for i in range(d)})
    G = torch.zeros(d, len(roots), dtype=dtype)
    G[roots, torch.arange(len(roots))] = 1.0
    return G


def covector_matrix(
    family: str,
    d: int,
    m: int,
    *,
    seed: int = 0,
    grounded: bool = False,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """The sparse covector matrix ``A (d, m)`` of a named family (``(d, m + c)`` when grounded).

    Graph families (:data:`GRAPH_FAMILIES`) give signed incidence columns ``e_i - e_j``, which
    are totally unimodular; the contrast families (:data:`CONTRAST_FAMILIES`) do not in general.
    ``grounded`` (graph families only) appends :func:`ground_columns`, one per connected
    component (``c = 1`` for a connected graph), so that ``A`` spans ``R^d``.
    """
    if grounded and family not in GRAPH_FAMILIES:
        raise ValueError(
            f"grounded applies to the graph families {', '.join(GRAPH_FAMILIES)} (whose columns "
            f"miss the all-ones direction), got family {family!r}"
        )
    if family in GRAPH_FAMILIES:
        edges = graph_edges(family, d, m, seed=seed)
        A = incidence_matrix(edges, d, dtype=dtype)
        return torch.cat([A, ground_columns(edges, d, dtype=dtype)], 1) if grounded else A
    if family == "unsigned":
        return incidence_matrix(graph_edges(family, d, m, seed=seed), d, signed=False, dtype=dtype)
    if family == "sparse_random":
        if d < 3 or m < 1:
            raise ValueError(f"'sparse_random' needs d >= 3 and m >= 1, got d={d}, m={m}")
        gen = torch.Generator().manual_seed(seed)
        A = torch.zeros(d, m, dtype=dtype)
        for col in range(m):
            rows = torch.randperm(d, generator=gen)[:3]
            signs = torch.randint(0, 2, (3,), generator=gen).to(dtype) * 2 - 1
            A[rows, col] = signs
        return A
    known = ", ".join(GRAPH_FAMILIES + CONTRAST_FAMILIES)
    raise ValueError(f"unknown covector family {family!r}; known: {known}")


def is_signed_incidence(A: Tensor) -> bool:
    """True when every column of ``A`` has at most one ``+1``, at most one ``-1`` and zeros.

    Such a matrix (the incidence matrix of a directed graph) is totally unimodular
    (Poincare 1900; Heller and Tompkins 1956): a structural certificate, no minors needed.
    """
    if A.dim() != 2:
        raise ValueError(f"A must be a matrix (d, m), got shape {tuple(A.shape)}")
    entries_ok = bool(((A == 0) | (A == 1) | (A == -1)).all())
    return entries_ok and bool(((A == 1).sum(0) <= 1).all() and ((A == -1).sum(0) <= 1).all())


def is_totally_unimodular(A: Tensor, *, max_minors: int = 2_000_000) -> bool:
    """Exhaustive check that every square submatrix of ``A (d, m)`` has determinant in {-1, 0, 1}.

    Duplicate columns (and columns equal up to sign) are removed first, which does not change
    the answer. The number of minors is ``sum_k C(d, k) C(m', k)``; when that exceeds
    ``max_minors`` the check refuses (``ValueError``) rather than guess.

    Returns:
        True when ``A`` is totally unimodular, False as soon as one minor is not in {-1, 0, 1}.
    """
    import itertools
    import math

    import numpy as np

    if A.dim() != 2:
        raise ValueError(f"A must be a matrix (d, m), got shape {tuple(A.shape)}")
    a = A.detach().to("cpu", torch.float64).numpy()
    if not np.isin(a, (-1.0, 0.0, 1.0)).all():
        return False  # a 1 x 1 minor is already outside {-1, 0, 1}
    cols: list[tuple[float, ...]] = []
    seen: set[tuple[float, ...]] = set()
    for c in a.T:
        key, neg = tuple(c.tolist()), tuple((-c).tolist())
        if any(c) and key not in seen and neg not in seen:
            seen.add(key)
            cols.append(key)
    if not cols:
        return True
    a = np.array(cols).T  # (d, m')
    d, m = a.shape
    total = sum(math.comb(d, k) * math.comb(m, k) for k in range(2, min(d, m) + 1))
    if total > max_minors:
        raise ValueError(
            f"exhaustive total-unimodularity check of a ({d}, {m}) matrix needs {total} minors, "
            f"more than max_minors={max_minors}; use a smaller matrix or is_signed_incidence"
        )
    for k in range(2, min(d, m) + 1):
        rows = np.array(list(itertools.combinations(range(d), k)))  # (R, k)
        for cset in itertools.combinations(range(m), k):
            sub = a[rows][:, :, list(cset)]  # (R, k, k)
            det = np.abs(np.linalg.det(sub))
            if (det > 1.5).any() or ((det > 0.5) & (det < 1.5) & (np.abs(det - 1) > 1e-6)).any():
                return False
    return True

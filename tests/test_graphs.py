"""Graph covector matrices and total unimodularity (attention/graphs.py, chapter 5)."""

from __future__ import annotations

import pytest
import torch

from attention_atlas.attention.graphs import (
    CONTRAST_FAMILIES,
    GRAPH_FAMILIES,
    covector_matrix,
    graph_edges,
    graph_family_admits,
    ground_columns,
    is_signed_incidence,
    is_totally_unimodular,
)

D = 9  # head dimension of the sweeps: 4d = 36 = d(d-1)/2, so every family reaches m = 4d


CASES = [(f, m) for f in GRAPH_FAMILIES for m in (D, 2 * D, 4 * D) if graph_family_admits(f, D, m)]


def test_every_family_reaches_each_m_it_can_and_the_sweep_covers_all_families():
    assert {f for f, _ in CASES} == set(GRAPH_FAMILIES)
    assert {m for _, m in CASES} == {D, 2 * D, 4 * D}
    for family, m in CASES:
        edges = graph_edges(family, D, m, seed=3)
        assert len(edges) == m and len(set(edges)) == m
        assert all(0 <= i < j < D for i, j in edges)


@pytest.mark.parametrize(
    "family,d,m,match",
    [
        ("ring", 6, 12, "exactly d=6"),
        ("ring_chords", 6, 4, "m >= d"),
        ("knn", 6, 9, "k\\*d"),
        ("complete", 6, 12, "exactly d\\(d-1\\)/2=15"),
        ("random", 6, 16, "at most d\\(d-1\\)/2=15"),
        ("ring", 2, 2, "d >= 3"),
        ("hypercube", 6, 6, "unknown"),
    ],
)
def test_impossible_edge_counts_are_clear_errors(family, d, m, match):
    with pytest.raises(ValueError, match=match):
        covector_matrix(family, d, m)


SMALL = [(f, m) for f in GRAPH_FAMILIES for m in (5, 7, 10) if graph_family_admits(f, 5, m)]


@pytest.mark.parametrize("family,m", SMALL)
def test_every_incidence_family_is_totally_unimodular(family, m):
    d = 5
    assert {f for f, _ in SMALL} == set(GRAPH_FAMILIES)
    A = covector_matrix(family, d, m, seed=1)
    assert is_signed_incidence(A)
    assert is_totally_unimodular(A)  # exhaustive over every square submatrix


def test_unsigned_incidence_is_tu_only_on_bipartite_graphs():
    # the even ring is bipartite: |incidence| is totally unimodular
    assert is_totally_unimodular(covector_matrix("unsigned", 6, 6))
    # an odd cycle has an unsigned incidence minor of determinant 2
    A = covector_matrix("unsigned", 5, 5)
    assert not is_signed_incidence(A)
    assert not is_totally_unimodular(A)


def test_sparse_random_contrast_family_fails_the_checker():
    for seed in range(3):
        A = covector_matrix("sparse_random", 6, 12, seed=seed)
        assert not is_signed_incidence(A)
        assert not is_totally_unimodular(A)
    assert set(CONTRAST_FAMILIES) == {"unsigned", "sparse_random"}


def test_tu_checker_on_known_matrices():
    assert not is_totally_unimodular(torch.tensor([[1.0, 1.0], [-1.0, 1.0]]))  # det 2
    assert not is_totally_unimodular(torch.tensor([[2.0, 0.0], [0.0, 1.0]]))  # entry 2
    interval = torch.tensor([[1.0, 1, 0, 0], [0, 1, 1, 0], [0, 1, 1, 1], [0, 0, 0, 1]])
    assert is_totally_unimodular(interval)  # consecutive ones in each column: TU
    assert is_totally_unimodular(torch.eye(4))
    # a 3 x 3 minor of determinant 2 hidden in a bigger matrix of 0/+-1 entries
    A = torch.tensor([[1.0, 1, 0, 0], [0, 1, 1, 0], [1, 0, 1, 0], [0, 0, 0, 1]])
    assert not is_totally_unimodular(A)


def test_tu_checker_refuses_rather_than_guesses_when_too_large():
    with pytest.raises(ValueError, match="max_minors"):
        is_totally_unimodular(covector_matrix("random", 12, 60), max_minors=1000)


@pytest.mark.parametrize("family,m", CASES)
def test_incidence_columns_miss_the_all_ones_direction_and_grounding_restores_rank_d(family, m):
    """A^T 1 = 0 for every incidence family (rank d - components); the grounded A has one unit
    column per connected component, spans R^d and is still a signed incidence matrix (TU)."""
    A = covector_matrix(family, D, m, seed=3, dtype=torch.float64)
    assert torch.equal(
        A.T @ torch.ones(D, dtype=torch.float64), torch.zeros(m, dtype=torch.float64)
    )
    G = covector_matrix(family, D, m, seed=3, grounded=True, dtype=torch.float64)
    c = G.shape[1] - m
    assert torch.equal(G[:, :m], A) and c >= 1
    assert int(torch.linalg.matrix_rank(A)) == D - c and int(torch.linalg.matrix_rank(G)) == D
    assert is_signed_incidence(G)


def test_ground_columns_put_one_unit_column_on_the_lowest_node_of_each_component():
    edges = [(0, 1), (1, 2), (4, 5)]  # components {0, 1, 2}, {3}, {4, 5} on 6 nodes
    G = ground_columns(edges, 6)
    expected = torch.zeros(6, 3)
    expected[0, 0] = expected[3, 1] = expected[4, 2] = 1.0
    assert torch.equal(G, expected)
    A = torch.cat([covector_matrix("ring", 5, 5), ground_columns(graph_edges("ring", 5, 5), 5)], 1)
    assert is_totally_unimodular(A)  # exhaustive: the ring plus a ground column is TU


def test_grounding_a_contrast_family_is_an_error():
    with pytest.raises(ValueError, match="grounded applies to the graph families"):
        covector_matrix("unsigned", 6, 8, grounded=True)

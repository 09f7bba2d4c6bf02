"""Masked attention, the low-rank mask identity and semiseparable matrices
(attention/sma/masked.py), each checked in float64 against the dense matrix."""

from __future__ import annotations

import pytest
import torch
from sma_inputs import close, gen, rand, randn

from attention_atlas.attention.sma import (
    Semiseparable,
    low_rank_masked_product,
    masked_attention,
)


def test_masked_attention_is_the_hadamard_masked_product_on_vectors_and_matrices() -> None:
    g = gen(1)
    L, B = rand(7, 7, g=g).tril(), randn(7, 7, g=g)
    x, X = randn(7, g=g), randn(7, 3, g=g)
    assert close(masked_attention(L, B, x), (L * B) @ x)
    assert close(masked_attention(L, B, X), (L * B) @ X)
    Lb, Bb, Xb = rand(2, 5, 5, g=g), randn(2, 5, 5, g=g), randn(2, 5, 4, g=g)
    assert close(masked_attention(Lb, Bb, Xb), (Lb * Bb) @ Xb)


@pytest.mark.parametrize("p", [1, 2, 5])
def test_low_rank_mask_identity_equals_p_products_with_B(p: int) -> None:
    """Seed check 1: (B o U V^T) x = sum_i D(U_i) B D(V_i) x."""
    g = gen(42)
    n = 10
    U, V, B = randn(n, p, g=g), randn(n, p, g=g), rand(n, n, g=g)
    x, X = randn(n, g=g), randn(n, 3, g=g)
    M = B * (U @ V.T)
    assert close(low_rank_masked_product(B, U, V, x), M @ x)
    assert close(low_rank_masked_product(B, U, V, X), M @ X)
    calls = []

    def apply_B(z: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return B @ z

    assert close(low_rank_masked_product(apply_B, U, V, x), M @ x)
    assert len(calls) == p  # exactly p products with B


# -- semiseparable matrices -------------------------------------------------------------


@pytest.mark.parametrize("symmetric", [False, True])
def test_semiseparable_product_by_prefix_sums_equals_dense_product(symmetric: bool) -> None:
    g = gen(2)
    U, V = randn(3, 13, 4, g=g), randn(3, 13, 4, g=g)
    S = Semiseparable(U, V, symmetric=symmetric)
    dense = torch.tril(U @ V.mT)
    if symmetric:
        dense = dense + torch.triu(V @ U.mT, 1)
        assert close(S.dense(), S.dense().mT)
    assert close(S.dense(), dense)
    X, x = randn(3, 13, 5, g=g), randn(3, 13, g=g)
    assert close(S @ X, dense @ X)
    assert close(S @ x, (dense @ x[..., None])[..., 0])


def test_semiseparable_product_never_forms_the_dense_matrix() -> None:
    """n = 400000: the dense matrix would need 1.3 TB; the O(n p) product runs at once."""
    n, p = 400_000, 2
    g = gen(3)
    U, V, x = randn(n, p, g=g), randn(n, p, g=g), randn(n, g=g)
    y = Semiseparable(U, V) @ x
    i = 1234  # one row by hand: y_i = sum_{j <= i} (U_i . V_j) x_j
    assert abs(float(y[i] - (V[: i + 1] @ U[i]) @ x[: i + 1])) < 1e-9

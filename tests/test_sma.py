"""Structured masked attention, semiseparable matrices and SSD (attention/sma.py).

Every identity is checked in float64 to 1e-10; the three SSD methods against each other and
against the defining double sum; gradients by gradcheck; the SSM attention module against its
recurrent step.
"""

from __future__ import annotations

import math

import pytest
import torch

from attention_atlas.attention import available_attention, build_attention
from attention_atlas.attention.sma import (
    SSD_METHODS,
    Semiseparable,
    SSMAttention,
    bidiagonal,
    bidiagonal_inverse_generators,
    decay_mask,
    low_rank_masked_product,
    masked_attention,
    per_state_ssm_matrices,
    scalar_ssm_matrices,
    segsum,
    ssd,
    ssd_matrix,
    ssm_as_masked_attention,
    ssm_as_sum_of_masked_attentions,
    ssm_block_matrices,
    ssm_masked_attention_product,
    ssm_recurrence,
    ssm_semiseparable,
)

F64 = torch.float64
TOL = 1e-10


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, g: torch.Generator, dtype: torch.dtype = F64) -> torch.Tensor:
    return torch.randn(*shape, generator=g, dtype=dtype)


def rand(*shape: int, g: torch.Generator, dtype: torch.dtype = F64) -> torch.Tensor:
    return torch.rand(*shape, generator=g, dtype=dtype)


def ssd_inputs(
    b: int, length: int, h: int, p: int, n: int, *, seed: int = 0, decay: float = 1.0,
    dtype: torch.dtype = F64,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    g = gen(seed)
    x = randn(b, length, h, p, g=g, dtype=dtype)
    log_a = -decay * rand(b, length, h, g=g, dtype=dtype)
    B = randn(b, length, h, n, g=g, dtype=dtype) / math.sqrt(n)
    C = randn(b, length, h, n, g=g, dtype=dtype) / math.sqrt(n)
    return x, log_a, B, C


def close(a: torch.Tensor, b: torch.Tensor, tol: float = TOL) -> bool:
    a, b = a.detach(), b.detach()
    return bool((a - b).abs().max() <= tol * max(1.0, float(b.abs().max())))


# -- 1. masked attention and the low-rank mask identity -----------------------------------


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


# -- 2. semiseparable matrices ----------------------------------------------------------


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


def test_block_bidiagonal_inverse_is_the_semiseparable_generator_matrix() -> None:
    g = gen(4)
    T, n = 9, 3
    A_blocks = randn(T - 1, n, n, g=g) / 2 + torch.eye(n, dtype=F64)
    A = ssm_block_matrices(A_blocks, randn(T, n, 1, g=g), randn(T, n, 1, g=g))[0]
    S = bidiagonal_inverse_generators(A_blocks)
    assert S.U.shape == (T * n, n) and S.rank == n
    assert close(S.dense(), torch.linalg.inv(A))
    assert close(S.dense() @ A, torch.eye(T * n, dtype=F64))


def test_decay_mask_is_the_inverse_of_the_unit_bidiagonal_and_is_one_semiseparable() -> None:
    g = gen(5)
    a = rand(11, g=g) * 2 - 1  # signs allowed
    L = decay_mask(a)
    assert close(L, torch.linalg.inv(bidiagonal(a)))
    S = bidiagonal_inverse_generators(a)  # u_t = a_0...a_{t-1}, v_t = 1/u_t
    assert close(S.dense(), L)
    a[3] = 0.0  # a zero transition: the mask is still the inverse (no division is used)
    assert close(decay_mask(a), torch.linalg.inv(bidiagonal(a)))


# -- 3. the state-space model three ways ----------------------------------------------


def test_ssm_hidden_states_by_iteration_equal_the_semiseparable_inverse_form() -> None:
    """Seed check 2 (scalar-times-identity dynamics, scalar inputs and outputs as in the seed)."""
    g = gen(42)
    T, n, m = 10, 6, 1
    A_blocks = rand(T - 1, g=g)[:, None, None] * torch.eye(n, dtype=F64)
    B_blocks, C_blocks, x = rand(T, n, m, g=g), rand(T, n, 1, g=g), randn(T, m, g=g)
    h, y = ssm_recurrence(A_blocks, B_blocks, C_blocks, x)
    h_ss, y_ss = ssm_semiseparable(A_blocks, B_blocks, C_blocks, x)
    assert close(h_ss, h) and close(y_ss, y)
    A, B, C = ssm_block_matrices(A_blocks, B_blocks, C_blocks)
    assert close(torch.linalg.solve(A, B @ x.reshape(-1)), h.reshape(-1))
    assert close(C.T @ torch.linalg.solve(A, B @ x.reshape(-1)), y.reshape(-1))


def test_ssm_with_general_dynamics_three_ways_agree() -> None:
    g = gen(6)
    T, n, m, k = 12, 4, 2, 3
    A_blocks = randn(T - 1, n, n, g=g) / 3 + 0.8 * torch.eye(n, dtype=F64)
    B_blocks, C_blocks, x = randn(T, n, m, g=g), randn(T, n, k, g=g), randn(T, m, g=g)
    h, y = ssm_recurrence(A_blocks, B_blocks, C_blocks, x)
    h_ss, y_ss = ssm_semiseparable(A_blocks, B_blocks, C_blocks, x)
    A, B, C = ssm_block_matrices(A_blocks, B_blocks, C_blocks)
    y_dense = C.T @ torch.linalg.solve(A, B @ x.reshape(-1))
    assert close(h_ss, h) and close(y_ss, y) and close(y_dense, y.reshape(-1))


def test_scalar_ssm_is_structured_masked_attention() -> None:
    """Seed check 3: C^T A^{-1} B = sum_k D(c^k) a^{-1} D(b^k) = (C_n B_n^T) o a^{-1}."""
    g = gen(42)
    T, n = 10, 6
    a = rand(T - 1, g=g)
    Bn, Cn = rand(T, n, g=g), rand(T, n, g=g)
    A, B, C = scalar_ssm_matrices(a, Bn, Cn)
    assert A.shape == (n * T, n * T) and B.shape == (n * T, T)
    assert close(A, torch.kron(torch.eye(n, dtype=F64), bidiagonal(a)))
    M_dense = C.T @ torch.linalg.solve(A, B)
    ai = torch.linalg.inv(bidiagonal(a))
    assert close(M_dense, sum(torch.diag(Cn[:, k]) @ ai @ torch.diag(Bn[:, k]) for k in range(n)))
    assert close(M_dense, sum(torch.outer(Cn[:, k], Bn[:, k]) * ai for k in range(n)))
    assert close(M_dense, (Cn @ Bn.T) * ai)
    assert close(ssm_as_masked_attention(a, Bn, Cn), M_dense)


def test_per_state_dynamics_give_a_sum_of_masked_attentions() -> None:
    g = gen(7)
    T, n = 9, 4
    a = rand(n, T - 1, g=g)
    Bn, Cn = randn(T, n, g=g), randn(T, n, g=g)
    A, B, C = per_state_ssm_matrices(a, Bn, Cn)
    M_dense = C.T @ torch.linalg.solve(A, B)
    M = ssm_as_sum_of_masked_attentions(a, Bn, Cn)
    assert close(M, M_dense)
    # with equal dynamics it collapses to one masked attention
    same = a[:1].expand(n, -1)
    assert close(
        ssm_as_sum_of_masked_attentions(same, Bn, Cn), ssm_as_masked_attention(a[0], Bn, Cn)
    )


def test_masked_attention_product_with_the_semiseparable_inverse() -> None:
    """Seed check 4: C^T A^{-1} B x = sum_k c^k o (tril(u v^T) (b^k o x)), in O(T n)."""
    g = gen(42)
    T, n = 10, 6
    a = rand(T - 1, g=g) + 0.1
    Bn, Cn, x = rand(T, n, g=g), rand(T, n, g=g), randn(T, g=g)
    A, B, C = scalar_ssm_matrices(a, Bn, Cn)
    assert close(ssm_masked_attention_product(a, Bn, Cn, x), C.T @ torch.linalg.solve(A, B @ x))


# -- 4. SSD -------------------------------------------------------------------------------


def test_segsum_sums_each_segment_and_masks_the_future() -> None:
    g = gen(8)
    log_a = randn(2, 7, g=g)
    S = segsum(log_a)
    for t in range(7):
        for s in range(7):
            want = (
                log_a[:, s + 1 : t + 1].sum(-1)
                if t >= s
                else torch.full((2,), -math.inf, dtype=F64)
            )
            assert torch.equal(S[:, t, s], want) or close(S[:, t, s], want)


def test_segsum_in_float32_avoids_the_cancellation_of_cumsum_differences() -> None:
    """Strong decay over a long sequence: prefix sums reach -1e4, the segments stay O(1)."""
    g = gen(9)
    log_a = -(rand(4096, g=g) * 5)  # float64 reference
    ref = segsum(log_a)
    ours = segsum(log_a.float()).double()
    cs = torch.cumsum(log_a.float(), 0)
    naive = (cs[:, None] - cs[None, :]).double()
    near = torch.ones(4096, 4096, dtype=torch.bool).tril() & ~torch.ones(
        4096, 4096, dtype=torch.bool
    ).tril(-8)
    err_ours = (ours - ref)[near].abs().max().item()
    err_naive = (naive - ref)[near].abs().max().item()
    assert err_ours < 1e-5 < 1e-4 < err_naive  # the near-diagonal entries are what matters


def direct_ssd(
    x: torch.Tensor, log_a: torch.Tensor, B: torch.Tensor, C: torch.Tensor
) -> torch.Tensor:
    """The defining double sum, loops only."""
    b, length, h, _ = x.shape
    y = torch.zeros_like(x)
    for t in range(length):
        for s in range(t + 1):
            decay = torch.exp(log_a[:, s + 1 : t + 1].sum(1))  # (b, h)
            y[:, t] += ((C[:, t] * B[:, s]).sum(-1) * decay)[..., None] * x[:, s]
    return y


def test_ssd_equals_the_defining_sum() -> None:
    x, log_a, B, C = ssd_inputs(2, 9, 3, 4, 5)
    ref = direct_ssd(x, log_a, B, C)
    for method in SSD_METHODS:
        assert close(ssd(x, log_a, B, C, method=method, chunk_size=4), ref), method


@pytest.mark.parametrize(
    "length,chunk",
    [
        (1, 64),
        (5, 64),
        (63, 64),
        (64, 64),
        (65, 64),
        (130, 64),
        (200, 64),
        (37, 8),
        (17, 1),
        (11, 3),
    ],
)
def test_ssd_chunked_equals_quadratic_equals_recurrent(length: int, chunk: int) -> None:
    x, log_a, B, C = ssd_inputs(2, length, 3, 4, 5, seed=length)
    yq = ssd(x, log_a, B, C, method="quadratic")
    yr = ssd(x, log_a, B, C, method="recurrent")
    yc = ssd(x, log_a, B, C, method="chunked", chunk_size=chunk)
    yb = ssd(x, log_a, B, C, method="chunked", chunk_size=chunk, block_len=2 * chunk + 1)
    assert yc.shape == x.shape
    assert close(yc, yq) and close(yr, yq) and close(yb, yq)


def test_ssd_of_an_empty_sequence_is_empty_and_keeps_the_state() -> None:
    x, log_a, B, C = ssd_inputs(2, 0, 3, 4, 5)
    h0 = randn(2, 3, 4, 5, g=gen(21))
    for method in SSD_METHODS:
        y, final = ssd(x, log_a, B, C, method=method, initial_state=h0, return_final_state=True)
        assert y.shape == x.shape and torch.equal(final, h0)


def test_ssd_initial_and_final_states_agree_and_split_a_sequence() -> None:
    x, log_a, B, C = ssd_inputs(2, 29, 2, 3, 4, seed=10)
    h0 = randn(2, 2, 3, 4, g=gen(11))
    outs = {
        m: ssd(x, log_a, B, C, method=m, chunk_size=8, initial_state=h0, return_final_state=True)
        for m in SSD_METHODS
    }
    outs["blocks"] = ssd(
        x, log_a, B, C, chunk_size=4, block_len=8, initial_state=h0, return_final_state=True
    )
    y_ref, f_ref = outs["recurrent"]
    for y, f in outs.values():
        assert close(y, y_ref) and close(f, f_ref)
    # running the first 13 steps, then the rest from the state they leave, is one run
    y1, s1 = ssd(
        x[:, :13],
        log_a[:, :13],
        B[:, :13],
        C[:, :13],
        chunk_size=8,
        initial_state=h0,
        return_final_state=True,
    )
    y2, s2 = ssd(
        x[:, 13:],
        log_a[:, 13:],
        B[:, 13:],
        C[:, 13:],
        chunk_size=8,
        initial_state=s1,
        return_final_state=True,
    )
    assert close(torch.cat([y1, y2], 1), y_ref) and close(s2, f_ref)


def test_ssd_matrix_is_the_masked_attention_of_the_ssd() -> None:
    x, log_a, B, C = ssd_inputs(1, 12, 2, 3, 4, seed=12)
    M = ssd_matrix(log_a, B, C)  # (b, h, L, L)
    assert torch.equal(M.triu(1), torch.zeros_like(M))
    y = torch.einsum("bhls,bshp->blhp", M, x)
    assert close(y, ssd(x, log_a, B, C, method="recurrent"))
    # per head it is the seed's (C B^T) o a^{-1} with a_t = exp(log_a_{t+1})
    a = torch.exp(log_a[0, 1:, 0])
    assert close(M[0, 0], ssm_as_masked_attention(a, B[0, :, 0], C[0, :, 0]))


@pytest.mark.parametrize(
    "method,length,chunk,block",
    [
        ("chunked", 7, 2, 4),
        ("chunked", 6, 6, 2048),
        ("quadratic", 5, 64, 2048),
        ("recurrent", 5, 64, 2048),
    ],
)
def test_ssd_gradients_pass_gradcheck(method: str, length: int, chunk: int, block: int) -> None:
    """chunked (7, 2, 4): a padded last chunk and two blocks with the state carried between."""
    x, log_a, B, C = (t.requires_grad_() for t in ssd_inputs(1, length, 2, 2, 3, seed=13))
    h0 = randn(1, 2, 2, 3, g=gen(14)).requires_grad_()

    def f(x, log_a, B, C, h0):  # type: ignore[no-untyped-def]
        return ssd(
            x, log_a, B, C, method=method, chunk_size=chunk, initial_state=h0,
            return_final_state=True, block_len=block,
        )  # fmt: skip

    assert torch.autograd.gradcheck(f, (x, log_a, B, C, h0), fast_mode=True)


def test_ssd_chunked_gradients_equal_recurrent_gradients() -> None:
    inputs = ssd_inputs(2, 45, 2, 3, 4, seed=15)
    grads = {}
    for m in ("chunked", "recurrent"):
        ts = [t.clone().requires_grad_() for t in inputs]
        (ssd(*ts, method=m, chunk_size=16) ** 2).sum().backward()
        grads[m] = [t.grad for t in ts]
    for gc, gr in zip(grads["chunked"], grads["recurrent"]):
        assert gc is not None and gr is not None and close(gc, gr)


@pytest.mark.parametrize("decay", [3.0, 1e-3])
def test_ssd_chunked_float32_is_within_1e4_of_float64_quadratic_on_long_sequences(
    decay: float,
) -> None:
    x, log_a, B, C = ssd_inputs(1, 3000, 2, 16, 16, seed=16, decay=decay)
    ref = ssd(x, log_a, B, C, method="quadratic")
    y32 = ssd(*(t.float() for t in (x, log_a, B, C)), method="chunked")
    rel = ((y32.double() - ref).norm() / ref.norm()).item()
    assert rel < 1e-4, rel


def test_ssd_rejects_mismatched_shapes_dtypes_and_options() -> None:
    x, log_a, B, C = ssd_inputs(2, 8, 3, 4, 5)
    cases = [
        ((x[..., 0], log_a, B, C), {}, "x must be 4-D"),
        ((x, log_a[:, :7], B, C), {}, "log_a must be"),
        ((x, log_a, B, C[..., :4]), {}, "B and C must both be"),
        ((x, log_a, B[:, :7], C[:, :7]), {}, "B and C must both be"),
        ((x.float(), log_a, B, C), {}, "share a dtype"),
        ((x, log_a, B, C), {"method": "fft"}, "method must be one of"),
        ((x, log_a, B, C), {"chunk_size": 0}, "chunk_size must be a positive int"),
        ((x, log_a, B, C), {"block_len": 0}, "block_len must be a positive int"),
        (
            (x, log_a, B, C),
            {"initial_state": torch.zeros(2, 3, 5, 4, dtype=F64)},
            "initial_state must be",
        ),
    ]
    for args, kw, msg in cases:
        with pytest.raises(ValueError, match=msg):
            ssd(*args, **kw)


def test_structured_helpers_reject_mismatched_shapes() -> None:
    g = gen(17)
    with pytest.raises(ValueError, match="share a shape"):
        Semiseparable(randn(5, 2, g=g), randn(5, 3, g=g))
    with pytest.raises(ValueError, match=r"\(\.\.\., 5\)"):
        Semiseparable(randn(5, 2, g=g), randn(5, 2, g=g)) @ randn(4, g=g)
    with pytest.raises(ValueError, match="scores B must be"):
        low_rank_masked_product(randn(4, 4, g=g), randn(5, 2, g=g), randn(5, 2, g=g), randn(5, g=g))
    with pytest.raises(ValueError, match="B_blocks must be"):
        ssm_recurrence(
            randn(4, 3, 3, g=g), randn(4, 3, 1, g=g), randn(5, 3, 1, g=g), randn(5, 1, g=g)
        )
    with pytest.raises(ValueError, match="dynamics a must have shape"):
        ssm_as_masked_attention(randn(5, g=g), randn(5, 2, g=g), randn(5, 2, g=g))
    with pytest.raises(ValueError, match="mask L and scores B"):
        masked_attention(randn(4, 4, g=g), randn(5, 5, g=g), randn(5, g=g))


# -- 5. SSM attention -----------------------------------------------------------------------


def ssm_module(**kw) -> SSMAttention:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    mod = build_attention("ssm", dim=12, n_heads=3, **kw).double()
    assert isinstance(mod, SSMAttention)
    with torch.no_grad():  # larger weights than an init, so the check is not trivially small
        mod.qkv.weight.normal_(0, 0.5)
        mod.dt_proj.weight.normal_(0, 0.5)
    return mod


def test_ssm_attention_is_registered_and_builds_by_name() -> None:
    assert "ssm" in available_attention()
    mod = ssm_module(chunk_size=4)
    assert mod.chunk_size == 4 and len(mod.metric_parameters()) == 3


def test_ssm_attention_weights_reproduce_the_output_and_are_not_row_stochastic() -> None:
    mod = ssm_module(chunk_size=4)
    x = randn(2, 11, 12, g=gen(18))
    fast = mod(x, causal=True)
    slow = mod(x, causal=True, need_weights=True)
    assert fast.probs is None and slow.probs is not None
    assert close(fast.out, slow.out)
    W = slow.probs
    assert W.shape == (2, 3, 11, 11) and torch.equal(W.triu(1), torch.zeros_like(W))
    assert float(slow.diagnostics["row_stochastic"]) == 0.0
    assert float(slow.diagnostics["nonfinite_logits"]) == 0.0
    assert not torch.allclose(W.sum(-1), torch.ones_like(W.sum(-1)))
    assert 0.0 < float(slow.diagnostics["weights_negative_fraction"]) < 1.0
    assert fast.extras["log_a"].shape == (2, 3, 11) and bool((fast.extras["log_a"] < 0).all())


@pytest.mark.parametrize("method", SSD_METHODS)
def test_ssm_attention_step_by_step_equals_the_forward_pass(method: str) -> None:
    mod = ssm_module(chunk_size=4, method=method)
    x = randn(2, 10, 12, g=gen(19))
    full = mod(x, causal=True).out
    state, outs = None, []
    for t in range(10):
        y, state = mod.step(x[:, t], state)
        outs.append(y)
    assert close(torch.stack(outs, 1), full)
    # prefill 6 tokens, then generate the rest step by step
    pre, state = mod.forward_with_state(x[:, :6])
    assert close(pre, full[:, :6])
    for t in range(6, 10):
        y, state = mod.step(x[:, t], state)
        assert close(y, full[:, t])


def test_ssm_attention_learns_its_decay_and_refuses_non_causal_use() -> None:
    mod = ssm_module(chunk_size=4)
    x = randn(1, 9, 12, g=gen(20))
    mod(x, causal=True).out.square().sum().backward()
    for p in mod.metric_parameters():
        assert p.grad is not None and float(p.grad.abs().sum()) > 0
    with pytest.raises(ValueError, match="causal by construction"):
        mod(x, causal=False)
    with pytest.raises(ValueError, match="takes no explicit mask"):
        mod(x, causal=True, mask=torch.ones(9, 9, dtype=torch.bool))
    with pytest.raises(ValueError, match="state must be"):
        mod.step(x[:, 0], torch.zeros(1, 3, 4, 5, dtype=F64))


def test_ssm_attention_runs_in_the_harness_transformer() -> None:
    from attention_atlas.models import ModelConfig, Transformer

    cfg = ModelConfig(
        task="lm",
        vocab_size=20,
        dim=16,
        n_layers=2,
        n_heads=2,
        max_len=40,
        attention="ssm",
        attention_options={"chunk_size": 8},
    )
    model = Transformer(cfg)
    tokens = torch.randint(0, 20, (2, 37))
    out = model(tokens)
    assert out.logits.shape == (2, 37, 20) and torch.isfinite(out.logits).all()
    out.logits.logsumexp(-1).mean().backward()

"""SSD, the state-space dual (attention/sma/duality.py): the three methods against each other
and against the defining double sum, in float64 to 1e-10; gradients by gradcheck."""

from __future__ import annotations

import math

import pytest
import torch
from sma_inputs import F64, close, gen, rand, randn, ssd_inputs

from attention_atlas.attention.sma import (
    SSD_METHODS,
    segsum,
    ssd,
    ssd_matrix,
    ssm_as_masked_attention,
)


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


def test_ssd_refuses_an_empty_sequence_naming_x_and_its_shape() -> None:
    x, log_a, B, C = ssd_inputs(2, 0, 3, 4, 5)
    for method in SSD_METHODS:
        with pytest.raises(ValueError, match=r"ssd: x must have shape .*got \(2, 0, 3, 4\)"):
            ssd(x, log_a, B, C, method=method)


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


def test_chunked_masked_scores_have_exact_gradients_and_equal_the_segment_sum_mask() -> None:
    """The chunked method's custom autograd (scores o exp(segsum(A)), transposed): forward equal
    to the masked attention of segsum, backward by gradcheck in float64."""
    from attention_atlas.attention.sma.duality import _MaskedScoresT

    g = gen(31)
    A = (-rand(2, 3, 7, g=g)).requires_grad_()
    S = randn(2, 3, 7, 7, g=g).requires_grad_()
    ref = S * segsum(A).exp().transpose(-1, -2)
    assert close(_MaskedScoresT.apply(S, A), ref, tol=1e-14)
    assert torch.autograd.gradcheck(_MaskedScoresT.apply, (S, A))
    A_strong = (-8.0 * rand(1, 1, 16, g=g)).requires_grad_()  # entries down to ~e^-120
    S_16 = randn(1, 1, 16, 16, g=g).requires_grad_()
    assert torch.autograd.gradcheck(_MaskedScoresT.apply, (S_16, A_strong))

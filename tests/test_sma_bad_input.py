"""Every public function of ``attention_atlas.attention.sma`` refuses bad input before any work:
a wrong rank, a size that does not match the other arguments, an empty sequence, an integer or
mixed dtype, a non-tensor, tensors on different devices. Each case must raise TypeError or
ValueError in one line that names the function, the bad argument and what came (its shape,
dtype or device), never an error from deep inside torch."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from sma_inputs import F64, gen, randn, ssd_inputs

from attention_atlas import build_attention
from attention_atlas.attention.sma import (
    Semiseparable,
    bidiagonal,
    bidiagonal_inverse_generators,
    block_bidiagonal,
    decay_mask,
    low_rank_masked_product,
    masked_attention,
    per_state_ssm_matrices,
    scalar_ssm_matrices,
    segsum,
    ssd,
    ssd_matrix,
    ssd_step,
    ssm_as_masked_attention,
    ssm_as_sum_of_masked_attentions,
    ssm_block_matrices,
    ssm_masked_attention_product,
    ssm_recurrence,
    ssm_semiseparable,
)

g = gen(5)
T, n = 6, 3
# valid inputs, corrupted one at a time below
x, log_a, B, C = ssd_inputs(2, 8, 3, 4, 5)
h0 = torch.zeros(2, 3, 4, 5, dtype=F64)
U, V, Bm, xv = randn(T, 2, g=g), randn(T, 2, g=g), randn(T, T, g=g), randn(T, g=g)
A_blk, B_blk, C_blk, x_blk = randn(T - 1, n, n, g=g), randn(T, n, 1, g=g), randn(T, n, 1, g=g), randn(T, 1, g=g)  # fmt: skip
a, Bn, Cn = randn(T - 1, g=g), randn(T, n, g=g), randn(T, n, g=g)
a_ps = randn(n, T - 1, g=g)
xs, las, Bs, Cs, st = randn(2, 3, 4, g=g), randn(2, 3, g=g), randn(2, 3, 5, g=g), randn(2, 3, 5, g=g), randn(2, 3, 4, 5, g=g)  # fmt: skip
META = torch.empty(2, 8, 3, device="meta", dtype=F64)

Case = tuple[str, Callable[[], Any], str, str]  # id, call, argument named, what must appear

CASES: list[Case] = [
    # ssd: (batch, length, heads, head_dim) and friends
    ("ssd rank", lambda: ssd(x[..., 0], log_a, B, C), "x", "(2, 8, 3)"),
    (
        "ssd empty length",
        lambda: ssd(x[:, :0], log_a[:, :0], B[:, :0], C[:, :0]),
        "x",
        "(2, 0, 3, 4)",
    ),  # fmt: skip
    (
        "ssd empty heads",
        lambda: ssd(x[:, :, :0], log_a[:, :, :0], B[:, :, :0], C[:, :, :0]),
        "x",
        "(2, 8, 0, 4)",
    ),  # fmt: skip
    ("ssd log_a length", lambda: ssd(x, log_a[:, :7], B, C), "log_a", "(2, 7, 3)"),
    ("ssd B length", lambda: ssd(x, log_a, B[:, :7], C), "B", "(2, 7, 3, 5)"),
    ("ssd C state", lambda: ssd(x, log_a, B, C[..., :4]), "C", "(2, 8, 3, 4)"),
    ("ssd int x", lambda: ssd(x.long(), log_a, B, C), "x", "int64"),
    ("ssd mixed dtype", lambda: ssd(x, log_a, B.float(), C), "B", "float32"),
    ("ssd list", lambda: ssd(x.tolist(), log_a, B, C), "x", "list"),
    ("ssd device", lambda: ssd(x, META, B, C), "log_a", "meta"),
    ("ssd method", lambda: ssd(x, log_a, B, C, method="fft"), "method", "'fft'"),
    ("ssd chunk", lambda: ssd(x, log_a, B, C, chunk_size=0), "chunk_size", "0"),
    ("ssd chunk bool", lambda: ssd(x, log_a, B, C, chunk_size=True), "chunk_size", "True"),
    ("ssd block_len", lambda: ssd(x, log_a, B, C, block_len=-1), "block_len", "-1"),
    (
        "ssd state shape",
        lambda: ssd(x, log_a, B, C, initial_state=h0[..., :4]),
        "initial_state",
        "(2, 3, 4, 4)",
    ),  # fmt: skip
    (
        "ssd state dtype",
        lambda: ssd(x, log_a, B, C, initial_state=h0.float()),
        "initial_state",
        "float32",
    ),  # fmt: skip
    ("ssd_matrix rank", lambda: ssd_matrix(log_a[0], B, C), "log_a", "(8, 3)"),
    ("ssd_matrix B", lambda: ssd_matrix(log_a, B[:, :5], C), "B", "(2, 5, 3, 5)"),
    (
        "ssd_matrix empty",
        lambda: ssd_matrix(log_a[:, :0], B[:, :0], C[:, :0]),
        "log_a",
        "(2, 0, 3)",
    ),  # fmt: skip
    ("ssd_step state", lambda: ssd_step(xs, las, Bs, Cs, st[..., :2]), "state", "(2, 3, 4, 2)"),
    ("ssd_step log_a", lambda: ssd_step(xs, las[:, :2], Bs, Cs, st), "log_a", "(2, 2)"),
    ("ssd_step int", lambda: ssd_step(xs, las, Bs.int(), Cs, st), "B", "int32"),
    ("segsum empty", lambda: segsum(log_a[..., :0]), "log_a", "(2, 8, 0)"),
    ("segsum int", lambda: segsum(log_a.long()), "log_a", "int64"),
    # masked attention and semiseparable matrices
    ("masked_attention shapes", lambda: masked_attention(Bm[:4, :4], Bm, xv), "scores", "(6, 6)"),
    ("masked_attention x", lambda: masked_attention(Bm, Bm, xv[:4]), "x", "(4,)"),
    (
        "masked_attention empty",
        lambda: masked_attention(Bm[:0, :0], Bm[:0, :0], xv[:0]),
        "mask",
        "(0, 0)",
    ),  # fmt: skip
    ("masked_attention dtype", lambda: masked_attention(Bm, Bm.float(), xv), "scores", "float32"),
    ("low_rank V", lambda: low_rank_masked_product(Bm, U, V[:, :1], xv), "V", "(6, 1)"),
    ("low_rank scores", lambda: low_rank_masked_product(Bm[:4, :4], U, V, xv), "scores", "(4, 4)"),
    ("low_rank empty", lambda: low_rank_masked_product(Bm, U[:, :0], V[:, :0], xv), "U", "(6, 0)"),
    ("low_rank x", lambda: low_rank_masked_product(Bm, U, V, xv[:4]), "x", "(4,)"),
    ("low_rank scores type", lambda: low_rank_masked_product("B", U, V, xv), "scores", "str"),
    ("Semiseparable V", lambda: Semiseparable(U, V[:, :1]), "V", "(6, 1)"),
    ("Semiseparable empty", lambda: Semiseparable(U[:0], V[:0]), "U", "(0, 2)"),
    ("Semiseparable int", lambda: Semiseparable(U.long(), V), "U", "int64"),
    ("Semiseparable matmul", lambda: Semiseparable(U, V) @ xv[:4], "x", "(4,)"),
    ("Semiseparable matmul dtype", lambda: Semiseparable(U, V) @ xv.float(), "x", "float32"),
    # the SSM three ways
    ("bidiagonal rank", lambda: bidiagonal(Bm), "a", "(6, 6)"),
    ("bidiagonal int", lambda: bidiagonal(a.long()), "a", "int64"),
    ("block_bidiagonal square", lambda: block_bidiagonal(A_blk[..., :2]), "A_blocks", "(5, 3, 2)"),
    ("generators rank", lambda: bidiagonal_inverse_generators(A_blk[0, 0, 0]), "A_blocks", "()"),
    ("decay_mask int", lambda: decay_mask(a.long()), "a", "int64"),
    (
        "recurrence B",
        lambda: ssm_recurrence(A_blk, B_blk[:4], C_blk, x_blk),
        "B_blocks",
        "(4, 3, 1)",
    ),
    ("recurrence x", lambda: ssm_recurrence(A_blk, B_blk, C_blk, x_blk[:4]), "x", "(4, 1)"),
    (
        "recurrence dtype",
        lambda: ssm_recurrence(A_blk, B_blk, C_blk.float(), x_blk),
        "C_blocks",
        "float32",
    ),  # fmt: skip
    (
        "block matrices C",
        lambda: ssm_block_matrices(A_blk, B_blk, C_blk[:, :2]),
        "C_blocks",
        "(6, 2, 1)",
    ),  # fmt: skip
    (
        "semiseparable empty state",
        lambda: ssm_semiseparable(A_blk[:, :0, :0], B_blk[:, :0], C_blk[:, :0], x_blk),
        "A_blocks",
        "(5, 0, 0)",
    ),  # fmt: skip
    ("as_masked_attention a", lambda: ssm_as_masked_attention(a[:3], Bn, Cn), "a", "(3,)"),
    ("as_masked_attention Cn", lambda: ssm_as_masked_attention(a, Bn, Cn[:, :2]), "Cn", "(6, 2)"),
    (
        "as_masked_attention empty",
        lambda: ssm_as_masked_attention(a[:0], Bn[:0], Cn[:0]),
        "Bn",
        "(0, 3)",
    ),  # fmt: skip
    ("sum_of_masked a", lambda: ssm_as_sum_of_masked_attentions(a, Bn, Cn), "a", "(5,)"),
    ("per_state a", lambda: per_state_ssm_matrices(a_ps[:2], Bn, Cn), "a", "(2, 5)"),
    ("scalar_ssm int", lambda: scalar_ssm_matrices(a, Bn.long(), Cn), "Bn", "int64"),
    ("product x", lambda: ssm_masked_attention_product(a, Bn, Cn, xv[:4]), "x", "(4,)"),
    ("product dtype", lambda: ssm_masked_attention_product(a.float(), Bn, Cn, xv), "a", "float32"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_sma_functions_refuse_bad_input_naming_the_argument_and_what_came(case: Case) -> None:
    _, call, arg, shown = case
    with pytest.raises((TypeError, ValueError)) as err:
        call()
    msg = str(err.value)
    assert "\n" not in msg, msg
    assert re.search(rf"\b{re.escape(arg)}\b", msg), msg
    assert shown in msg, msg
    assert "must" in msg or "expected" in msg, msg  # says what was expected


def test_every_public_function_has_bad_input_cases() -> None:
    import attention_atlas.attention.sma as sma

    tested = {
        "ssd", "ssd_matrix", "ssd_step", "segsum", "masked_attention", "low_rank_masked_product",
        "Semiseparable", "bidiagonal", "block_bidiagonal", "bidiagonal_inverse_generators",
        "decay_mask", "ssm_recurrence", "ssm_block_matrices", "ssm_semiseparable",
        "ssm_as_masked_attention", "ssm_as_sum_of_masked_attentions", "per_state_ssm_matrices",
        "scalar_ssm_matrices", "ssm_masked_attention_product",
        # tested elsewhere: the module (test_functional_api, below), constants and a predicate
        "SSMAttention", "SSD_METHODS", "ROW_STOCHASTIC_TOL", "is_row_stochastic",
    }  # fmt: skip
    assert set(sma.__all__) == tested


def test_ssm_attention_state_methods_name_their_bad_argument() -> None:
    attn = build_attention("ssm", dim=8, n_heads=2).double()
    cases = [
        (lambda: attn.forward_with_state(torch.randn(2, 5, 6, dtype=F64)), "x", "(2, 5, 6)"),
        (lambda: attn.forward_with_state(torch.randn(2, 0, 8, dtype=F64)), "x", "(2, 0, 8)"),
        (lambda: attn.step(torch.randn(2, 6, dtype=F64)), "x_t", "(2, 6)"),
        (
            lambda: attn.step(torch.randn(2, 8, dtype=F64), torch.zeros(2, 2, 4, 3, dtype=F64)),
            "state",
            "(2, 2, 4, 3)",
        ),  # fmt: skip
        (lambda: attn.step(torch.randn(2, 8)), "x_t", "float32"),
    ]
    for call, arg, shown in cases:
        with pytest.raises((TypeError, ValueError)) as err:
            call()
        msg = str(err.value)
        assert re.search(rf"\b{arg}\b", msg) and shown in msg, msg

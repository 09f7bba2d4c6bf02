"""The generic blocked online-softmax kernel against the materialised softmax, and its backward."""

from __future__ import annotations

import pytest
import torch
from riemannian_inputs import DT, TOL, rel

from attention_atlas.attention.flash import blocked_attention


def features(b=2, lq=19, lk=23, width=11, dv=3, seed=15):
    g = torch.Generator().manual_seed(seed)
    qh = torch.randn(b, lq, width, generator=g, dtype=DT)
    kh = torch.randn(b, lk, width, generator=g, dtype=DT)
    v = torch.randn(b, lk, dv, generator=g, dtype=DT)
    return qh, kh, v


@pytest.mark.parametrize("causal", [False, True])
def test_blocked_attention_equals_materialised_softmax_for_any_feature_width(causal):
    qh, kh, v = features()
    s = qh @ kh.mT
    if causal:  # aligned at the end: query i sees keys j <= i + 4
        keep = torch.ones(19, 23, dtype=torch.bool).tril(diagonal=4)
        s = s.masked_fill(~keep, float("-inf"))
    ref = torch.softmax(s, -1) @ v
    out = blocked_attention(qh, kh, v, causal=causal, block_q=4, block_k=5)
    assert rel(out, ref) < TOL


def test_blocked_attention_respects_a_boolean_mask_and_zeroes_empty_rows():
    qh, kh, v = features(lq=9, lk=9)
    mask = torch.rand(9, 9, generator=torch.Generator().manual_seed(3)) > 0.4
    mask[:, 0] = True
    mask[2] = False  # row 2 sees no key
    s = (qh @ kh.mT).masked_fill(~mask, float("-inf"))
    ref = torch.nan_to_num(torch.softmax(s, -1)) @ v
    out = blocked_attention(qh, kh, v, mask=mask, block_q=3, block_k=4)
    assert float(out[:, 2].abs().max()) == 0.0
    assert rel(out, ref) < TOL


def test_blocked_attention_backward_passes_gradcheck():
    qh, kh, v = features(b=1, lq=8, lk=9)
    args = tuple(t.requires_grad_(True) for t in (qh, kh, v))
    assert torch.autograd.gradcheck(
        lambda a, b, c: blocked_attention(a, b, c, causal=True, block_q=6, block_k=7), args
    )


def test_blocked_attention_rejects_a_non_boolean_mask():
    qh, kh, v = features(lq=9, lk=9)
    with pytest.raises(ValueError, match="mask must be boolean"):
        blocked_attention(qh, kh, v, mask=torch.ones(9, 9))

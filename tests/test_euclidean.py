"""Euclidean (squared-distance) attention: the folded-bias CPU kernel (attention/euclidean.py).

The fast path against the explicit reference with masks, float32 and gradcheck is in
``test_base.py`` (the two baselines)."""

from __future__ import annotations

import torch

from attention_atlas.attention.euclidean import (
    euclidean_attention_explicit,
    squared_distance_attention,
)

D64 = torch.float64


def test_folded_bias_kernel_equals_the_explicit_euclidean_reference_with_gradients():
    g = torch.Generator().manual_seed(0)
    for shape in ((1, 2, 5, 3), (2, 5, 3)):  # 4-D and 3-D (lifted to 4-D for the kernel)
        q, k, v = (
            torch.randn(*shape, generator=g, dtype=D64, requires_grad=True) for _ in range(3)
        )
        for causal in (False, True):
            out = squared_distance_attention(q, k, v, 0.6, causal=causal)
            ref = euclidean_attention_explicit(q, k, v, 0.6, causal=causal)[0]
            torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
            f = lambda q, k, v, c=causal: squared_distance_attention(q, k, v, 0.6, causal=c)
            assert torch.autograd.gradcheck(f, (q, k, v))


def test_the_cpu_forward_runs_the_flash_kernel_at_head_dimension_d_and_a_mask_takes_d_plus_1():
    """Without a mask the key term -|k|^2/2 is a broadcast bias (flash forward at d, backward on
    the augmented d + 1 vectors); with a mask it is an extra key column (head dimension d + 1)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten
    fwd_op = aten._scaled_dot_product_flash_attention_for_cpu.default
    bwd_op = aten._scaled_dot_product_flash_attention_for_cpu_backward.default

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.calls.append((func, args))
            return func(*args, **(kwargs or {}))

    q, k, v = (torch.randn(2, 3, 32, 8, requires_grad=True) for _ in range(3))
    with Record() as rec:
        squared_distance_attention(q, k, v, 2.0, causal=True).sum().backward()
    fwd = [a for f, a in rec.calls if f == fwd_op]
    bwd = [a for f, a in rec.calls if f == bwd_op]
    assert len(fwd) == 1 and fwd[0][0].shape[-1] == 8
    assert len(bwd) == 1 and bwd[0][1].shape[-1] == 9
    mask = torch.ones(32, 32, dtype=torch.bool)
    with Record() as rec:
        squared_distance_attention(q, k, v, 2.0, mask=mask)
    heads = [a[0].shape[-1] for f, a in rec.calls if f == fwd_op]
    assert heads == [9]  # q, k augmented to d + 1 (v zero-padded to match)

"""The SSM's native decay-mask kernels (``ssm_mask_forward`` and ``ssm_mask_backward`` behind
:class:`attention_atlas.attention.sma.duality._MaskedScoresT`): bit for bit the PyTorch path,
in float32 and float64, for either layout autograd hands the backward, in a whole training step;
the decay mask itself against its definition; gradcheck; and they run only where switched on."""

from __future__ import annotations

import hashlib
import math

import pytest
import torch

from attention_atlas import native
from attention_atlas.attention.sma import duality as D

# (batch, heads, chunks, chunk length): lengths a multiple of the kernel's 8 lanes and not
SHAPES = [(2, 3, 1, 64), (2, 3, 5, 13), (1, 1, 2, 1), (3, 2, 1, 17), (1, 2, 3, 8)]


pytestmark = pytest.mark.usefixtures("one_thread")


def _inputs(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    length = shape[-1]
    scores = torch.randn(*shape[:-1], length, length, dtype=dtype, generator=g)
    A = -3 * torch.rand(*shape, dtype=dtype, generator=g)  # log-decays <= 0, as A dt
    grad = torch.randn(*shape[:-1], length, length, dtype=dtype, generator=g)
    return scores, A, grad


def _run(scores, A, grad, on: bool):  # type: ignore[no-untyped-def]
    s, a = scores.clone().requires_grad_(True), A.clone().requires_grad_(True)
    with native.enabled(on):
        out = D._MaskedScoresT.apply(s, a)
        out.backward(grad)
    return out.detach(), s.grad, a.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("transposed", [False, True])
def test_masked_scores_are_bit_for_bit_the_pytorch_path(
    shape: tuple[int, ...], dtype: torch.dtype, transposed: bool, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """Output and both gradients identical (``torch.equal``) with the kernels on and off, for an
    incoming gradient laid out as the scores or transposed (as autograd hands it in a model);
    and the kernels did run."""
    assert native.library() is not None, native.status()
    calls: list[str] = []
    real_call, real_kernel = native.call, native.kernel
    monkeypatch.setattr(native, "call", lambda name, *a: calls.append(name) or real_call(name, *a))
    monkeypatch.setattr(native, "kernel",
                        lambda name, dt: calls.append(name) or real_kernel(name, dt))  # fmt: skip
    scores, A, grad = _inputs(shape, dtype, 3)
    if transposed:
        grad = grad.transpose(-1, -2).contiguous().transpose(-1, -2)
    off, on = _run(scores, A, grad, False), _run(scores, A, grad, True)
    assert calls == ["ssm_mask_forward", "ssm_mask_backward"]
    for name, a, b in zip(("out", "d scores", "dA"), off, on):
        assert torch.equal(a, b), f"{name}: largest difference {(a - b).abs().max().item()}"


def test_masked_scores_equal_the_decay_mask_definition() -> None:
    """The kernel's product equals ``scores o L^T`` with ``L_ts = exp(A_{s+1} + ... + A_t)``
    summed directly in float64 (an independent reference), to float64 rounding."""
    scores, A, _ = _inputs((2, 3, 2, 13), torch.float64, 5)
    length = A.shape[-1]
    ref = torch.zeros_like(scores)
    for s in range(length):
        for t in range(s, length):
            ref[..., s, t] = scores[..., s, t] * torch.exp(A[..., s + 1 : t + 1].sum(-1))
    with native.enabled(True):
        out = D._MaskedScoresT.apply(scores, A)
    torch.testing.assert_close(out, ref, rtol=1e-13, atol=0)
    assert bool((out.tril(-1) == 0).all())


def test_masked_scores_pass_gradcheck_with_the_kernels() -> None:
    scores, A, _ = _inputs((1, 2, 2, 9), torch.float64, 7)
    with native.enabled(True):
        assert torch.autograd.gradcheck(
            D._MaskedScoresT.apply, (scores.requires_grad_(True), A.requires_grad_(True))
        )


def test_a_gradient_of_another_layout_takes_the_pytorch_path(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A gradient neither contiguous nor transposed-contiguous falls back to the products (the
    mask formed again from the saved decays), with the same bits."""
    scores, A, grad = _inputs((2, 2, 1, 12), torch.float32, 9)
    odd = torch.zeros(*grad.shape[:-1], 2 * grad.shape[-1])[..., ::2]  # strided rows
    odd.copy_(grad)
    kernels: list[str] = []
    real = native.kernel
    monkeypatch.setattr(native, "kernel", lambda name, dt: kernels.append(name) or real(name, dt))
    off, on = _run(scores, A, odd, False), _run(scores, A, odd, True)
    assert kernels == []
    assert all(torch.equal(a, b) for a, b in zip(off, on))


def test_kernels_stay_off_unless_switched_on(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    calls: list[str] = []
    real = native.call
    monkeypatch.setattr(native, "call", lambda name, *a: calls.append(name) or real(name, *a))
    scores, A, grad = _inputs((1, 1, 1, 5), torch.float32, 1)
    _run(scores, A, grad, False)
    _run(scores.half(), A.half(), grad.half(), True)  # float16: no kernel
    assert calls == []


def _params_hash(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("seq_len", [16, 40])  # one chunk, and several with padding
def test_a_training_run_of_the_ssm_is_the_same_with_the_kernels(seq_len: int) -> None:
    """Six optimiser steps of an ``"ssm"`` language model (chunk 16): every parameter the same
    bits with the native kernels on as off, so a run made either way re-runs either way."""
    from attention_atlas.models import ModelConfig, Transformer

    hashes, losses = [], []
    for on in (False, True):
        torch.manual_seed(0)
        model = Transformer(ModelConfig(vocab_size=13, dim=32, n_layers=2, n_heads=2,
                                        max_len=64, attention="ssm",
                                        attention_options={"chunk_size": 16}))  # fmt: skip
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
        g = torch.Generator().manual_seed(1)
        for _ in range(6):
            x = torch.randint(0, 13, (4, seq_len + 1), generator=g)
            with native.enabled(on):
                logits = model(x[:, :-1]).logits
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 13),
                                                         x[:, 1:].reshape(-1))  # fmt: skip
                opt.zero_grad()
                loss.backward()
            opt.step()
        hashes.append(_params_hash(model))
        losses.append(loss.item())
    assert math.isfinite(losses[0])
    assert hashes[0] == hashes[1], losses

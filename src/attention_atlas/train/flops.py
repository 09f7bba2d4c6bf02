"""FLOPs of a model, counted once per run with :class:`torch.utils.flop_counter.FlopCounterMode`
(the whole model, the attention modules, and their score/softmax/mixing core)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from attention_atlas.models import Transformer, attention_modules

from .evaluate import cross_entropy

__all__ = ["measure_flops"]


def _register_cpu_sdpa_flops() -> None:
    """FlopCounterMode counts the CUDA SDPA kernels but not the CPU flash kernel: add it."""
    from torch.utils import flop_counter as fc

    ops = torch.ops.aten
    pairs = [
        ("_scaled_dot_product_flash_attention_for_cpu", fc.sdpa_flop),
        ("_scaled_dot_product_flash_attention_for_cpu_backward", fc.sdpa_backward_flop),
    ]
    for name, formula in pairs:
        op = getattr(ops, name, None)
        if op is not None and op not in fc.flop_registry:
            # the formula is already shape-wrapped, hence get_raw
            fc.register_flop_formula(op, get_raw=True)(formula)  # type: ignore[arg-type]


_register_cpu_sdpa_flops()


def measure_flops(model: Transformer, x: Tensor, y: Tensor) -> dict[str, int]:
    """FLOPs of one forward and one forward+backward on ``(x, y)``, and the attention share.

    * ``forward_total``, ``train_step_total``: the whole model (loss included);
    * ``forward_attention``: the attention modules (projections included), attributed through
      FlopCounterMode's module hierarchy; ``forward_attention_core``: the same without the
      q/k/v and output projections (the score, softmax and value mixing of each variant);
    * ``train_step_attention`` / ``train_step_attention_core``: forward+backward of each
      attention module (resp. its :meth:`attend` alone) run in isolation on inputs of the same
      shape, summed over layers (FlopCounterMode's module attribution is unreliable in backward).

    Parameters, gradients and the RNG states are left as they were.
    """
    from torch.utils.flop_counter import FlopCounterMode

    def total(counts: dict[str, dict[Any, int]], key: str) -> int:
        return int(sum(counts.get(key, {}).values()))

    prefix = type(model).__name__
    names = {id(m): n for n, m in model.named_modules()}
    attn = attention_modules(model)
    out: dict[str, int] = {}
    was_training = model.training
    with torch.random.fork_rng(devices=[]):
        model.eval()
        with FlopCounterMode(display=False) as fcm, torch.no_grad():
            model(x)
        counts = fcm.get_flop_counts()
        out["forward_total"] = total(counts, "Global")
        fa = fc = 0
        for m in attn:
            key = f"{prefix}.{names[id(m)]}"
            t = total(counts, key)
            fa += t
            fc += t - total(counts, f"{key}.qkv") - total(counts, f"{key}.proj")
        out["forward_attention"], out["forward_attention_core"] = fa, fc
        params = [p for p in model.parameters() if p.requires_grad]
        saved = [p.grad for p in params]  # backward() (autograd.grad breaks the module tracker)
        for p in params:
            p.grad = None
        with FlopCounterMode(display=False) as fcm:
            cross_entropy(model(x).logits, y).backward()
        out["train_step_total"] = total(fcm.get_flop_counts(), "Global")
        # attention modules in isolation (inputs of the shape they see in the model)
        b, length = (
            x.shape[0],
            (x.shape[1] + (1 if model.cfg.pool == "cls" and model.cfg.task == "classify" else 0)),
        )
        ta = tc = 0
        for m in attn:
            h = torch.randn(b, length, m.dim, device=x.device, requires_grad=True)
            with FlopCounterMode(display=False) as fcm:
                m(h, causal=model.cfg.is_causal).out.sum().backward()
            ta += total(fcm.get_flop_counts(), "Global")
            with torch.no_grad():
                q, k, v = (t.detach().requires_grad_() for t in m.split_heads(h))
            with FlopCounterMode(display=False) as fcm:
                r = m.attend(
                    q, k, v, x=h, causal=model.cfg.is_causal, mask=None, need_weights=False
                )
                r.out.sum().backward()
            tc += total(fcm.get_flop_counts(), "Global")
        out["train_step_attention"], out["train_step_attention_core"] = ta, tc
        for p, g in zip(params, saved):
            p.grad = g
    model.train(was_training)
    return out

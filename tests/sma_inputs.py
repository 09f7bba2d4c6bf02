"""Shared inputs and tolerances of the structured-masked-attention tests (test_sma_*.py):
seeded generators, random float64 tensors, SSD inputs and the relative closeness check."""

from __future__ import annotations

import math

import torch

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
    """``x (b, L, h, p)``, ``log_a (b, L, h)`` in ``[-decay, 0]``, ``B, C (b, L, h, n)``."""
    g = gen(seed)
    x = randn(b, length, h, p, g=g, dtype=dtype)
    log_a = -decay * rand(b, length, h, g=g, dtype=dtype)
    B = randn(b, length, h, n, g=g, dtype=dtype) / math.sqrt(n)
    C = randn(b, length, h, n, g=g, dtype=dtype) / math.sqrt(n)
    return x, log_a, B, C


def close(a: torch.Tensor, b: torch.Tensor, tol: float = TOL) -> bool:
    """``max |a - b| <= tol * max(1, max |b|)``."""
    a, b = a.detach(), b.detach()
    return bool((a - b).abs().max() <= tol * max(1.0, float(b.abs().max())))

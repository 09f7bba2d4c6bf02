"""The claims of state-space models as structured masked attention (Paltorp 2025), in reading order."""

from __future__ import annotations

from .core import C7, Claim, claim_entry

CLAIMS: list[Claim] = [
    # -- SSMs as structured masked attention (Paltorp 2025) -----------------------------------
    claim_entry(
        "sma/low-rank-mask",
        "Masked attention, rank-p mask",
        "identity",
        "(L o B) x = sum_i D(u_i) B D(v_i) x for a rank-p mask L = U V^T: p products with B.",
        C7,
        "1. Masked attention and the low-rank mask identity",
        "sma",
        form="exact",
        margin=1e-12,
        declared="float64 identity (relative 1e-12) and counted FLOPs exactly",
    ),
    claim_entry(
        "sma/ssm-semiseparable",
        "Section 1",
        "identity",
        "An SSM up to time T is y = C A^-1 B x with A^-1 block semiseparable, applied in linear "
        "time for a fixed state size.",
        C7,
        "2. The state-space model as structured matrices",
        "sma",
        form="exact",
        margin=1e-12,
        declared="float64 identity and counted work per doubling of T",
    ),
    claim_entry(
        "sma/ssm-is-sma",
        "Section 2",
        "identity",
        "With scalar-times-identity dynamics the SSM is structured masked attention: "
        "C^T A^-1 B = (C B^T) o a^-1.",
        C7,
        "3. Scalar dynamics: the SSM is structured masked attention",
        "sma",
        form="exact",
        margin=1e-12,
        declared="float64 identity (relative 1e-12)",
    ),
    claim_entry(
        "sma/sum-of-sma",
        "Section 2",
        "identity",
        "Independent but different per-state dynamics give a sum of masked attentions.",
        C7,
        "3. Scalar dynamics: the SSM is structured masked attention",
        "sma",
        form="exact",
        margin=1e-12,
        declared="float64 identity (relative 1e-12)",
    ),
    claim_entry(
        "sma/generators",
        "Section 2, semiseparable generators",
        "algorithm",
        "In exact arithmetic (every a_i nonzero), the product through the generators "
        "u_t = a_1 ... a_{t-1}, v_t = 1/u_t computes the SSM in time linear in T.",
        C7,
        "4. The fast product, and where the generator representation breaks",
        "sma",
        form="exact",
        margin=1e-12,
        declared="float64 identity and counted work per doubling of T",
    ),
    claim_entry(
        "sma/ssd-linear",
        "SSD (Mamba-2) as SMA",
        "cost",
        "The chunked (SSD) algorithm computes the same output in time linear in the length.",
        C7,
        "5. SSD three ways: recurrence, masked attention, chunks",
        "sma",
        form="exact",
        margin=1e-12,
        declared="chunked = quadratic = recurrent in float64 and counted FLOPs per doubling of L",
    ),
]

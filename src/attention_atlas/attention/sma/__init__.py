"""Structured masked attention: semiseparable matrices and state-space models as attention.

Masked attention (Dao & Gu, 2024, "Transformers are SSMs") is ``y = M x`` with

    M = L o B                                     # seed: masked attention

a mask ``L`` applied elementwise (``o``, the Hadamard product) to a score matrix ``B``.
When ``L`` is structured, ``M x`` is cheap (structured masked attention, SMA); the seed
(Paltorp, 2025, "Structured Masked Attention") walks through the algebra that makes a
state-space model (SSM) with scalar-times-identity dynamics (Mamba-2) such an SMA. One module
per idea:

* :mod:`.masked`: masked attention, the low-rank mask identity
  ``(B o U V^T) x = sum_i D(U_i) B D(V_i) x`` (p products with B), and :class:`Semiseparable`
  matrices ``tril(U V^T)`` applied in ``O(n p)`` by prefix sums;
* :mod:`.ssm`: the SSM three ways (the recurrence, the block matrices ``y = C^T A^{-1} B x``
  with the semiseparable generators of the inverse of a block-bidiagonal matrix, and, for scalar
  dynamics, the SMA ``M = (C B^T) o a^{-1}``, a sum of such SMAs when each state has its own
  dynamics);
* :mod:`.duality`: :func:`ssd`, the state-space dual, by recurrence, by the materialised
  (quadratic) SMA and by the linear-time chunked algorithm of Mamba-2 (after ``ssd_minimal.py``);
* :mod:`.module`: :class:`SSMAttention`, registered as ``"ssm"``: queries as C, keys as B,
  values as x, with a learned, input-dependent per-head decay, and a recurrent
  :meth:`~SSMAttention.step`.

Every public name is importable from this package (``from attention_atlas.attention.sma
import ssd``), the stable API.
"""

from .duality import SSD_METHODS, segsum, ssd, ssd_matrix, ssd_step
from .masked import Semiseparable, low_rank_masked_product, masked_attention
from .module import ROW_STOCHASTIC_TOL, SSMAttention, is_row_stochastic
from .ssm import (
    bidiagonal,
    bidiagonal_inverse_generators,
    block_bidiagonal,
    decay_mask,
    per_state_ssm_matrices,
    scalar_ssm_matrices,
    ssm_as_masked_attention,
    ssm_as_sum_of_masked_attentions,
    ssm_block_matrices,
    ssm_masked_attention_product,
    ssm_recurrence,
    ssm_semiseparable,
)

__all__ = [
    "ROW_STOCHASTIC_TOL",
    "SSD_METHODS",
    "SSMAttention",
    "Semiseparable",
    "bidiagonal",
    "bidiagonal_inverse_generators",
    "block_bidiagonal",
    "decay_mask",
    "is_row_stochastic",
    "low_rank_masked_product",
    "masked_attention",
    "per_state_ssm_matrices",
    "scalar_ssm_matrices",
    "segsum",
    "ssd",
    "ssd_matrix",
    "ssd_step",
    "ssm_as_masked_attention",
    "ssm_as_sum_of_masked_attentions",
    "ssm_block_matrices",
    "ssm_masked_attention_product",
    "ssm_recurrence",
    "ssm_semiseparable",
]

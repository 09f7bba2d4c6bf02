"""Cofactor-stable attention: principal cofactors of ``L = I - A``, the stability margin, the
stationary distribution, the seed's regulariser and the diagnostics of attention heads.

One module per responsibility:

* :mod:`~attention_atlas.cofactor.cofactors`: the maths and the three methods (``"minors"``,
  ``"lu"``, ``"power"``): :func:`principal_cofactors`, :func:`stability_margin`,
  :func:`stationary_distribution`;
* :mod:`~attention_atlas.cofactor.penalty`: the regulariser ``-log(|m| + eps) + beta KL(u || pi)``
  (:func:`cofactor_penalty`, with a hand-written backward) and the harness's ``"cofactor"``
  regulariser;
* :mod:`~attention_atlas.cofactor.heads`: the probabilities of chosen layers and heads (given,
  or recomputed from the layers' inputs so the training forward stays on SDPA);
* :mod:`~attention_atlas.cofactor.diagnostics`: :func:`spectral_gap`, :func:`cofactor_diagnostics`
  and the harness's ``"cofactor"`` diagnostic;
* :mod:`~attention_atlas.cofactor.references`: independent references (50-digit cofactors,
  eigenvalues, eigenvectors) and the matrix families the checks run on.

``attention_atlas.cofactor.principal_cofactors(A, method="lu")`` and
``attention_atlas.cofactor.stability_margin(A)`` are the stable API.
"""

from __future__ import annotations

from .cofactors import (
    METHODS,
    CofactorResult,
    laplacian,
    lu_cofactors,
    power_stationary,
    principal_cofactors,
    stability_margin,
    stationary_distribution,
    validate_stochastic,
)
from .diagnostics import cofactor_diagnostics, spectral_gap
from .heads import head_probs
from .penalty import cofactor_flops, cofactor_penalty, cofactor_regularizer_from_probs
from .references import (
    FAMILIES,
    coupled_blocks,
    exact_cofactors,
    left_perron_vector,
    nonzero_eigen_product,
    softmax_family,
    softmax_matrices,
    toward_reducible,
)

__all__ = [
    "FAMILIES",
    "METHODS",
    "CofactorResult",
    "cofactor_diagnostics",
    "cofactor_flops",
    "cofactor_penalty",
    "cofactor_regularizer_from_probs",
    "coupled_blocks",
    "exact_cofactors",
    "head_probs",
    "laplacian",
    "left_perron_vector",
    "lu_cofactors",
    "nonzero_eigen_product",
    "power_stationary",
    "principal_cofactors",
    "softmax_family",
    "softmax_matrices",
    "spectral_gap",
    "stability_margin",
    "stationary_distribution",
    "toward_reducible",
    "validate_stochastic",
]

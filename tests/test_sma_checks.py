"""The SMA claims' checks (experiments/sma_checks.py): every claim of the seed gets an outcome
from a float64 check, the chapter has the section each claim names, and each check turns to
"contradicted" when its subject is broken (a wrong product, quadratic work)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from attention_atlas import claims
from attention_atlas.experiments.sma import checks as sma_checks
from attention_atlas.experiments.sma.checks import (
    LINEAR_GROWTH,
    check_generators,
    check_low_rank_mask,
    check_ssd_linear,
    check_ssm_is_sma,
    check_ssm_semiseparable,
    count_elements,
    work_growth,
)

CHAPTER = Path(__file__).resolve().parents[1] / "notebooks" / f"{claims.C7}.py"
SMA = [c for c in claims.CLAIMS if c.module == "attention_atlas.experiments.sma"]  # chapter 7's


def g42() -> torch.Generator:
    return torch.Generator().manual_seed(42)


def test_every_sma_claim_is_computed_here_and_names_a_heading_of_chapter_7() -> None:
    headings = {m.group(1).strip() for m in re.finditer(r"^# #+ (.+)$", CHAPTER.read_text(), re.M)}
    assert len(SMA) == 6
    for c in SMA:
        assert c.module == "attention_atlas.experiments.sma" and c.chapter == claims.C7
        assert c.section in headings, (c.key, c.section, sorted(headings))


def test_the_register_gets_a_supported_outcome_for_each_sma_claim() -> None:
    out = claims.evaluate(SMA, smoke=True)
    assert {k: o.outcome for k, o in out.items()} == {c.key: "supported" for c in SMA}
    assert "float32" in out["sma/generators"].summary  # the overflow is reported beside it


def test_count_elements_counts_what_each_operation_writes() -> None:
    a = torch.ones(10, dtype=torch.float64)
    assert count_elements(lambda t: t + 1, a) == 10
    assert count_elements(lambda t: (t * 2).sum(), a) == 11
    outer = work_growth(lambda T: (torch.ones(T),), lambda t: torch.outer(t, t), [8, 16, 32])
    assert outer == [4.0, 4.0]  # quadratic: outside LINEAR_GROWTH
    assert not LINEAR_GROWTH[0] <= outer[0] <= LINEAR_GROWTH[1]


def test_the_low_rank_mask_check_fails_on_a_wrong_product(monkeypatch) -> None:
    assert check_low_rank_mask(g42()).outcome.outcome == "supported"

    def one_term_short(B, U, V, x):  # p - 1 of the p rank-one terms
        return sum(U[:, i] * (B @ (V[:, i] * x)) for i in range(U.shape[1] - 1))

    monkeypatch.setattr(sma_checks, "low_rank_masked_product", one_term_short)
    assert check_low_rank_mask(g42()).outcome.outcome == "contradicted"


def test_the_semiseparable_check_fails_on_quadratic_work(monkeypatch) -> None:
    from attention_atlas.attention.sma import ssm_block_matrices

    def dense_solve(A_blocks, B_blocks, C_blocks, x):  # right numbers, quadratic+ work
        A, B, C = ssm_block_matrices(A_blocks, B_blocks, C_blocks)
        h = torch.linalg.solve(A, B @ x.reshape(-1)).reshape(x.shape[0], -1)
        return h, torch.einsum("tnk,tn->tk", C_blocks, h)

    monkeypatch.setattr(sma_checks, "ssm_semiseparable", dense_solve)
    check = check_ssm_semiseparable(g42())
    assert max(check.errors.values()) < sma_checks.TOL  # the numbers are right ...
    assert check.outcome.outcome == "contradicted"  # ... the cost is not linear


def test_the_sma_checks_fail_on_a_wrong_mask(monkeypatch) -> None:
    sma, per_state = check_ssm_is_sma(g42())
    assert (sma.outcome.outcome, per_state.outcome.outcome) == ("supported", "supported")
    from attention_atlas.attention import sma as lib

    def unmasked(a, Bn, Cn):  # C B^T without the decay mask
        return Cn @ Bn.T

    def one_mask(a, Bn, Cn):  # the first state's dynamics for every state
        return lib.ssm_as_masked_attention(a[0], Bn, Cn)

    monkeypatch.setattr(sma_checks, "ssm_as_masked_attention", unmasked)
    monkeypatch.setattr(sma_checks, "ssm_as_sum_of_masked_attentions", one_mask)
    sma, per_state = check_ssm_is_sma(g42())
    assert (sma.outcome.outcome, per_state.outcome.outcome) == ("contradicted", "contradicted")


def test_the_generator_outcome_is_exact_and_linear_and_reports_the_float32_overflow() -> None:
    g = g42()
    check_low_rank_mask(g), check_ssm_semiseparable(g)
    sma, _ = check_ssm_is_sma(g)
    check = check_generators(g, sma.data["Bn"], sma.data["Cn"], (25, 100, 150, 400))
    assert check.outcome.outcome == "supported"
    assert check.data["first_failure"] == {"float32": 150, "float64": None}
    assert "in float32 from T = 150" in check.outcome.summary


def test_the_ssd_linear_check_fails_when_the_chunked_flops_grow_quadratically(monkeypatch) -> None:
    assert check_ssd_linear((7, 65)).outcome.outcome == "supported"
    real = sma_checks.flop_growth

    def as_if_quadratic(lengths, **kw):
        res = real(lengths, **kw)
        return {**res, "growth": {**res["growth"], "chunked": res["growth"]["quadratic"]}}

    monkeypatch.setattr(sma_checks, "flop_growth", as_if_quadratic)
    assert check_ssd_linear((7, 65)).outcome.outcome == "contradicted"


@pytest.mark.parametrize("smoke", [True])
def test_outcomes_are_those_the_chapter_computes_in_its_order(smoke: bool) -> None:
    """The register and the chapter call the same checks on one generator seeded 42."""
    out = sma_checks.outcomes(smoke=smoke)
    g = g42()
    low = check_low_rank_mask(g)
    assert out["sma/low-rank-mask"].summary == low.outcome.summary

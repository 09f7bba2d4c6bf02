"""The attention contract of ``atlas report`` (issue 54): every built-in variant keeps it, and a
broken variant fails exactly the checks its fault breaks, with a detail naming the cause."""

from __future__ import annotations

import atlas_variants
import pytest
import torch
from torch import Tensor

from attention_atlas.attention import AttentionResult, register_attention
from attention_atlas.attention.dot import DotProductAttention
from attention_atlas.experiments.atlas.contract import (
    CHECKS,
    FATAL,
    INFORMATIONAL,
    check_contract,
    contract_table,
    failed,
)
from attention_atlas.validate import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")


# the report's broken variants (tests/atlas_variants.py), registered under this file's names
register_attention("test_atlas_contract_peek")(
    type("ContractPeek", (atlas_variants.PeekingAttention,), {})
)
register_attention("test_atlas_contract_nan")(
    type("ContractNaN", (atlas_variants.NaNAttention,), {})
)


@register_attention("test_atlas_contract_short")
class ShortAttention(DotProductAttention):
    """Returns one position fewer than it was given: the wrong shape."""

    def forward(self, x: Tensor, **kw: object) -> AttentionResult:  # type: ignore[override]
        res = super().forward(x, **kw)  # type: ignore[arg-type]
        res.out = res.out[:, 1:]
        return res


@register_attention("test_atlas_contract_raises")
class RaisingAttention(DotProductAttention):
    """Its forward raises."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, **kw: object) -> AttentionResult:
        raise RuntimeError("boom in attend")


class _DoubledGrad(torch.autograd.Function):
    """Identity forward, twice the gradient backward."""

    @staticmethod
    def forward(ctx: object, t: Tensor) -> Tensor:
        return t.clone()

    @staticmethod
    def backward(ctx: object, g: Tensor) -> Tensor:
        return 2 * g


@register_attention("test_atlas_contract_badgrad")
class BadGradAttention(DotProductAttention):
    """Right output, wrong backward."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, **kw: object) -> AttentionResult:
        res = super().attend(q, k, v, **kw)  # type: ignore[arg-type]
        res.out = _DoubledGrad.apply(res.out)
        return res


@register_attention("test_atlas_contract_unbuildable")
class UnbuildableAttention(DotProductAttention):
    def __init__(self, dim: int, n_heads: int, **kw: object) -> None:
        raise TypeError("cannot be built")


def by_name(checks: list) -> dict:
    return {c.name: c for c in checks}


def test_dot_product_attention_keeps_every_check() -> None:
    checks = check_contract("dot")
    assert [c.name for c in checks] == list(CHECKS)
    for c in checks:
        assert c.passed is (None if c.name in INFORMATIONAL else True), (c.name, c.detail)
        assert "\n" not in c.detail
    got = by_name(checks)
    assert "permutation-equivariant" in got["permutation"].detail
    assert "rows sum to 1" in got["shape"].detail
    if not torch.cuda.is_available():
        assert "cuda not available here" in got["device"].detail


def test_a_variant_that_peeks_at_the_next_token_fails_causal_and_length_one() -> None:
    got = by_name(check_contract("test_atlas_contract_peek"))
    assert failed(list(got.values())) == ["causal", "length-1"]
    # the earliest leak: position 0 sees token 1
    assert got["causal"].detail.startswith("position 0 depends on token 1 (a later token)")
    assert "token 0 alone differs from position 0" in got["length-1"].detail


def test_a_variant_that_returns_nan_fails_finite_and_the_rest_is_not_run() -> None:
    got = by_name(check_contract("test_atlas_contract_nan"))
    assert failed(list(got.values())) == ["finite"]
    assert got["finite"].detail.startswith("non-finite output on Gaussian input")
    for name in ("causal", "gradcheck", "length-1", "permutation", "non-finite input"):
        assert got[name].passed is None and "needs 'finite'" in got[name].detail


def test_a_variant_with_the_wrong_shape_fails_shape_naming_expected_and_got() -> None:
    got = by_name(check_contract("test_atlas_contract_short"))
    assert failed(list(got.values())) == ["shape"]
    assert "out has shape (1, 0, 16), expected (1, 1, 16)" in got["shape"].detail


def test_a_variant_whose_forward_raises_fails_with_its_error_in_one_line() -> None:
    got = by_name(check_contract("test_atlas_contract_raises"))
    assert failed(list(got.values()), fatal=True) == ["shape"]
    assert got["shape"].detail == "RuntimeError: boom in attend"


def test_wrong_gradients_fail_gradcheck_only() -> None:
    got = by_name(check_contract("test_atlas_contract_badgrad"))
    assert failed(list(got.values())) == ["gradcheck"]
    assert got["gradcheck"].detail.startswith("gradients disagree with finite differences")


def test_a_variant_that_cannot_be_built_fails_builds_and_runs_nothing_else() -> None:
    checks = check_contract("test_atlas_contract_unbuildable")
    assert failed(checks) == ["builds"]
    assert checks[0].detail == "TypeError: cannot be built"
    assert all(c.passed is None for c in checks[1:])


def test_options_reach_the_constructor() -> None:
    assert check_contract("dot", {"temperature": 0.5})[0].detail.endswith(
        "temperature=0.5): 1024 parameters"
    )
    bad = check_contract("dot", {"nope": 1})[0]
    assert bad.passed is False and "does not take option(s) ['nope']" in bad.detail


def test_a_causal_only_variant_keeps_the_contract_and_says_so() -> None:
    got = by_name(check_contract("ssm", dim=8, n_heads=2))
    assert not failed(list(got.values()))
    assert "causal-only" in got["shape"].detail
    assert got["permutation"].detail.startswith("not applicable: causal-only")


def test_the_fatal_set_names_checks_that_exist() -> None:
    assert FATAL <= set(CHECKS) and not FATAL & INFORMATIONAL
    assert {"builds", "shape", "finite", "causal", "gradcheck"} == FATAL


def test_contract_table_has_a_row_per_check() -> None:
    table = contract_table(check_contract("test_atlas_contract_peek"))
    assert list(table.columns) == ["check", "passed", "fatal", "detail"]
    assert table["check"].tolist() == list(CHECKS)
    row = table.set_index("check").loc["causal"]
    assert row["passed"] is False and row["fatal"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dim": 0}, "check_contract dim: expected an integer >= 1, got 0"),
        ({"n_heads": -1}, "check_contract n_heads: expected an integer >= 1, got -1"),
        ({"device": "nowhere"}, "check_contract device: expected a torch device"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_contract("dot", **kwargs)

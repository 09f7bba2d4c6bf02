"""The claims register as a referee reads it: every claim declares its form before data, the
rule that decides it follows that form (a mismatch is an error, not a verdict), no decided
empirical outcome lacks its witness or rests on a zero-width interval, and the cases issue 52
named are re-decided by the new rule. The stored register is read instead of recomputed."""

from __future__ import annotations

import pytest

from attention_atlas import claims
from attention_atlas.claims import CLAIMS, checked, claim, evaluate, referee_report
from attention_atlas.stats import FORMS, Interval
from attention_atlas.verdicts import Outcome


def test_every_claim_declares_form_margin_test_and_location() -> None:
    assert len({c.key for c in CLAIMS}) == len(CLAIMS)
    for c in CLAIMS:
        assert c.form in FORMS, c.key
        assert c.source and c.statement and c.declared, c.key
        if c.form in ("superiority", "non-inferiority", "equivalence") and c.module:
            assert c.margin is not None and c.margin > 0, c.key
        if not c.module:
            assert c.untested, c.key
        if c.form == "ill-posed":
            assert c.untested and not c.module, c.key


def _claim(form: str, margin: float | None = 0.02):
    return claims.Claim("x/y", "riemannian", "s", "hypothesis", "t", "", "", "m", "", form,
                        margin, "declared")  # fmt: skip


@pytest.mark.parametrize(
    ("form", "outcome", "message"),
    [
        ("non-inferiority", Outcome("contradicted", "s", Interval(0.08, 0.05, 0.11, 5), 0.02,
                                    form="equivalence", witness="w"), "decided as equivalence"),
        ("superiority", Outcome("supported", "s", Interval(0.08, 0.05, 0.11, 5), 0.05,
                                form="superiority", witness="w"), "declared margin 0.02"),
        ("superiority", Outcome("supported", "s", Interval(0.08, 0.05, 0.11, 5), 0.02,
                                form="superiority"), "without its witness"),
        ("equivalence", Outcome("supported", "s", Interval(0.0, 0.0, 0.0, 5), 0.02,
                                form="equivalence", witness="w"), "zero-width"),
        ("exact", Outcome("supported", "s"), "says no form"),
    ],
)  # fmt: skip
def test_an_outcome_not_decided_by_the_declared_rule_is_refused(form, outcome, message) -> None:
    with pytest.raises(ValueError, match=message):
        checked(_claim(form), outcome)
    good = Outcome("supported", "s", Interval(0.08, 0.05, 0.11, 5), 0.02, form=form,
                   witness="w") if form != "exact" else Outcome("supported", "s", form="exact")  # fmt: skip
    if form != "equivalence":
        assert checked(_claim(form), good) is good


def test_the_cases_issue_52_named_are_re_decided_by_their_forms() -> None:
    """On the stored grids: a better result never contradicts a non-inferiority claim, a count
    with no events decides nothing, a metric that grew 10^4-fold has not collapsed, and a
    theorem checked only on generic draws is held to every case its words cover."""
    keys = ["cofactor/zoo-accuracy", "matroidal/stability", "matroidal/pruning", "riemannian/P3",
            "riemannian/thm-3.2", "matroidal/zoo-low-data", "matroidal/low-data"]  # fmt: skip
    out = evaluate([claim(k) for k in keys], recompute=True)
    acc = out["cofactor/zoo-accuracy"]
    assert (acc.outcome, acc.form) == ("supported", "non-inferiority") and acc.effect.low > 0
    assert (out["matroidal/stability"].outcome, out["matroidal/stability"].reason) == (
        "not tested",
        "no events",
    )
    assert out["matroidal/pruning"].outcome != "contradicted"
    p3 = out["riemannian/P3"]
    assert p3.outcome == "contradicted" and "growth of log10 mean kappa" in p3.summary
    thm = out["riemannian/thm-3.2"]
    assert thm.outcome == "contradicted" and "holds generically" in thm.summary
    assert "fails for" in thm.summary and "rank 12" in thm.summary
    # one hypothesis, two tests: the register says they test different things
    low, zoo = claim("matroidal/low-data"), claim("matroidal/zoo-low-data")
    assert "interaction" in low.declared and "main effect" in zoo.declared


def test_stored_outcomes_are_read_without_computing_anything(monkeypatch) -> None:
    import attention_atlas.experiments.non_gram as ng

    def boom(smoke: bool = False):
        raise AssertionError("computed although stored")

    monkeypatch.setattr(ng, "outcomes", boom)
    subset = [c for c in CLAIMS if c.module.endswith(".non_gram")]
    stored = {"non_gram": {c.key: Outcome("supported", "stored", form="exact") for c in subset}}
    out = evaluate(subset, stored=stored)
    assert {o.summary for o in out.values()} == {"stored"}
    with pytest.raises(AssertionError, match="computed although stored"):
        evaluate(subset, recompute=True)


def test_the_register_experiment_stores_outcomes_that_read_back_equal(tmp_path, monkeypatch):
    from attention_atlas.experiments import register as reg
    from attention_atlas.experiments import run_experiment

    monkeypatch.setenv("ATTENTION_ATLAS_RESULTS", str(tmp_path))
    run_experiment("claims", preset="smoke", params={"modules": ["non_gram"]}, seeds=[0],
                   log=None, progress=False)  # fmt: skip
    from attention_atlas.store.results import load_grid

    (rec,) = load_grid("claims", "smoke").records.values()
    direct = __import__("attention_atlas.experiments.non_gram", fromlist=["x"]).outcomes(True)
    back = {k: reg.outcome_from_json(v) for k, v in rec["outcomes"].items()}
    assert back == direct


def test_a_referee_report_lists_errata_holds_and_open_from_the_register() -> None:
    import pandas as pd

    rows = pd.DataFrame([
        {"key": "sma/a", "seed": "sma", "source": "Sec. 1", "form": "exact",
         "outcome": "contradicted", "summary": "fails at T = 3", "scale": None, "reason": None},
        {"key": "sma/b", "seed": "sma", "source": "Sec. 2", "form": "ill-posed",
         "outcome": "not tested", "summary": "O(T) with no constant", "scale": None,
         "reason": "ill-posed"},
        {"key": "sma/c", "seed": "sma", "source": "Sec. 3", "form": "superiority",
         "outcome": "not tested", "summary": "needs 5 seeds of a 100M model", "scale": None,
         "reason": "not run"},
    ])  # fmt: skip
    text = referee_report(rows, "sma")
    assert "3 claims registered: 0 hold, 1 are contradicted, 1 are ill-posed" in text
    assert "**a** (Sec. 1; exact): fails at T = 3" in text
    assert "ill-posed as written: O(T) with no constant" in text
    assert "not tested (not run): needs 5 seeds" in text
    with pytest.raises(ValueError, match="unknown seed"):
        referee_report(rows, "nosuch")


def test_the_stored_register_has_a_cell_for_every_module_the_register_names() -> None:
    from attention_atlas.experiments.register import MODULES

    named = {c.module.removeprefix("attention_atlas.experiments.") for c in CLAIMS if c.module}
    assert named == set(MODULES)


def test_the_register_covers_the_seeds() -> None:
    """At least 120 claims, 80 of them from the Riemannian paper (the longest seed), and every
    seed has claims of more than one form."""
    by_seed = {s: [c for c in CLAIMS if c.seed == s] for s in claims.SEEDS}
    assert len(CLAIMS) >= 120 and len(by_seed["riemannian"]) >= 80
    assert all(len({c.form for c in cs}) >= 2 for cs in by_seed.values())

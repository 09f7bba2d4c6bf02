"""Chapter 4's verdicts: each claim of chapter 4 decided from the grid's runs.

Each prediction P1 to P6 of the Riemannian-attention paper as an effect
against a control, decided by the library's one rule (:func:`attention_atlas.stats.verdict`)
against a smallest effect of interest (:data:`~.rule.SESOI`, each with its reason), at the
training scale of the runs (:func:`~.rule.training_scale`), on models whose geometry passes the
gate (:mod:`.gate`); the eq. (25) identity checked in float64 (:func:`eq25_counterexample`);
and the cost claim from an interleaved timing (:func:`overhead_verdict`).
:func:`outcomes_from_runs` gives every claim's :class:`~attention_atlas.verdicts.Outcome`
(the gate's claims included); the chapter and ``python -m attention_atlas claims`` call it on the
same stored grid. The names of :mod:`.rule`, :mod:`.cap` and :mod:`.gate` the chapter reads are
re-exported here.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from attention_atlas.attention.riemannian.geometry import (
    isometry_defect,
    torsion_dense,
    transport_dense,
)
from attention_atlas.stats import (
    Verdict,
    mean_interval,
    non_inferiority,
    paired_difference,
    verdict,
)
from attention_atlas.verdicts import (
    Outcome,
    TrainingScale,
    outcome_from_check,
    outcome_from_verdict,
)

from .analysis import Runs
from .cap import cap_check, cap_outcome, cap_setting
from .gate import (
    GATE_SINCE,
    GATES,
    MATCHED,
    RUNAWAY,
    Gate,
    divergence_finding,
    divergence_outcome,
    gate_reason,
    gate_table,
    gated,
    geometry_gate,
    long_regate_command,
    matched_dot_outcome,
    matched_dot_verdicts,
    mqar_matched_outcome,
    mqar_matched_verdicts,
    ungated,
)
from .rule import SESOI, SESOI_REASON, at_scale, diverged_reason, training_scale, weakest
from .run import load_gate_runs, load_runs, timing_for

__all__ = [
    "GATE_SINCE",
    "GATES",
    "MATCHED",
    "RUNAWAY",
    "SESOI",
    "SESOI_REASON",
    "Gate",
    "at_scale",
    "cap_check",
    "cap_outcome",
    "cap_setting",
    "diverged_reason",
    "divergence_finding",
    "divergence_outcome",
    "eq25_counterexample",
    "gate_reason",
    "gate_table",
    "gated",
    "geometry_gate",
    "long_regate_command",
    "matched_control",
    "matched_dot_outcome",
    "matched_grid",
    "mqar_claim_grid",
    "matched_dot_verdicts",
    "mqar_matched_outcome",
    "mqar_matched_verdicts",
    "outcomes",
    "outcomes_from_runs",
    "ungated",
    "overhead_verdict",
    "p1_levels",
    "p1_verdict",
    "p2_verdict",
    "p3_verdicts",
    "p4_verdicts",
    "p5_verdict",
    "p6_verdict",
    "training_scale",
    "weakest",
]


# -- P1 --------------------------------------------------------------------------------------


def p1_levels(runs: Runs) -> dict[float, str]:
    """The imposed metric levels of P1: ``kappa_max`` in units of ``tau / L`` -> configuration
    (the default model and every ``fbt_kappa-<c>``), in increasing order."""
    levels = {float(p["kappa_factor"]): name for name, p in runs.grid.items()
              if name == "fbt" or name.startswith("fbt_kappa-")}  # fmt: skip
    return dict(sorted(levels.items()))


def p1_verdict(runs: Runs) -> tuple[Verdict, dict[str, Any]]:
    """P1: the attention's sigma_2 (mean over blocks) of the strongest imposed metric minus that of
    the weakest, paired by seed, predicted to rise (collapse resisted) once the perturbation scale
    ``U-bar^2 M / tau`` of Proposition 3.5 passes 1. Not tested unless the weakest level is
    sub-critical and the strongest super-critical (their mean scales on either side of 1), nor
    when the strongest level's geometry fails the gate (:func:`gate_reason`; the weakest is
    meant to be near-Euclidean)."""
    levels = p1_levels(runs)
    lo, hi = levels[min(levels)], levels[max(levels)]
    scale = {n: runs.mean_over_layers(n, "entry_scale_{l}") for n in levels.values()}
    diverged = diverged_reason(runs, [lo, hi])
    if diverged:
        v = verdict(None, sesoi=SESOI["sigma2"], direction=1, not_tested=diverged)
        return v, {"weakest": lo, "strongest": hi, "scale": scale}
    inert = gated(gate_reason(runs, [hi]), SESOI["sigma2"])  # the weakest may be Euclidean
    if inert:
        return inert, {"weakest": lo, "strongest": hi, "scale": scale}
    effect = paired_difference(runs.mean_over_layers(hi, "sigma2_{l}"),
                               runs.mean_over_layers(lo, "sigma2_{l}"))  # fmt: skip
    s_lo, s_hi = float(scale[lo].mean()), float(scale[hi].mean())
    reason = None
    if len(levels) < 2 or not s_lo < 1.0 < s_hi:
        reason = (f"the imposed levels do not straddle the critical scale: U-bar^2 M / tau is "
                  f"{s_lo:.3g} at the weakest and {s_hi:.3g} at the strongest")  # fmt: skip
    v = verdict(effect, sesoi=SESOI["sigma2"], direction=1, not_tested=reason)
    return v, {"weakest": lo, "strongest": hi, "scale": scale}


# -- P2 --------------------------------------------------------------------------------------


def p2_names(runs: Runs) -> dict[float, str]:
    """Training alpha -> configuration of P2 (the default model is alpha = 1)."""
    names = {float(p["model"].get("alpha", 1.0)): name for name, p in runs.grid.items()
             if name == "fbt" or name.startswith("fbt_alpha-")}  # fmt: skip
    return dict(sorted(names.items()))


def p2_gaps(runs: Runs) -> dict[tuple[float, float], np.ndarray]:
    """Per mismatched ``(alpha_train, alpha_eval)``: per seed, the bits per character of the model
    trained at ``alpha_train`` evaluated at ``alpha_eval``, minus that of the model trained at
    ``alpha_eval`` (the retrained control of Proposition 6.2)."""
    names = p2_names(runs)
    return {(a, b): runs.per_seed(names[a], f"bpc_at_alpha_{b:g}")
            - runs.per_seed(names[b], f"bpc_at_alpha_{b:g}")
            for a in names for b in names if a != b}  # fmt: skip


def p2_verdict(runs: Runs) -> Verdict:
    """P2: the mean over mismatched pairs of :func:`p2_gaps`, per seed, predicted positive; not
    tested when an arm trained with the Riemannian score (alpha > 0) fails the gate."""
    names = p2_names(runs)
    diverged = diverged_reason(runs, list(names.values()))
    if diverged:
        return verdict(None, sesoi=SESOI["bpc"], not_tested=diverged)
    inert = gated(gate_reason(runs, [n for a, n in names.items() if a > 0]), SESOI["bpc"])
    if inert:
        return inert
    gaps = p2_gaps(runs)
    if not gaps:
        return verdict(None, sesoi=SESOI["bpc"], not_tested="only one training alpha in the grid")
    return verdict(mean_interval(np.mean(list(gaps.values()), axis=0)), sesoi=SESOI["bpc"])


# -- P3 --------------------------------------------------------------------------------------


def log_kappa_growth(runs: Runs, config: str) -> np.ndarray:
    """Per seed: ``log10(mean kappa after training / mean kappa at initialisation)``, ``kappa``
    averaged over blocks, both on the same validation windows."""
    return np.log10(runs.mean_over_layers(config, "kappa_{l}_mean")
                    / runs.mean_over_layers(config, "init_kappa_{l}_mean"))  # fmt: skip


def p3_verdicts(runs: Runs) -> dict[str, Verdict]:
    """P3: the metric's growth over training (:func:`log_kappa_growth`) without geometric
    regulariser (``none``), and with the task-matched l2 penalty (``l2``), each minus that of the
    noise-gradient control (MetricNet trained on noise of the task gradient's size), paired by
    seed; and each arm's own growth (``none_own``, ``l2_own``: ``U_t -> 0`` means the metric
    shrinks from where it started, whatever a control does). Collapse predicts a decrease of
    both: a metric that grows, even less than the control's, has not collapsed."""
    out = {}
    for arm, name in (("none", "fbt_reg-none"), ("l2", "fbt_reg-l2")):
        diverged = diverged_reason(runs, [name, "fbt_noise"])
        effect = None if diverged else paired_difference(
            log_kappa_growth(runs, name), log_kappa_growth(runs, "fbt_noise")
        )  # fmt: skip
        out[arm] = verdict(effect, sesoi=SESOI["log10_kappa"], direction=-1, not_tested=diverged)
        own = None if diverged else mean_interval(np.asarray(log_kappa_growth(runs, name)))
        out[f"{arm}_own"] = verdict(own, sesoi=SESOI["log10_kappa"], direction=-1,
                                    not_tested=diverged)  # fmt: skip
    return out


# -- P4 --------------------------------------------------------------------------------------


def p4_verdicts(runs: Runs, config: str = "fbt") -> dict[str, Verdict]:
    """P4 on the model trained with the diversity regulariser: the CV of ``kappa_t`` after
    training minus at initialisation (``cv``), and the rank correlation of ``kappa_t`` with the
    surprisal after training minus at initialisation (``spearman``, both against the trained
    model's surprisal); both means over blocks, paired by seed, predicted to rise."""
    out = {}
    diverged = diverged_reason(runs, [config])
    for key, stem in (("cv", "cv"), ("spearman", "spearman_surprisal")):
        if diverged:
            out[key] = verdict(None, sesoi=SESOI[key], direction=1, not_tested=diverged)
            continue
        trained = runs.mean_over_layers(config, "kappa_{l}_" + stem)
        init = runs.mean_over_layers(config, "init_kappa_{l}_" + stem)
        out[key] = verdict(paired_difference(trained, init), sesoi=SESOI[key], direction=1)
    return out


# -- P5 --------------------------------------------------------------------------------------


def matched_control(target: float, xs: np.ndarray, ys: np.ndarray) -> float:
    """The control's value at ``target``: ``ys`` linearly interpolated over ``xs`` (the dot
    models' attention entropies and effective ranks, one point per temperature), NaN when
    ``target`` lies outside the range of ``xs`` (no extrapolation)."""
    order = np.argsort(xs)
    x, y = np.asarray(xs, float)[order], np.asarray(ys, float)[order]
    if not (x[0] <= target <= x[-1]):
        return math.nan
    return float(np.interp(target, x, y))


def dot_arms(runs: Runs) -> list[str]:
    """The dot-product configurations (the baseline and its temperatures)."""
    return [n for n in runs.grid if n == "dot" or n.startswith("dot_temp-")]


def p5_matched(runs: Runs, config: str = "fbt") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per seed: ``config``'s attention entropy (mean over blocks), its last block's effective
    rank, and the entropy-matched dot-product control's (:func:`matched_control` over the
    temperature arms of that seed; NaN when the temperatures do not reach that entropy)."""
    last, dots = runs.n_layers, dot_arms(runs)
    ent = runs.mean_over_layers(config, "entropy_{l}")
    rank = runs.per_seed(config, f"erank_{last}")
    dot_ent = np.array([runs.mean_over_layers(n, "entropy_{l}") for n in dots])  # (arms, seeds)
    dot_rank = np.array([runs.per_seed(n, f"erank_{last}") for n in dots])
    matched = np.array([matched_control(ent[s], dot_ent[:, s], dot_rank[:, s])
                        for s in range(len(runs.seeds))])  # fmt: skip
    return ent, rank, matched


def p5_verdict(runs: Runs, config: str = "fbt") -> Verdict:
    """P5: ``config``'s last-block effective rank minus the entropy-matched dot-product
    control's, paired by seed, predicted positive; not tested when, for some seed, no
    temperature arm is as sharp (or as flat) as ``config``'s attention, or when ``config``'s
    geometry fails the gate."""
    diverged = diverged_reason(runs, [config, *dot_arms(runs)])
    if diverged:
        return verdict(None, sesoi=SESOI["erank"], direction=1, not_tested=diverged)
    inert = gated(gate_reason(runs, [config]), SESOI["erank"])
    if inert:
        return inert
    ent, rank, matched = p5_matched(runs, config)
    if not np.isfinite(matched).all():
        dot_ent = [runs.layer_interval(n, "entropy_{l}").mean for n in dot_arms(runs)]
        return verdict(None, sesoi=SESOI["erank"], not_tested=(
            f"the dot-product temperatures give attention entropies {min(dot_ent):.2f} to "
            f"{max(dot_ent):.2f} nats, which do not reach {config}'s ({np.mean(ent):.2f}) at "
            f"every seed"))  # fmt: skip
    return verdict(paired_difference(rank, matched), sesoi=SESOI["erank"], direction=1)


# -- P6 --------------------------------------------------------------------------------------


def p6_names(runs: Runs) -> dict[int, str]:
    """Metric rank -> configuration (the default model has its own rank)."""
    names = {int(p["model"].get("rank", 4)): name for name, p in runs.grid.items()
             if name == "fbt" or name.startswith("fbt_rank-")}  # fmt: skip
    return dict(sorted(names.items()))


def p6_verdict(runs: Runs) -> Verdict:
    """P6: the last block's effective rank at the largest metric rank minus at the smallest,
    paired by seed, predicted positive; not tested when either arm's geometry fails the gate."""
    names = p6_names(runs)
    lo, hi = names[min(names)], names[max(names)]
    diverged = diverged_reason(runs, [lo, hi])
    if diverged:
        return verdict(None, sesoi=SESOI["erank"], not_tested=diverged)
    inert = gated(gate_reason(runs, [lo, hi]), SESOI["erank"])
    if inert:
        return inert
    return verdict(runs.paired(hi, lo, f"erank_{runs.n_layers}"), sesoi=SESOI["erank"])


# -- eq. (25) and the cost ---------------------------------------------------------------------


def eq25_counterexample(d: int = 8, r: int = 2, seed: int = 0) -> dict[str, float]:
    """Eq. (25) says ``||Delta^T Delta||_F = ||Delta||_F^2`` for ``Delta = A B^T - B A^T``. In
    float64, for random ``A, B (d, r)``: ``lhs = ||Delta^T Delta||_F``, ``rhs = ||Delta||_F^2``,
    the dense ``defect = ||P^T P - I||_F`` of ``P = I + Delta`` (equal to ``lhs``), the library's
    low-rank :func:`isometry_defect`, and the bound ``rhs / sqrt(2)`` that holds instead (the
    singular values of a real antisymmetric matrix come in equal pairs)."""
    g = torch.Generator().manual_seed(seed)
    a, b = (torch.randn(d, r, generator=g, dtype=torch.float64) for _ in range(2))
    delta = torsion_dense(a, b)
    P = transport_dense(a, b, "linear")
    eye = torch.eye(d, dtype=torch.float64)
    return {
        "lhs": float(torch.linalg.matrix_norm(delta.T @ delta)),
        "rhs": float(torch.linalg.matrix_norm(delta) ** 2),
        "defect": float(torch.linalg.matrix_norm(P.T @ P - eye)),
        "lowrank": float(isometry_defect(a, b)),
        "bound": float(torch.linalg.matrix_norm(delta) ** 2 / math.sqrt(2)),
    }


def overhead_verdict(timing: dict[str, Any], name: str = "fbt") -> Verdict:
    """The cost claim: per interleaved round of :func:`attention_atlas.bench.timing.compare`, the log of
    the forward+backward time of ``name`` over the dot-product model's (a log ratio: a loaded
    machine's slow rounds scale both); predicted negligible: a non-inferiority claim, lower is
    better, the margin ``SESOI["overhead"]`` (log 1.25: at most 25% slower)."""
    res = timing["results"]
    ratio = np.asarray(res[name]["forward_backward"]["samples_s"]) / np.asarray(
        res["dot"]["forward_backward"]["samples_s"]
    )
    return non_inferiority(mean_interval(np.log(ratio)), margin=SESOI["overhead"], better=-1)


# -- every claim --------------------------------------------------------------------------------


def _training(v: Verdict, what: str, scale: TrainingScale, evidence: str, **extra: Any) -> Outcome:
    return outcome_from_verdict(v, what, scale=scale, evidence=evidence, extra=extra)


def outcomes_from_runs(
    runs: Runs,
    timing: dict[str, Any],
    *,
    evidence: str,
    check_size: tuple[int, int] = (8, 2),
    gate: tuple[Runs | None, Any] = (None, None),
    mqar: tuple[Runs | None, Any] = (None, None),
) -> dict[str, Outcome]:
    """The outcome of every chapter-4 claim of the register from a finished grid ``runs``, an
    interleaved ``timing`` of at least ``dot`` and ``fbt`` (:func:`fiber_bundle.step_timing`),
    and the float64 eq. (25) check at ``check_size = (d, r)``. ``evidence``: the grid's
    provenance, recorded in each empirical outcome. ``gate``: the grid the matched-dot
    comparison is decided on (:func:`matched_grid`); ``mqar``: its MQAR half
    (:func:`mqar_claim_grid`)."""
    scale = training_scale(runs)
    p1, _ = p1_verdict(runs)
    p3, p4 = p3_verdicts(runs), p4_verdicts(runs)
    c = eq25_counterexample(*check_size)
    cap = cap_check(**cap_setting(runs))
    holds = abs(c["lhs"] - c["rhs"]) <= 1e-12 * c["rhs"]
    overhead = overhead_verdict(timing)
    cost_meta = timing.get("meta", {})
    return {
        "riemannian/eq-25": outcome_from_check(
            holds,
            f"||Delta^T Delta||_F = ||Delta||_F^2 = {c['rhs']:.6g} for a random Delta (d, r) = "
            f"{check_size} in float64",
            f"for a random Delta with (d, r) = {check_size} in float64, ||Delta^T Delta||_F = "
            f"{c['lhs']:.6g} but ||Delta||_F^2 = {c['rhs']:.6g}; what holds is ||Delta^T Delta||_F "
            f"<= ||Delta||_F^2 / sqrt(2) = {c['bound']:.6g}",
            extra=c,
        ),
        "riemannian/eq-34": cap_outcome(cap),
        "riemannian/P1": _training(
            p1,
            "P1: attention sigma_2, strongest minus weakest imposed metric (paired by seed)",
            scale,
            evidence,
        ),  # fmt: skip
        "riemannian/P2": _training(
            p2_verdict(runs),
            "P2: bpc of a model evaluated at another alpha minus the model trained at that alpha",
            scale,
            evidence,
        ),  # fmt: skip
        "riemannian/P3": _training(
            weakest([p3["none_own"], p3["l2_own"], p3["none"], p3["l2"]]),
            "P3: growth of log10 mean kappa from initialisation to the end (no regulariser: "
            f"{at_scale(p3['none_own'], scale)}; task-matched l2: "
            f"{at_scale(p3['l2_own'], scale)}), and minus the noise-gradient control's (no "
            f"regulariser: {at_scale(p3['none'], scale)}; l2: {at_scale(p3['l2'], scale)})",
            scale,
            evidence,
        ),  # fmt: skip
        "riemannian/P4": _training(
            weakest([p4["cv"], p4["spearman"]]),
            "P4: trained minus initial "
            f"(CV of kappa_t: {at_scale(p4['cv'], scale)}; Spearman with surprisal: "
            f"{at_scale(p4['spearman'], scale)})",
            scale,
            evidence,
        ),  # fmt: skip
        "riemannian/P5": _training(
            p5_verdict(runs),
            "P5: last-block effective rank minus the entropy-matched dot-product model's",
            scale,
            evidence,
        ),  # fmt: skip
        "riemannian/P6": _training(
            p6_verdict(runs),
            "P6: last-block effective rank, largest minus smallest metric rank",
            scale,
            evidence,
        ),  # fmt: skip
        "riemannian/regularised-kappa-band": divergence_outcome(runs, scale, evidence),
        "riemannian/fbt-vs-matched-dot": matched_dot_outcome(*gate),
        "riemannian/fbt-vs-matched-dot-mqar": mqar_matched_outcome(*mqar),
        "riemannian/overhead": outcome_from_verdict(
            overhead,
            f"log of the time per training step over dot product's ({cost_meta.get('shape', '')}; "
            f"ratio {math.exp(overhead.effect.mean) if overhead.effect else math.nan:.2f})",
            scale=None,
            evidence="computed now (interleaved timing)",
        ),
    }


def outcomes(smoke: bool = False) -> dict[str, Outcome]:
    """The outcome of every chapter-4 claim of the register (``riemannian/eq-25``, ``P1`` to
    ``P6``, ``overhead``): the stored grid (long when complete, else book; with ``smoke`` the
    stored grid too when there is one, else the smoke grid run now), a fresh interleaved timing
    at its shape (fewer rounds with ``smoke``) and the float64 eq. (25) check."""
    runs, grid = load_runs(smoke=smoke, use_stored=True, log=None)
    timing = timing_for(runs, reps=3 if smoke else 5)
    return outcomes_from_runs(runs, timing, evidence=grid.provenance.text,
                              check_size=(6, 1) if smoke else (8, 2),
                              gate=matched_grid(), mqar=mqar_claim_grid())  # fmt: skip


def mqar_claim_grid() -> tuple[Runs | None, Any]:
    """The grid ``riemannian/fbt-vs-matched-dot-mqar`` is decided on: the stored
    ``gate-mqar-long`` grid (chapter 9's long protocol at the cell where the dot-product baseline
    is far from the ceiling; not tested while it is incomplete), else, before it was started,
    the ``gate-mqar`` grid (the centre cell, where every dot-product control saturates)."""
    hard = load_gate_runs("gate-mqar-long")
    return hard if hard[1] is not None else load_gate_runs("gate-mqar")


def matched_grid() -> tuple[Runs | None, Any]:
    """The grid ``riemannian/fbt-vs-matched-dot`` is decided on: the stored ``matched`` grid
    (the comparison at a decisive scale; not tested while it is incomplete), else, before it
    was started, the stored ``gate`` grid (whose baseline is in the bigram regime: the outcome
    says so)."""
    matched = load_gate_runs("matched")
    return matched if matched[1] is not None else load_gate_runs()

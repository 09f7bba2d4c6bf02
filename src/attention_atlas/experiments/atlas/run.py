"""The report's experiment: one attention variant through every analysis of the atlas, as cells
of the one sweep runner (``python -m attention_atlas sweep atlas -p variant=SPEC``).

The grid of :func:`chapter_grid` holds, for the variant ``SPEC`` (see
:func:`~attention_atlas.experiments.atlas.variant.load_variant`):

* ``contract``: :func:`~attention_atlas.experiments.atlas.contract.check_contract` (shapes,
  dtypes, devices, causal masking by perturbation, float64 gradcheck, length 1, permutation,
  non-finite input);
* ``rank``: the numerical rank of its score matrix against length and head width, beside dot and
  the Riemannian scores (chapter 1's analysis);
* ``depth``: rank collapse in a deep stack of it, with and without residuals (chapter 2);
* ``cost``: forward and forward+backward time and peak memory against SDPA over lengths, with the
  FLOPs counted (chapter 8);
* chapter 9's cells for the variant and the dot control: the MQAR cross (widths and pairs, the
  learning rate chosen from the same set), char-PTB at the same wall-clock budget, and one
  training step timed side by side; built by :func:`attention_atlas.experiments.zoo.run.chapter_grid`
  with the zoo preset of the same name, so a book-preset report's cells are the stored zoo book
  grid's cells of that arm.

Each cell loads the variant again (a worker is another process) and never lets the variant's
failure stop the sweep: a probe that raises records the error; a training cell of a variant whose
contract fails a :data:`~attention_atlas.experiments.atlas.contract.FATAL` check is not run (it
records why), since a model that sees the future, or returns NaN, would make its scores mean
nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attention_atlas.attention.registry import attention_options
from attention_atlas.validate import ConfigError, check_count, one_line

from .variant import VariantError, canonical_spec, load_variant

__all__ = [
    "CONTROL",
    "NAME",
    "PRESETS",
    "ZOO_KINDS",
    "chapter_grid",
    "check_cell",
    "fatal_failures",
    "model_with",
    "run_cell",
]

#: the experiment's name on the command line and in the results store
NAME = "atlas"
#: the control of every comparison
CONTROL = "dot"
#: arms the expressiveness and depth probes run beside the variant (chapter 1 and 2's)
REFERENCE_ARMS = ("dot", "riemannian")
#: the cells that are chapter 9's (trained): run only for a variant that passes its contract
ZOO_KINDS = ("mqar", "ptb", "time")

#: ``python -m attention_atlas atlas report SPEC --preset NAME`` (and ``sweep atlas --preset
#: NAME``): the probes' sizes, and ``zoo``, the chapter-9 preset whose cells the report runs
PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {"zoo": "smoke", "rank_lengths": [4, 8], "head_dims": [2, 4], "depth": 4,
              "depth_width": 16, "depth_length": 8, "cost_lengths": [16, 32], "cost_dim": 16,
              "cost_heads": 2, "cost_batch": 2, "cost_reps": 2},
    "book": {},
    "long": {"zoo": "long", "rank_lengths": [8, 16, 32, 64, 128, 256], "head_dims": [4, 8, 16, 32],
             "depth": 48, "cost_lengths": [128, 256, 512, 1024, 2048], "cost_reps": 7},
}  # fmt: skip


def chapter_grid(
    *,
    variant: str = CONTROL,
    options: dict[str, Any] | None = None,
    zoo: str = "book",
    rank_lengths: Sequence[int] = (8, 16, 32, 64, 128),
    head_dims: Sequence[int] = (4, 8, 16),
    depth: int = 24,
    depth_width: int = 64,
    depth_length: int = 32,
    depth_heads: int = 4,
    cost_lengths: Sequence[int] = (64, 128, 256, 512),
    cost_dim: int = 64,
    cost_heads: int = 4,
    cost_batch: int = 4,
    cost_reps: int = 5,
    zoo_params: dict[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """The report's cells for ``variant`` (a spec), by name.

    Args:
        variant: the variant's spec (registered name, ``module:Class`` or ``file.py:Class``).
        options: its constructor options (besides ``dim`` and ``n_heads``), in every cell.
        zoo: the chapter-9 preset (``smoke``, ``book``, ``long``) of the trained cells;
            ``zoo_params`` override single parameters of it.
        rank_lengths / head_dims: the score-rank probe's lengths ``L`` and head widths ``d``.
        depth / depth_width / depth_length / depth_heads: the stacks of the depth probe.
        cost_*: the cost probe's lengths, layer width and heads, batch and timed repetitions.
    """
    from attention_atlas.experiments.zoo import run as zoo_run

    spec = canonical_spec(variant)
    v = load_variant(spec)
    opts = dict(options or {})
    if zoo not in zoo_run.PRESETS:
        raise ConfigError(f"zoo: expected one of {', '.join(zoo_run.PRESETS)}, got {zoo!r}")
    arm = {"variant": spec, "name": v.name, "options": opts}
    refs = [a for a in dict.fromkeys([v.name, *REFERENCE_ARMS])]
    configs: dict[str, dict[str, Any]] = {
        "contract": {"kind": "contract", **arm},
        "rank": {"kind": "rank", **arm, "arms": refs, "lengths": [int(x) for x in rank_lengths],
                 "head_dims": [int(x) for x in head_dims]},
        "depth": {"kind": "depth", **arm, "arms": refs, "depth": int(depth),
                  "width": int(depth_width), "length": int(depth_length),
                  "n_heads": int(depth_heads)},
        "cost": {"kind": "cost", **arm, "lengths": [int(x) for x in cost_lengths],
                 "dim": int(cost_dim), "n_heads": int(cost_heads), "batch": int(cost_batch),
                 "reps": int(cost_reps)},
    }  # fmt: skip
    zp = {**zoo_run.PRESETS[zoo], **(zoo_params or {})}
    zp.update(variants=list(dict.fromkeys([CONTROL, v.name])), ablations=False)
    if v.name not in zoo_run.VARIANTS:
        zp["centre_only"] = [a for a in zp.get("centre_only", ()) if a != v.name]
    for key, cell in zoo_run.chapter_grid(**zp).items():
        cell = _with_options(cell, v.name, opts)
        configs[key] = {**cell, "atlas": arm}
    return configs


def _with_options(cell: dict[str, Any], name: str, options: dict[str, Any]) -> dict[str, Any]:
    """A chapter-9 cell with the variant's constructor options in its model(s)."""
    if not options:
        return cell
    cell = dict(cell)
    if cell.get("variant") == name:
        model = dict(cell["model"])
        model["attention_options"] = {**model.get("attention_options", {}), **options}
        cell["model"] = model
        if "selection" in cell:
            cell["selection"] = {
                **cell["selection"],
                "model": model_with(cell["selection"]["model"], options),
            }
    if cell.get("kind") == "time":
        arms = {k: dict(m) for k, m in cell["arm_model"].items()}
        arms[name] = model_with(arms.get(name, {}), options)
        cell["arm_model"] = arms
    return cell


def model_with(model: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """``model`` with ``options`` added to its ``attention_options``."""
    return {**model, "attention_options": {**model.get("attention_options", {}), **options}}


def _zoo_part(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if k != "atlas"}


def check_cell(params: dict[str, Any]) -> None:
    """Check one cell before any work: the variant loads, the probes' sizes are counts, a
    chapter-9 cell passes :func:`attention_atlas.experiments.zoo.run.check_cell`. Raises
    ConfigError (one line)."""
    kind = params.get("kind")
    arm = params.get("atlas", params)
    try:
        name = load_variant(arm.get("variant", "")).name
    except VariantError as e:
        raise ConfigError(one_line(e)) from e
    options = arm.get("options", {})
    if not isinstance(options, dict):
        raise ConfigError(f"options: expected a dict of constructor options, got {options!r}")
    known = [k for k in attention_options(name) if k not in ("dim", "n_heads")]
    for key in options:  # its values are the variant's to judge: the contract's "builds" check
        if key not in known:
            raise ConfigError(
                f"options: {name} has no constructor option {key!r}; it takes: "
                f"{', '.join(known) or '(none)'}"
            )
    if kind in ZOO_KINDS:
        from attention_atlas.experiments.zoo import run as zoo_run

        zoo_run.check_cell(_zoo_part(params))
        return
    if kind not in ("contract", "rank", "depth", "cost"):
        raise ConfigError(
            f"kind: expected contract, rank, depth, cost or {', '.join(ZOO_KINDS)}, got {kind!r}"
        )
    sizes = {"rank": ("lengths", "head_dims"), "cost": ("lengths",)}.get(kind, ())
    for key in sizes:
        values = params.get(key)
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{key}: expected a non-empty list of counts, got {values!r}")
        for x in values:
            check_count(key, x)
    for key in {"depth": ("depth", "width", "length", "n_heads"),
                "cost": ("dim", "n_heads", "batch", "reps")}.get(kind, ()):  # fmt: skip
        check_count(key, params.get(key))


def fatal_failures(spec: str, options: dict[str, Any]) -> list[str]:
    """The :data:`~attention_atlas.experiments.atlas.contract.FATAL` checks the variant fails,
    as ``"name: detail"`` lines (empty when it may be trained)."""
    from .contract import FATAL, check_contract

    name = load_variant(spec).name
    return [f"{c.name}: {c.detail}" for c in check_contract(name, options)
            if c.name in FATAL and c.passed is False]  # fmt: skip


def _probe(params: dict[str, Any], seed: int) -> dict[str, Any]:
    """A probe cell: its table as rows (``table``), errors as ``error`` (one line)."""
    from . import probes

    name, opts = params["name"], params.get("options", {})
    kind = params["kind"]
    frames = []
    for arm in params.get("arms", [name]):
        o = opts if arm == name else {}
        if kind == "rank":
            frames.append(
                probes.score_rank_frame(
                    arm, o, lengths=params["lengths"], head_dims=params["head_dims"], seed=seed
                )
            )
        elif kind == "depth":
            for residual in (False, True):
                frames.append(probes.depth_frame(
                    arm, o, depth=params["depth"], width=params["width"], length=params["length"],
                    n_heads=params["n_heads"], seed=seed, residual=residual))  # fmt: skip
        else:
            frames.append(probes.cost_frame(
                arm, o, lengths=params["lengths"], dim=params["dim"], n_heads=params["n_heads"],
                batch=params["batch"], reps=params["reps"], seed=seed))  # fmt: skip
    import pandas as pd

    table = pd.concat(frames, ignore_index=True)
    errors = table["error"].dropna().astype(str) if "error" in table else pd.Series([], dtype=str)
    errors = errors[errors != ""]
    out: dict[str, Any] = {"kind": kind, "variant": name, "failed": float(len(errors) > 0),
                           "table": table.to_dict(orient="records")}  # fmt: skip
    if len(errors):
        out["error"] = errors.iloc[0]
    return out


def run_cell(params: dict[str, Any], seed: int) -> dict[str, Any]:
    """One cell of :func:`chapter_grid` at ``seed`` (see the module's docstring)."""
    kind = params["kind"]
    arm = params.get("atlas", params)
    name = load_variant(arm["variant"]).name
    if kind == "contract":
        from .contract import check_contract

        checks = check_contract(name, arm.get("options", {}), seed=seed)
        return {
            "kind": kind, "variant": name,
            "checks": [{"check": c.name, "passed": c.passed, "detail": c.detail} for c in checks],
            "failed": float(sum(c.passed is False for c in checks)),
        }  # fmt: skip
    if kind in ("rank", "depth", "cost"):
        return _probe(params, seed)
    from attention_atlas.experiments.zoo import run as zoo_run

    arms = [params["variant"]] if kind != "time" else list(params["variants"])
    if name in arms and name != CONTROL:
        fatal = fatal_failures(arm["variant"], arm.get("options", {}))
        if fatal:
            return {"kind": kind, "variant": params.get("variant", name), "skipped": 1.0,
                    "reason": f"not run: the contract check {fatal[0]}"}  # fmt: skip
    try:
        return zoo_run.run_cell(_zoo_part(params), seed)
    except Exception as e:  # the variant's own failure in training: reported, not raised
        if kind != "time" and params.get("variant") == CONTROL:
            raise
        return {"kind": kind, "variant": params.get("variant", name), "failed": 1.0,
                "error": f"{type(e).__name__}: {one_line(e)}"}  # fmt: skip

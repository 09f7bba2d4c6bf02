"""``python -m attention_atlas atlas report SPEC``: an attention variant of your own through the
atlas's analyses, as a report page beside the zoo (:mod:`attention_atlas.notebooks.report`)."""

from __future__ import annotations

import argparse
import inspect
from pathlib import Path
from typing import Any

from attention_atlas.validate import ConfigError, check_output_path, close_matches, one_line

#: constructor arguments every variant takes, which the report sets itself
_SET_BY_REPORT = ("dim", "n_heads")


def add_subcommand(subparsers: Any) -> None:
    """Register ``atlas`` (with its ``report`` command) on the command line."""
    p = subparsers.add_parser(
        "atlas",
        help="your own attention through the atlas: atlas report SPEC",
        description="Run an attention variant through the atlas's analyses.",
    )
    sub = p.add_subparsers(dest="atlas_command", required=True, metavar="COMMAND")
    r = sub.add_parser(
        "report",
        help="a report on one attention variant beside the zoo",
        description=(
            "Check a variant against the Attention contract, run every analysis of the atlas "
            "on it (score rank, rank collapse, cost against SDPA, chapter 9's MQAR cross and "
            "char-PTB at equal wall clock) and write <out>/index.html (offline), "
            "<out>/summary.json and the executed notebook. Exit 0 when every check passed and "
            "every section was built, 1 when the variant broke one (the report says which), "
            "2 on bad input. Cells are stored in <out>/cells and reused by a second run."
        ),
        epilog=(
            "examples: atlas report examples/my_attention.py:GatedDotAttention --preset smoke; "
            "atlas report my_pkg.attn:MyAttention -o temperature=0.5 --out reports/mine; "
            "atlas report riemannian (a registered name)"
        ),
    )
    r.add_argument("spec", metavar="SPEC",
                   help="a registered name, package.module:Class or path/to/file.py:Class")  # fmt: skip
    r.add_argument("--preset", default="book",
                   help="smoke (toy sizes), book (chapter 9's book protocol; default) or long")  # fmt: skip
    r.add_argument("-o", "--option", dest="options", action="append", default=[],
                   metavar="KEY=VALUE", help="a constructor option of the variant (repeatable)")  # fmt: skip
    r.add_argument("-p", "--param", dest="params", action="append", default=[],
                   metavar="KEY=VALUE",
                   help="a report grid parameter over the preset's (repeatable), e.g. -p depth=12")  # fmt: skip
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                   help="seeds of every cell (default 0 1 2; the verdicts need 3)")  # fmt: skip
    r.add_argument("--out", default=None,
                   help="the report's folder (default atlas-reports/<variant>-<preset>)")  # fmt: skip
    r.add_argument("--timeout", type=float, default=None,
                   help="seconds allowed per notebook cell (default: none)")  # fmt: skip
    r.set_defaults(func=run_report)


def _parse(items: list[str], flag: str) -> dict[str, Any]:
    from attention_atlas.notebooks.chapters import ParameterError, parse_override

    out = {}
    for item in items:
        try:
            key, value = parse_override(item)
        except ParameterError as e:
            raise ConfigError(
                f"{flag} {item!r}: expected key=value with a Python name as key"
            ) from e
        out[key] = value
    return out


def checked(args: argparse.Namespace) -> tuple[Any, dict[str, Any], dict[str, Any], Path]:
    """Every argument checked, nothing written: the variant, its options, the grid parameters
    and the output folder; the report's grid built and each cell checked."""
    from attention_atlas.attention.registry import attention_options
    from attention_atlas.experiments.atlas import PRESETS, chapter_grid, check_cell, load_variant

    if args.preset not in PRESETS:
        raise ConfigError(f"--preset: expected one of {', '.join(PRESETS)}, got {args.preset!r}"
                          f"{close_matches(args.preset, PRESETS)}")  # fmt: skip
    if not args.seeds or any(s < 0 for s in args.seeds) or len(set(args.seeds)) != len(args.seeds):
        raise ConfigError(f"--seeds: expected distinct integers >= 0, got {args.seeds}")
    variant = load_variant(args.spec)
    options = _parse(args.options, "-o")
    known = [k for k in attention_options(variant.name) if k not in _SET_BY_REPORT]
    for key in options:
        if key not in known:
            raise ConfigError(
                f"-o {key}: {variant.name} has no constructor option {key!r}"
                f"{close_matches(key, known)}; it takes: {', '.join(known) or '(none)'}"
            )
    params = _parse(args.params, "-p")
    grid_args = [
        k for k in inspect.signature(chapter_grid).parameters if k not in ("variant", "options")
    ]
    for key in params:
        if key not in grid_args:
            raise ConfigError(f"-p {key}: the report has no parameter {key!r}"
                              f"{close_matches(key, grid_args)}; it has: {', '.join(grid_args)}")  # fmt: skip
    try:
        grid = chapter_grid(**{**PRESETS[args.preset], **params, "variant": variant.spec,
                               "options": options})  # fmt: skip
        for name, cell in grid.items():
            try:
                check_cell(cell)
            except (TypeError, ValueError) as e:
                raise ConfigError(f"report cell {name}: {one_line(e)}") from None
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"report grid ({args.preset}, -o/-p): {one_line(e)}") from None
    out = Path(args.out or Path("atlas-reports") / f"{variant.name}-{args.preset}")
    check_output_path(out, "--out", folder=True)
    return variant, options, params, out


def run_report(args: argparse.Namespace) -> int:
    from attention_atlas.atomic import FolderInUse, folder_lock
    from attention_atlas.notebooks.report import build_report

    variant, options, params, out = checked(args)
    print(f"atlas report {variant.name} ({variant.source}) preset={args.preset} -> {out}")
    try:
        with folder_lock(out, f"atlas report {variant.name}"):
            built = build_report(variant.spec, out_dir=out, preset=args.preset, options=options,
                                 params=params, seeds=args.seeds, timeout=args.timeout)  # fmt: skip
    except FolderInUse as err:
        raise ConfigError(f"--out: {err}") from None
    print(f"report: {built.html} ({built.seconds:.0f} s); summary: {out / 'summary.json'}")
    if built.error:
        print(f"the report notebook stopped: {built.error}")
        return 1
    s = built.summary or {}
    problems = list(s.get("failed_checks", [])) + [
        f"{k}: {e}" for k, e in s.get("failed_sections", {}).items()
    ]
    for p in problems:
        print(f"failed: {p}")
    return 0 if built.ok else 1

"""``python -m attention_atlas claims``: print the claims register with its outcomes."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from attention_atlas.claims import SEEDS, register, stored_outcomes
from attention_atlas.stats import OUTCOMES
from attention_atlas.validate import ConfigError


def add_subcommand(subparsers: Any) -> None:
    """Register ``claims`` on the command line (see :mod:`attention_atlas.__main__`)."""
    p = subparsers.add_parser(
        "claims",
        help="the claims register: every claim of the seeds, its test and its outcome",
        description="Evaluate and print the claims register (mathematical checks run now; "
        "empirical outcomes come from the stored results).",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--seed", choices=sorted(SEEDS), help="only the claims of this seed")
    p.add_argument("--smoke", action="store_true", help="toy sizes for the computed checks")
    p.add_argument("--recompute", action="store_true",
                   help="compute every outcome now and store them in results/claims/book "
                        "(the stored register is what `claims` reads when it is fresh)")  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.recompute and args.smoke:
        raise ConfigError("--recompute stores the book-size register; it does not take --smoke")
    if args.recompute:
        from attention_atlas.experiments import run_experiment

        run_experiment("claims", preset="book", seeds=[0], resume=False, log=None,
                       progress=False)  # fmt: skip
        df = register(seed=args.seed, stored=stored_outcomes(fresh_only=False))
    else:
        df = register(smoke=args.smoke, seed=args.seed)
    if args.json:
        json.dump(df.to_dict(orient="records"), sys.stdout, indent=1, default=str)
        print()
        return 0
    for seed, g in df.groupby("seed", sort=False):
        print(f"\n{SEEDS[str(seed)][0]} ({SEEDS[str(seed)][1]})")
        for r in g.itertuples():
            print(f"  [{r.outcome:>12}] {r.key:<32} {r.source}: {r.summary}")
    counts = df["outcome"].value_counts()
    print("\n" + ", ".join(f"{counts.get(o, 0)} {o}" for o in OUTCOMES))
    return 0

"""A referee report per seed, written from the register (:func:`attention_atlas.claims.register`):
its errata (each contradicted or ill-posed claim with its counterexample or measurement), what
holds and at what scale, and what is open with what deciding it would take. Nothing in a report
is typed: every sentence comes from a claim's declared form and its computed outcome."""

from __future__ import annotations

import pandas as pd

from .core import SEEDS

__all__ = ["referee_report"]


def _first_sentence(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1].rsplit(" ", 1)[0] + " ..."


def _item(r: pd.Series, body: str) -> str:
    return f"- **{r['key'].split('/', 1)[1]}** ({r['source']}; {r['form']}): {body}"


def referee_report(register: pd.DataFrame, seed: str) -> str:
    """The report on ``seed`` (a key of :data:`~.core.SEEDS`) as Markdown, from the rows of
    ``register`` (the frame of :func:`attention_atlas.claims.register`)."""
    if seed not in SEEDS:
        raise ValueError(f"unknown seed {seed!r}; known: {', '.join(SEEDS)}")
    rows = register[register["seed"] == seed]
    if rows.empty:
        raise ValueError(f"the register has no claim of seed {seed!r}")
    title, source = SEEDS[seed]
    ill = rows[rows["form"] == "ill-posed"]
    contradicted = rows[(rows["outcome"] == "contradicted") & (rows["form"] != "ill-posed")]
    holds = rows[rows["outcome"] == "supported"]
    unresolved = rows[rows["outcome"] == "not resolved"]
    untested = rows[(rows["outcome"] == "not tested") & (rows["form"] != "ill-posed")]
    n = len(rows)
    lines = [
        f"**Referee report: {title}** ({source}). {n} claims registered: "
        f"{len(holds)} hold, {len(contradicted)} are contradicted, {len(ill)} are ill-posed as "
        f"written, {len(unresolved)} are not resolved by the runs and {len(untested)} are not "
        "tested.",
        "",
        f"*Errata* ({len(contradicted) + len(ill)}):",
    ]
    lines += [_item(r, _first_sentence(r["summary"])) for _, r in contradicted.iterrows()]
    lines += [_item(r, "ill-posed as written: " + _first_sentence(r["summary"]))
              for _, r in ill.iterrows()]  # fmt: skip
    if contradicted.empty and ill.empty:
        lines.append("- none.")
    lines += ["", f"*What holds* ({len(holds)}):"]
    for _, r in holds.iterrows():
        scale = f" Scale: {r['scale']}." if isinstance(r["scale"], str) and r["scale"] else ""
        lines.append(_item(r, _first_sentence(r["summary"], 240) + scale))
    if holds.empty:
        lines.append("- none.")
    lines += ["", f"*Open* ({len(unresolved) + len(untested)}):"]
    for _, r in unresolved.iterrows():
        lines.append(_item(r, "not resolved at this scale: " + _first_sentence(r["summary"], 300)))
    for _, r in untested.iterrows():
        why = r["reason"] or "not run"
        lines.append(_item(r, f"not tested ({why}): " + _first_sentence(r["summary"], 300)))
    if unresolved.empty and untested.empty:
        lines.append("- none.")
    return "\n".join(lines)

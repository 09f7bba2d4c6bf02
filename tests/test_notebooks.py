"""The notebook runner, and every chapter: literal parameters, valid SMOKE values, a passing
smoke run. A chapter whose assert fails must make the runner (and so `make test`) fail."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from attention_atlas.notebooks import (
    ParameterError,
    chapter_parameters,
    chapter_smoke,
    chapters,
    parse_override,
    resolve_chapter,
    run_chapter,
    validate_parameters,
)

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = chapters(ROOT / "notebooks")
IDS = [p.stem for p in CHAPTERS]

HEADER = """\
# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---
"""


def write_chapter(folder: Path, name: str, body: str) -> Path:
    path = folder / f"{name}.py"
    path.write_text(HEADER + textwrap.dedent(body))
    return path


# -- every chapter -----------------------------------------------------------------------------


def toc_files() -> list[str]:
    """Every ``file:`` of ``_toc.yml`` (the root first), in the order the book lists them."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())

    def files(node: object) -> list[str]:
        if isinstance(node, dict):
            own = [node[k] for k in ("root", "file") if k in node]
            return own + [f for k, v in node.items() if k not in ("root", "file") for f in files(v)]
        if isinstance(node, list):
            return [f for v in node for f in files(v)]
        return []

    return files(toc)


def test_the_table_of_contents_lists_exactly_the_chapters_in_reading_order() -> None:
    listed = [f for f in toc_files() if f.startswith("notebooks/")]
    want = [f"notebooks/{p.stem}" for p in CHAPTERS]
    missing, extra = sorted(set(want) - set(listed)), sorted(set(listed) - set(want))
    assert not missing, f"add `- file: NAME` to _toc.yml for {missing}"
    assert not extra, f"_toc.yml lists {extra}, which are not chapters in notebooks/"
    assert listed == want, "_toc.yml must list the chapters once each, in NN_ order"
    assert len(want) >= 8  # chapters 0 to 7 at least


def test_every_page_of_the_table_of_contents_exists() -> None:
    for entry in toc_files():
        found = [p for p in (ROOT / entry).parent.glob(f"{Path(entry).name}.*")]
        assert any(p.suffix in (".py", ".md", ".ipynb") for p in found), f"{entry}: no such page"


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_chapter_declares_literal_parameters_and_a_valid_smoke_set(path: Path) -> None:
    params = chapter_parameters(path)
    assert params, f"{path.name}: the parameters cell declares nothing"
    smoke = chapter_smoke(path)
    validate_parameters(params, smoke, chapter=path.stem, source="SMOKE")


@pytest.mark.slow
@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_chapter_runs_with_its_smoke_parameters(path: Path, smoke_runs: dict) -> None:
    result = smoke_runs[path.stem]
    if not result.ok:
        pytest.fail(str(result.error), pytrace=False)
    assert result.output.is_file()


# -- parameters and overrides ------------------------------------------------------------------

DECLARED = {"n_steps": 400, "lr": 1e-3, "seeds": [0, 1, 2], "name": "dot", "flag": True, "opts": {}}


def test_an_unknown_parameter_is_rejected_with_the_declared_names() -> None:
    with pytest.raises(ParameterError, match=r"unknown parameter\(s\) \['n_step'\].*n_steps"):
        validate_parameters(DECLARED, {"n_step": 5}, chapter="ch", source="-p")


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ({"n_steps": 2.5}, "'n_steps' in -p expects int"),
        ({"n_steps": True}, "'n_steps' in -p expects int"),
        ({"flag": 1}, "'flag' in -p expects bool"),
        ({"lr": "fast"}, "'lr' in -p expects float"),
        ({"seeds": [0, "1"]}, r"'seeds' in -p expects list\[int\]"),
        ({"seeds": 3}, r"'seeds' in -p expects list\[int\]"),
        ({"name": 3}, "'name' in -p expects str"),
        ({"opts": []}, "'opts' in -p expects dict"),
    ],
)
def test_a_value_of_the_wrong_type_is_rejected_naming_parameter_and_type(
    override: dict, expected: str
) -> None:
    with pytest.raises(ParameterError, match=expected):
        validate_parameters(DECLARED, override, chapter="ch", source="-p")


def test_an_int_may_replace_a_float_and_becomes_a_float() -> None:
    out = validate_parameters(DECLARED, {"lr": 1, "seeds": [7]}, chapter="ch", source="-p")
    assert out == {"lr": 1.0, "seeds": [7]} and isinstance(out["lr"], float)


@pytest.mark.parametrize(
    ("text", "pair"),
    [
        ("n=5", ("n", 5)),
        ("lr=1e-3", ("lr", 1e-3)),
        ("seeds=[0, 1]", ("seeds", [0, 1])),
        ("name=dot", ("name", "dot")),
        ("name='a b'", ("name", "a b")),
        ("flag=False", ("flag", False)),
    ],
)
def test_overrides_are_parsed_as_python_literals(text: str, pair: tuple) -> None:
    assert parse_override(text) == pair


def test_an_override_without_equals_sign_is_rejected() -> None:
    with pytest.raises(ParameterError, match="key=value"):
        parse_override("n_steps")


def test_a_parameter_that_is_not_a_literal_is_rejected(tmp_path: Path) -> None:
    path = write_chapter(
        tmp_path,
        "bad_params",
        """
        # %% tags=["parameters"]
        n = 3
        m = n + 1

        # %% tags=["smoke"]
        SMOKE = {}
        """,
    )
    with pytest.raises(ParameterError, match="m must be a literal"):
        chapter_parameters(path)


def test_smoke_must_be_a_dict_literal(tmp_path: Path) -> None:
    path = write_chapter(
        tmp_path,
        "bad_smoke",
        """
        # %% tags=["parameters"]
        n = 3

        # %% tags=["smoke"]
        SMOKE = [1]
        """,
    )
    with pytest.raises(ParameterError, match="SMOKE = "):
        chapter_smoke(path)


def test_bad_parameters_are_rejected_before_anything_executes(tmp_path: Path) -> None:
    path = write_chapter(
        tmp_path,
        "never_runs",
        """
        # %% tags=["parameters"]
        n = 3

        # %% tags=["smoke"]
        SMOKE = {"n": 1}

        # %%
        open("ran.txt", "w").write("ran")
        """,
    )
    with pytest.raises(ParameterError, match="'n' in -p expects int"):
        run_chapter(path, overrides={"n": "three"}, out_dir=tmp_path / "out")
    assert not (tmp_path / "ran.txt").exists() and not (tmp_path / "out").exists()


def test_chapters_resolve_by_stem_file_name_or_path() -> None:
    first = CHAPTERS[0]
    assert resolve_chapter(first.stem) == first.resolve()
    assert resolve_chapter(first.name) == first.resolve()
    assert resolve_chapter(str(first)) == first.resolve()
    with pytest.raises(FileNotFoundError, match="chapters:"):
        resolve_chapter("no_such_chapter")


# -- a failing assert fails the runner ---------------------------------------------------------


@pytest.mark.slow
def test_a_failing_assert_fails_the_command_naming_chapter_and_cell(tmp_path: Path) -> None:
    path = write_chapter(
        tmp_path,
        "99_broken",
        """
        # %% [markdown]
        # # A broken chapter

        # %% tags=["parameters"]
        n = 3

        # %% tags=["smoke"]
        SMOKE = {"n": 2}

        # %%
        value = n * 2

        # %%
        assert value == 5, f"value is {value}"
        """,
    )
    proc = subprocess.run(
        [sys.executable, "-m", "attention_atlas", "notebooks", "run", "--smoke", "-q"]
        + [str(path), "--out", str(tmp_path / "out"), "-p", "n=3"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    err = proc.stderr
    assert "chapter 99_broken failed in cell 5 (99_broken.py, line 24)" in err, err
    assert "AssertionError: value is 6" in err, err
    assert (tmp_path / "out" / "99_broken.ipynb").is_file()  # the executed notebook is kept


def test_an_unknown_override_makes_the_command_exit_2_without_running(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "attention_atlas", "notebooks", "run", CHAPTERS[0].stem]
        + ["--out", str(tmp_path), "-p", "no_such_parameter=1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "unknown parameter(s) ['no_such_parameter']" in proc.stderr
    assert not list(tmp_path.iterdir())


# -- chapter 4 on a grid with runs that diverged ------------------------------------------------

CH4 = ROOT / "notebooks" / "04_fiber_bundle_transformer.py"
#: the parameters of chapter 4 that shape its grid (the notebook's ``grid_kwargs``)
CH4_GRID = ("steps", "dim", "n_layers", "n_heads", "seq_len", "batch_size", "ranks", "alphas",
            "kappa_factors", "dot_temperatures", "analyse_seqs", "final_eval_batches",
            "explore_len", "log_every")  # fmt: skip


def _outputs_text(notebook: Path) -> str:
    """Every text an executed notebook shows (markdown, plain text, HTML, figure JSON)."""
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            parts.append(out.get("text", ""))
            for value in out.get("data", {}).values():
                parts.append(value if isinstance(value, str) else json.dumps(value))
    return "\n".join(parts)


@pytest.mark.slow
def test_chapter_4_executes_on_a_grid_with_diverged_runs_and_names_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chapter 4's long grid holds runs that diverged (``fbt_rank-8``, ``fbt_kappa-0.1``). On a
    stored smoke-size grid where the default model diverged at seed 1, the weakest metric level
    and P3's noise control at seed 0 (the outputs of those cells are those of the same
    configuration trained at lr 1e30, a real divergence), the chapter executes: the overview and
    the figures name them, the run view shows the diverged run, and every prediction comparing
    them, P1 to P6, is *not tested* with the arm, seed and step as its reason (the smoke grid's
    two seeds would make them not tested too, for that other reason, which comes second)."""
    from attention_atlas.experiments import stored_or_run
    from attention_atlas.experiments.fiber_bundle import run as fb

    params = {**chapter_parameters(CH4), **chapter_smoke(CH4)}
    kwargs = {k: params[k] for k in CH4_GRID}
    if params.get("dot_controls"):  # the smoke grid holds the matched dot controls too
        kwargs.update(dot_controls=True, time_budget_s=params["time_budget_s"])
    folder = tmp_path / "store" / "fiber-bundle" / "book"
    grid = stored_or_run("fiber-bundle", params=kwargs, preset="book", seeds=params["seeds"],
                         use_stored=False, out_dir=folder, log=None)  # fmt: skip
    assert params["seeds"] == [0, 1] and not grid.missing
    steps = {}
    # lr 1e30 diverges at the first update; at lr 1.4 the weakest cap level runs away as eq. (34)
    # cannot stop (mean kappa_t some 1e11 kappa_max at the step-3 log), diverging after that log
    for config, seed, lr in (("fbt", 1, 1e30), ("fbt_kappa-0.1", 0, 1.4), ("fbt_noise", 0, 1e30)):
        rec = grid.records[(config, seed)]
        p = rec["params"]
        blown = {**p, "train": {**p["train"], "lr": lr, "warmup_steps": 0}}
        with pytest.warns(RuntimeWarning, match="training diverged at step"):
            out = fb.run_cell(blown, seed)
        steps[config] = out["diverged_step"]
        keep = {k: rec[k] for k in ("config", "seed", "key", "params", "provenance") if k in rec}
        (folder / "cells" / f"{rec['key']}.json").write_text(json.dumps({**keep, **out}))
    monkeypatch.setenv("ATTENTION_ATLAS_RESULTS", str(tmp_path / "store"))
    result = run_chapter(CH4, smoke=True, overrides={"use_stored": True}, out_dir=tmp_path / "out",
                         timeout=600)  # fmt: skip
    text = _outputs_text(result.output)
    fbt, weak, noise = (
        f"{c} diverged in 1 of 2 seeds (seed {s} at step {steps[c]})"
        for c, s in (("fbt", 1), ("fbt_kappa-0.1", 0), ("fbt_noise", 0))
    )
    assert f"**Runs that diverged.** {fbt}; {noise}; {weak}" in text
    assert "1 of 2 seeds: seed 1 at step" in text  # the overview's diverged column
    assert f"*Not shown: {fbt}" in text  # under the figure of every configuration
    assert f"fbt, seed 1: diverged at step {steps['fbt']}, nothing measured" in text  # run view
    assert f"nothing can be paired: {fbt}" in text  # P6's prose
    assert f"No trained transport to measure: {fbt}" in text
    for claim, reason in (("P1", weak), ("P2", fbt), ("P3", noise), ("P4", fbt), ("P5", fbt),
                          ("P6", fbt)):  # fmt: skip
        said = rf"Outcome[^\n]*: \*\*not tested\*\* \({claim}: [^\n]*: {re.escape(reason)}\)"
        assert re.search(said, text), f"{claim} is not 'not tested' for {reason}"
    assert ", 3 of which diverged" in text
    assert steps["fbt_kappa-0.1"] > params["log_every"] >= steps["fbt"]
    # the cap section: its table, and the one run that reached a log step read against the peak
    said = (
        r"3 runs of this grid diverged, 1 of them after a log step\. At their last one, 1 had "
        r"a block whose mean \$\\kappa_t\$ stood beyond that peak \((\S+) times their "
        r"\$\\kappa_\\max\$\), with the regulariser at (\S+): the runaway"
    )
    found = re.search(said, text)
    assert found, "the cap section does not read the run that diverged after a log step"
    assert float(found[1]) > 1e6 and float(found[2]) < -1e6
    assert re.search(
        rf"fbt_kappa-0\.1\s+0\s+{steps['fbt_kappa-0.1']}\s+{params['log_every']}\.0", text
    )

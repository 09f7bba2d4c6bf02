"""The results store: grids loaded with provenance, stored-or-run for chapters, verify."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path

import pytest
import torch

from attention_atlas.__main__ import main
from attention_atlas.experiments import run_experiment, stored_or_run, toy, verify
from attention_atlas.provenance import cpu_id, git_state
from attention_atlas.store import results
from attention_atlas.store.records import read_records, seal
from attention_atlas.sweep.verify import RTOL, compare

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A results store in a temporary folder holding the toy experiment's smoke grid."""
    monkeypatch.setenv("ATTENTION_ATLAS_RESULTS", str(tmp_path))
    run_experiment("toy", preset="smoke", seeds=[0, 1], log=None, progress=False)
    return tmp_path


def test_load_grid_gives_every_cell_and_one_line_of_provenance(store: Path) -> None:
    grid = results.load_grid("toy", "smoke")
    assert grid.complete and sorted(grid.records) == [("dim-8", 0), ("dim-8", 1)]
    assert list(grid.frame["seed"]) == [0, 1] and "loss_final" in grid.frame
    assert len(grid.records[("dim-8", 1)]["history"]["loss"]) == toy.PRESETS["smoke"]["steps"]
    text = grid.provenance.text
    commit = (git_state()["git_commit"] or "")[:7]
    today = datetime.now(UTC).date().isoformat()
    assert text.startswith(
        "stored results of `python -m attention_atlas sweep toy --preset smoke --seeds 0 1`"
    )
    assert f"commit {commit}" in text and today in text and "CPU " in text and "2 cells" in text
    assert str(grid.provenance) == text


def test_an_incomplete_grid_names_what_is_missing_and_how_to_resume(store: Path) -> None:
    next((store / "toy" / "smoke" / "cells").glob("dim-8__seed1__*.json")).unlink()
    with pytest.raises(
        results.IncompleteGrid, match=r"1 of 2 cells missing \(e\.g\. dim-8 seed 1\).*--seeds 0 1"
    ):
        results.load_grid("toy", "smoke")
    grid = results.load_grid("toy", "smoke", complete=False)
    assert grid.missing == [("dim-8", 1)] and len(grid.frame) == 1
    with pytest.raises(FileNotFoundError, match="no stored grid of toy preset long"):
        results.load_grid("toy", "long")


def test_the_manifest_adds_seeds_and_refuses_another_grid_in_the_same_folder(store: Path) -> None:
    run_experiment("toy", preset="smoke", seeds=[2], log=None, progress=False)
    assert json.loads((store / "toy" / "smoke" / "grid.json").read_text())["seeds"] == [0, 1, 2]
    assert results.load_grid("toy", "smoke").provenance.n_cells == 3
    with pytest.raises(ValueError, match=r"dim-8: steps 5 -> 6"):
        run_experiment("toy", preset="smoke", params={"steps": 6}, seeds=[0], log=None)


def test_a_stored_grid_may_grow_by_configurations_but_not_lose_or_change_one(store: Path) -> None:
    """A configuration added to a stored grid (a control the long grid turned out to need) is
    recorded and its cells run beside the stored ones, which stay valid and are not re-run; a
    grid that drops or changes a stored configuration is refused, naming it."""
    run_experiment("toy", preset="smoke", seeds=[0], log=None, progress=False)
    folder = store / "toy" / "smoke"
    before = {p.name: p.read_text() for p in (folder / "cells").glob("*.json")}
    run_experiment(
        "toy", preset="smoke", params={"dims": [8, 4]}, seeds=[0], log=None, progress=False
    )
    manifest = json.loads((folder / "grid.json").read_text())
    assert list(manifest["configs"]) == ["dim-8", "dim-4"]
    after = {p.name: p.read_text() for p in (folder / "cells").glob("*.json")}
    assert len(after) == len(before) + 1 and all(after[n] == text for n, text in before.items())
    grid = results.load_grid("toy", "smoke", complete=False)
    assert ("dim-4", 0) in grid.records and ("dim-8", 0) in grid.records
    with pytest.raises(ValueError, match="configuration dim-4 removed"):
        run_experiment("toy", preset="smoke", seeds=[0], log=None)


def test_stored_or_run_loads_a_complete_stored_grid_without_running(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(params: dict, seed: int) -> dict:
        raise AssertionError("ran a cell although the grid is stored")

    monkeypatch.setattr(toy, "run_cell", fail)
    grid = stored_or_run("toy", preset="smoke", seeds=[0, 1], stored="smoke", log=None)
    assert grid.provenance.source == "stored" and len(grid.frame) == 2


def test_stored_or_run_runs_the_chapter_grid_when_nothing_complete_is_stored(
    store: Path, tmp_path: Path
) -> None:
    lines: list[str] = []
    grid = stored_or_run("toy", preset="smoke", params={"steps": 3}, seeds=[0], stored="long",
                                 out_dir=tmp_path / "chapter", log=lines.append)  # fmt: skip
    assert grid.provenance.source == "computed" and grid.complete and len(grid.frame) == 1
    assert "no complete stored long grid" in lines[0]
    assert grid.provenance.text.startswith(
        f"computed here, as by `python -m attention_atlas sweep toy --preset smoke --seeds 0 -p steps=3 --out {tmp_path / 'chapter'}`"
    )
    smoke = stored_or_run(
        "toy", preset="smoke", seeds=[0], stored="smoke", use_stored=False, log=None
    )
    assert smoke.provenance.source == "computed"


def test_compare_is_exact_or_within_the_stated_tolerance() -> None:
    stored = {
        "loss": 1.0,
        "history": {"loss": [1.0, 0.5], "time_s": [0.1, 0.2]},
        "train_time_s": 3.0,
    }
    assert compare(stored, stored, rtol=0, atol=0) == ([], 0.0)
    moved = {
        "loss": 1.0 + 1e-4,
        "history": {"loss": [1.0, 0.5], "time_s": [9, 9]},
        "train_time_s": 7.0,
    }
    diffs, worst = compare(stored, moved, rtol=0, atol=0)
    assert diffs == ["loss: 1.0 stored, 1.0001 re-run"] and math.isclose(worst, 1e-4)
    assert compare(stored, moved, rtol=1e-3, atol=0)[0] == []
    assert compare({"x": math.nan}, {"x": math.nan}, rtol=0, atol=0) == ([], 0.0)
    assert compare({"h": [1, 2, 3]}, {"h": [1, 2]}, rtol=1, atol=1)[0] == [
        "h: length 3 stored, 2 re-run"
    ]
    assert compare({"h": [1, 2, 3]}, {"h": [1, 5, 6]}, rtol=0, atol=0)[0] == [
        "h[1]: 2 stored, 5 re-run (and 1 more in h)"
    ]
    assert compare({"a": 1}, {"b": 1}, rtol=0, atol=0)[0] == [
        "a: only in the stored record", "b: only in the re-run record"
    ]  # fmt: skip


def test_verify_reproduces_stored_cells_exactly_and_catches_a_changed_one(store: Path) -> None:
    ok = verify(5, experiment="toy", log=None)
    assert [o.status for o in ok] == ["exact", "exact"]
    path = ok[0].path
    rec = json.loads(path.read_text())
    rec["history"]["loss"][2] = math.nextafter(rec["history"]["loss"][2], 10.0)  # one ulp
    rec["cell_seconds"] = 1e9  # a timing: never compared
    path.write_text(json.dumps(seal(rec)))  # resealed: the re-run, not the checksum, must catch it
    bad = verify(5, experiment="toy", log=None)
    assert [o.status for o in bad] == ["differs", "exact"]
    assert bad[0].detail.startswith("history.loss[2]: ")


def test_a_compiled_sweep_says_so_and_verify_re_runs_it_compiled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sweep_cells import compile_aware_cell

    monkeypatch.setenv("ATTENTION_ATLAS_RESULTS", str(tmp_path))
    monkeypatch.setattr(toy, "run_cell", compile_aware_cell)  # what verify re-runs, in-process
    run_experiment("toy", preset="smoke", seeds=[0], log=None, progress=False, compile=True)
    grid = results.load_grid("toy", "smoke")
    recs = list(grid.records.values())
    assert recs and all(r["compiled_steps"] == 1.0 for r in recs)
    assert all(r["provenance"]["compile"] is True for r in recs)
    assert all(r["provenance"]["compile_fallbacks"] == [] for r in recs)
    assert all(r["provenance"]["command"].endswith(" --compile") for r in recs)
    assert "compiled steps" in grid.provenance.text
    assert {o.status for o in verify(5, experiment="toy", log=None)} == {"exact"}
    for path in sorted((tmp_path / "toy" / "smoke" / "cells").glob("*.json")):
        rec = json.loads(path.read_text())  # the same records, as if made eagerly
        rec["provenance"]["compile"] = False
        path.write_text(json.dumps(seal(rec)))
    again = verify(5, experiment="toy", log=None)
    assert {o.status for o in again} == {"differs"}
    assert all(o.detail.startswith("compiled_steps: 1.0 stored, 0.0 re-run") for o in again)


def test_verify_re_runs_the_committed_toy_cell() -> None:
    """CI: the stored toy grid in results/ reproduces (exactly on a processor of the same
    ``cpu_id`` as the one that made it, an AMD EPYC 7003; else within the tolerance)."""
    grid = results.load_grid("toy", "book", root=REPO / "results")
    assert grid.complete and grid.provenance.n_cells >= 1
    assert not any(r["provenance"]["git_dirty"] for r in grid.records.values())
    (outcome,) = verify(1, experiment="toy", preset="book", root=REPO / "results", log=None)
    assert outcome.status in ("exact", "close"), outcome.detail


def _cpuinfo(path: Path, model: int, flags: str) -> Path:
    block = (f"processor\t: {{}}\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: {model}\n"
             f"model name\t: AMD EPYC\nstepping\t: 1\nflags\t\t: fpu {flags} ht\n")  # fmt: skip
    path.write_text(block.format(0) + "\n" + block.format(1).replace("avx", "zz"))
    return path


def test_cpu_id_tells_apart_processors_of_one_model_name(tmp_path: Path) -> None:
    """Two "AMD EPYC"s (family 25, models 17 and 1): the first processor's family, model,
    stepping and vector instruction sets, in order."""
    zen4 = cpu_id(_cpuinfo(tmp_path / "a", 17, "sse4_1 avx512f avx2 fma avx"))
    zen3 = cpu_id(_cpuinfo(tmp_path / "b", 1, "sse4_1 avx2 fma avx"))
    assert zen4 == "AuthenticAMD 25/17/1 avx avx2 avx512f fma sse4_1"
    assert zen3 == "AuthenticAMD 25/1/1 avx avx2 fma sse4_1"
    assert cpu_id(tmp_path / "none") and cpu_id(tmp_path / "none") != zen3


def test_verify_holds_a_cell_of_another_processor_to_the_tolerance(store: Path) -> None:
    """A cell is re-run exactly only where its processor's ``cpu_id`` is this one's: the same
    last-bit change fails it here and passes it as made on another processor (or by a record
    without ``cpu_id``), where a larger one fails."""
    paths = sorted((store / "toy" / "smoke" / "cells").glob("*.json"))
    recs = [json.loads(p.read_text()) for p in paths]
    assert all(r["provenance"]["cpu_id"] == cpu_id() for r in recs)

    def verified(cpu: str | None, rel: float) -> set[str]:
        for path, rec in zip(paths, recs):
            changed = json.loads(json.dumps(rec))
            changed["loss_final"] *= 1 + rel
            if cpu is None:
                del changed["provenance"]["cpu_id"]
            else:
                changed["provenance"]["cpu_id"] = cpu
            path.write_text(json.dumps(seal(changed)))
        out = verify(len(paths), experiment="toy", preset="smoke", root=store, log=None)
        return {o.status for o in out}

    assert verified(cpu_id(), 0.0) == {"exact"}
    assert verified(cpu_id(), 1e-7) == {"differs"}
    assert verified("AuthenticAMD 25/17/1 avx avx2 avx512f", 1e-7) == {"close"}
    assert verified(None, 1e-7) == {"close"}
    assert verified(None, 10 * RTOL) == {"differs"}


def test_the_results_command_lists_shows_and_verifies(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["results", "list"]) == 0
    out = capsys.readouterr().out
    assert "toy" in out and "smoke" in out and "2/2" in out
    assert main(["results", "show", "toy", "smoke"]) == 0
    out = capsys.readouterr().out
    assert "stored results of" in out and "dim-8" in out and "loss_final" in out
    assert main(["results", "verify", "--sample", "1", "--experiment", "toy"]) == 0
    assert "1 exact" in capsys.readouterr().out
    rec_path = sorted((store / "toy" / "smoke" / "cells").glob("*.json"))[0]
    rec = json.loads(rec_path.read_text())
    rec["loss_final"] += 1.0
    rec_path.write_text(json.dumps(rec))  # edited by hand: its checksum says so, verify refuses
    assert main(["results", "verify", "--sample", "2", "--experiment", "toy"]) == 2
    assert "changed after it was written" in capsys.readouterr().err
    rec_path.write_text(json.dumps(seal(rec)))  # resealed: the re-run catches the change
    assert main(["results", "verify", "--sample", "2", "--experiment", "toy"]) == 1
    assert "loss_final" in capsys.readouterr().out


def test_the_list_says_what_an_unfinished_grid_still_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ATTENTION_ATLAS_RESULTS", str(tmp_path))
    run_experiment("toy", preset="smoke", params={"dims": [8, 16]}, seeds=[0, 1, 2],
                   only=["dim-8"], log=None, progress=False)  # fmt: skip
    cells = {json.loads(p.read_text())["seed"]: p for p in (tmp_path / "toy/smoke/cells").glob("*")}
    cells.pop(2).unlink()  # dim-8 seed 2 missing: timed by dim-8's other cells, 10 and 20 s
    for seed, seconds in ((0, 10.0), (1, 20.0)):
        rec = json.loads(cells[seed].read_text())
        cells[seed].write_text(json.dumps(seal({**rec, "cell_seconds": seconds})))
    # a killed runner's checkpoints: dim-8 seed 2 at step 3 of 10, and one that cannot be read
    flight = tmp_path / "toy/smoke/.checkpoints"
    for name, seed, payload in (("dim-8", 2, {"step": 3, "train_config": {"steps": 10}}),
                                ("dim-16", 0, None)):  # fmt: skip
        ckpt = flight / f"{name}__seed{seed}__0123456789ab" / "run0" / "checkpoint.pt"
        ckpt.parent.mkdir(parents=True)
        if payload is None:
            ckpt.write_bytes(b"not a checkpoint")
        else:
            torch.save(payload, ckpt)
    assert main(["results", "list"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "smoke" in line)
    assert "2/6" in row and "30 s" in row  # stored
    assert "15 s + 3 cells not timed yet" in row  # dim-16 has no cell yet
    assert row.rstrip().endswith("dim-16__seed0 ?; dim-8__seed2 3/10")  # in flight
    assert main(["results", "show", "toy", "smoke"]) == 0
    assert (
        "in flight (step/steps of their checkpoints, where a runner resumes): dim-16__seed0 ?; "
        "dim-8__seed2 3/10\n" in capsys.readouterr().out
    )


def test_a_record_too_large_for_the_store_is_written_with_a_warning(tmp_path: Path) -> None:
    from attention_atlas.store.records import MAX_RECORD_BYTES
    from attention_atlas.sweep.runner import Cell, run_sweep

    lines: list[str] = []
    run_sweep([Cell("big", 0, {})], lambda p, s: {"weights": [0.123456789] * (MAX_RECORD_BYTES // 10)},
              tmp_path, log=lines.append)  # fmt: skip
    assert len(read_records(tmp_path)) == 1
    assert any("the results store is for metrics" in line for line in lines)


def test_a_stored_grid_of_the_chapters_own_preset_counts_only_for_exactly_that_grid(
    store: Path, tmp_path: Path
) -> None:
    """The stored smoke grid (steps 5) serves a chapter asking for the smoke grid, but not one
    asking for it with other parameters (steps 3), nor for other seeds."""
    same = stored_or_run("toy", preset="smoke", seeds=[0], stored=("long", "smoke"),
                                 log=None)  # fmt: skip
    assert same.provenance.source == "stored"
    other = stored_or_run("toy", preset="smoke", params={"steps": 3}, seeds=[0],
                                  stored=("long", "smoke"), out_dir=tmp_path / "a", log=None)  # fmt: skip
    assert other.provenance.source == "computed"
    seeds = stored_or_run("toy", preset="smoke", seeds=[7], stored=("long", "smoke"),
                                  out_dir=tmp_path / "b", log=None)  # fmt: skip
    assert seeds.provenance.source == "computed"


def test_costs_are_compared_by_cpu_time_where_every_cell_has_it() -> None:
    import pandas as pd

    from attention_atlas.store.records import time_column

    both = pd.DataFrame({"train_time_s": [3.0, 9.0], "train_cpu_s": [2.9, 3.1]})
    assert time_column(both) == ("train_cpu_s", "training CPU time (s)")
    older = both.assign(train_cpu_s=[2.9, float("nan")])  # a cell stored before CPU times
    assert time_column(older) == ("train_time_s", "training time (s)")
    assert time_column(both.drop(columns="train_cpu_s"))[0] == "train_time_s"


def test_git_state_told_by_the_environment_wins_over_git(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ATTENTION_ATLAS_GIT_COMMIT", raising=False)
    monkeypatch.delenv("ATTENTION_ATLAS_GIT_DIRTY", raising=False)
    assert git_state(tmp_path) == {"git_commit": None, "git_dirty": None}
    monkeypatch.setenv("ATTENTION_ATLAS_GIT_COMMIT", "ab" * 20)
    monkeypatch.setenv("ATTENTION_ATLAS_GIT_DIRTY", "1")
    assert git_state(tmp_path) == {"git_commit": "ab" * 20, "git_dirty": True}
    monkeypatch.setenv("ATTENTION_ATLAS_GIT_DIRTY", "0")
    assert git_state(tmp_path)["git_dirty"] is False
    # set, they win over a checkout's own (a stale .git sent along with a copy)
    assert git_state() == {"git_commit": "ab" * 20, "git_dirty": False}
    monkeypatch.setenv("ATTENTION_ATLAS_GIT_COMMIT", "HEAD")
    with pytest.raises(ValueError, match="expected 40 hex digits, got 'HEAD'"):
        git_state(tmp_path)
    monkeypatch.setenv("ATTENTION_ATLAS_GIT_COMMIT", "ab" * 20)
    monkeypatch.setenv("ATTENTION_ATLAS_GIT_DIRTY", "yes")
    with pytest.raises(ValueError, match="expected 0 or 1, got 'yes'"):
        git_state(tmp_path)


STORED_GRIDS = sorted(p.parent for p in (REPO / "results").glob("*/*/grid.json"))


@pytest.mark.parametrize("folder", STORED_GRIDS, ids=lambda p: f"{p.parent.name}-{p.name}")
def test_every_stored_grid_has_its_table_with_a_row_per_stored_cell(folder: Path) -> None:
    """The store's per-grid CSV is the cells' own table: one row per cell record, no other
    (a grid committed without it, or with cells added after it was written, fails)."""
    import pandas as pd

    csv = folder / "results.csv"
    assert csv.exists(), f"{folder.relative_to(REPO)} has no results.csv"
    keys = {r["key"] for r in read_records(folder)}
    rows = pd.read_csv(csv)
    assert len(rows) == len(keys) and set(rows["key"]) == keys, folder.relative_to(REPO)

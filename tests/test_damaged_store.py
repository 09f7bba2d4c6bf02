"""A damaged record is named: a truncated cell JSON (or one edited into something that is not a
record, or a metric edited by hand: its checksum says so) is skipped with a one-line warning
naming its file by ``results show`` and ``results list``, and refused in one line (exit 2) by
``sweep`` and ``verify`` of its own grid; ``results.csv`` is rebuilt from the records; a grid's
manifest is written only once a cell is stored."""

from __future__ import annotations

import json
import re

import pytest

from attention_atlas.__main__ import main
from attention_atlas.experiments import run_experiment
from attention_atlas.store.records import (
    DamagedRecord,
    dumps_record,
    load_record,
    record_checksum,
    seal,
)


@pytest.mark.parametrize("damage", ["truncated", "a list"])
def test_a_damaged_record_is_named_skipped_by_show_and_refused_by_sweep(
    damage, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("ATTENTION_ATLAS_RESULTS", str(tmp_path))
    run_experiment("toy", preset="smoke", seeds=[0], log=None, progress=False)
    cell = sorted((tmp_path / "toy" / "smoke" / "cells").glob("*.json"))[0]
    load_record(cell)  # intact: its checksum matches
    if damage == "truncated":
        cell.write_text(cell.read_text()[:40])  # cut mid-record
        why = "not a readable record"
    else:
        cell.write_text(json.dumps([json.loads(cell.read_text())]))
        why = "not a record (a JSON list)"
    with pytest.raises(DamagedRecord, match=re.escape(f"{cell}: {why}")):
        load_record(cell)
    capsys.readouterr()
    for argv in (["results", "show", "toy", "smoke"], ["results", "list"]):
        assert main(argv) == 0
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert err == [f"warning: {cell}: {why}" + err[0].split(why, 1)[1]], err
        assert err[0].endswith("skipped")
    argv = ["sweep", "toy", "--preset", "smoke", "--seeds", "0", "--no-progress"]
    assert main(argv) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error: ") and str(cell) in err[0], err


def test_an_edited_metric_is_named_by_its_checksum_and_a_resealed_record_is_read(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("ATTENTION_ATLAS_RESULTS", str(tmp_path))
    run_experiment("toy", preset="smoke", seeds=[0], log=None, progress=False)
    cell = sorted((tmp_path / "toy" / "smoke" / "cells").glob("*.json"))[0]
    rec = load_record(cell)
    assert rec["checksum"] == record_checksum(rec) and rec["checksum"].startswith("sha256:")
    edited = {**rec, "loss_final": rec["loss_final"] * 0.5}  # a better loss, typed by hand
    cell.write_text(dumps_record(edited))
    with pytest.raises(DamagedRecord, match="changed after it was written"):
        load_record(cell)
    capsys.readouterr()
    assert main(["results", "show", "toy", "smoke"]) == 0
    captured = capsys.readouterr()
    err = [ln for ln in captured.err.splitlines() if ln.strip()]
    assert len(err) == 1 and str(cell) in err[0] and "changed after it was written" in err[0]
    assert f"{edited['loss_final']:.4g}" not in captured.out  # the edit is never shown
    assert main(["results", "verify", "--experiment", "toy"]) == 2
    assert "changed after it was written" in capsys.readouterr().err
    cell.write_text(dumps_record(seal(edited)))  # a deliberate change, resealed
    assert load_record(cell)["loss_final"] == edited["loss_final"]


def test_results_csv_is_rebuilt_from_the_records_never_trusted(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ATTENTION_ATLAS_RESULTS", str(tmp_path))
    run_experiment("toy", preset="smoke", seeds=[0], log=None, progress=False)
    folder = tmp_path / "toy" / "smoke"
    made = (folder / "results.csv").read_text()
    (folder / "results.csv").write_text(made.replace(made.splitlines()[1].split(",")[-1], "x"))
    capsys.readouterr()
    assert main(["results", "show", "toy", "smoke"]) == 0
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert err == [
        f"warning: {folder / 'results.csv'} did not match the records; rebuilt from them"
    ]
    assert (folder / "results.csv").read_text() == made
    assert main(["results", "list"]) == 0  # now current: nothing to say, nothing written
    assert capsys.readouterr().err == ""


def test_a_sweep_whose_first_cell_fails_leaves_no_grid_behind(tmp_path, monkeypatch):
    """The manifest is written once the grid's first cell is stored: a run that fails before
    leaves no grid.json (no phantom grid in `results list`, no refusal of the right command)."""
    from attention_atlas.experiments import toy

    monkeypatch.setenv("ATTENTION_ATLAS_RESULTS", str(tmp_path))

    def broken(params, seed):
        raise FloatingPointError("the loss is NaN")

    monkeypatch.setattr(toy, "run_cell", broken)
    with pytest.raises(RuntimeError, match="the loss is NaN"):
        run_experiment("toy", preset="smoke", seeds=[0], log=None, progress=False)
    folder = tmp_path / "toy" / "smoke"
    assert not (folder / "grid.json").exists() and not (folder / "results.csv").exists()
    assert not list((folder / "cells").glob("*"))
    monkeypatch.undo()
    monkeypatch.setenv("ATTENTION_ATLAS_RESULTS", str(tmp_path))
    run_experiment("toy", preset="smoke", seeds=[0], log=None, progress=False)
    assert (folder / "grid.json").exists() and (folder / "results.csv").exists()


def test_a_damaged_manifest_is_named_and_its_grid_skipped_by_list(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ATTENTION_ATLAS_RESULTS", str(tmp_path))
    run_experiment("toy", preset="smoke", seeds=[0], log=None, progress=False)
    manifest = tmp_path / "toy" / "smoke" / "grid.json"
    manifest.write_text(manifest.read_text()[:30])
    capsys.readouterr()
    assert main(["results", "list"]) == 0
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and str(manifest) in err[0] and "not a readable grid manifest" in err[0]

"""A damaged record is named: a truncated cell JSON (or one edited into something that is not a
record) is skipped with a one-line warning naming its file by ``results show`` and ``results
list``, and refused in one line (exit 2) by ``sweep`` of its own grid."""

from __future__ import annotations

import json
import re

import pytest

from attention_atlas.__main__ import main
from attention_atlas.experiments import run_experiment
from attention_atlas.store.records import DamagedRecord, load_record


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

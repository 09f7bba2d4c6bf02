"""A damaged record is named: a truncated cell JSON makes ``results show`` and ``sweep`` fail in
one line that names its file and why (exit 2), not with a bare JSONDecodeError."""

from __future__ import annotations

import pytest

from attention_atlas.__main__ import main
from attention_atlas.experiments import run_experiment
from attention_atlas.store.records import DamagedRecord, load_record


def test_a_truncated_record_is_named_by_show_and_sweep(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ATTENTION_ATLAS_RESULTS", str(tmp_path))
    run_experiment("toy", preset="smoke", seeds=[0], log=None, progress=False)
    cell = sorted((tmp_path / "toy" / "smoke" / "cells").glob("*.json"))[0]
    cell.write_text(cell.read_text()[:40])  # cut mid-record
    with pytest.raises(DamagedRecord, match=f"{cell}: not a readable record"):
        load_record(cell)
    for argv in (["results", "show", "toy", "smoke"],
                 ["sweep", "toy", "--preset", "smoke", "--seeds", "0", "--no-progress"]):  # fmt: skip
        assert main(argv) == 2
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(err) == 1 and err[0].startswith("error: ") and str(cell) in err[0], err
        assert "Traceback" not in err[0]

"""Atomic writes: the target holds the old content or the new one, never a torn mix."""

from __future__ import annotations

import pytest

from attention_atlas.atomic import atomic_path, atomic_write_text, partial_path


def test_a_write_replaces_the_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "sub" / "run.json"
    atomic_write_text("old", target)
    atomic_write_text("new", target)
    assert target.read_text() == "new"
    assert sorted(p.name for p in target.parent.iterdir()) == ["run.json"]


def test_a_write_that_fails_midway_leaves_the_old_file(tmp_path):
    target = tmp_path / "history.csv"
    atomic_write_text("old", target)
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half of the new")
        raise RuntimeError("killed")
    assert target.read_text() == "old" and not partial_path(target).exists()

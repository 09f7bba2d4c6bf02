"""Bad input on the command line: every command refuses it before any work starts, with one
line ``error: ...`` on stderr that names the setting and what was expected, no traceback, and
exit status 2 (``--debug`` shows the traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from live_servers import free_port

from attention_atlas.__main__ import main

torch.set_num_threads(1)  # tiny ops on a shared 2-core machine: threads only contend

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ["train", "--task", "copy", "-o", "progress=false", "--out", "{tmp}/run"]
BENCH = ["bench", "-B", "1", "-H", "2", "-L", "8", "-d", "4", "--reps", "1", "--no-memory"]
NOTEBOOK = ["notebooks", "run", "{tmp}/99_tiny.py", "--out", "{tmp}/nb"]

#: (command line, a fragment the one-line message must contain); {tmp} is a scratch folder
#: holding the files made by `scratch` below
BAD = {
    "train": [
        (TRAIN + ["-o", "dim=-5"], "model setting dim: expected a value >= 1, got -5"),
        (TRAIN + ["-o", "lr=nan"], "train setting lr: expected a finite number"),
        (TRAIN + ["-o", "lr=inf"], "train setting lr: expected a finite number"),
        (TRAIN + ["-o", "lr=-1e-3"], "train setting lr: expected a value > 0"),
        (TRAIN + ["-o", "dimm=5"], "unknown setting 'dimm'; did you mean 'dim'?"),
        (TRAIN + ["--attention", "nosuch"], "unknown attention variant 'nosuch'"),
        (TRAIN + ["-o", "batch_size=0"], "train setting batch_size: expected a value >= 1"),
        (TRAIN + ["-o", "steps=2.5"], "train setting steps: expected an integer"),
        (TRAIN + ["-o", "steps=true"], "train setting steps: expected a number, got True"),
        (TRAIN + ["-o", "eval_batch_size=0"], "eval_batch_size"),
        (TRAIN + ["-o", "dropout=1.5"], "model setting dropout: expected a value < 1"),
        (TRAIN + ["-o", "min_lr_ratio=2"], "train setting min_lr_ratio: expected a value <= 1"),
        (TRAIN + ["-o", "beta2=1"], "train setting beta2: expected a value < 1"),
        (TRAIN + ["-o", "dim=10", "-o", "n_heads=3"], "dim=10 is not divisible by n_heads=3"),
        (TRAIN + ["-o", "schedule=nope"], "schedule: expected 'steps' or 'time'"),
        (TRAIN + ["-o", "schedule=time"], "schedule='time' needs max_time_s"),
        (TRAIN + ["-o", 'regularizers=[{"name": "nope"}]'], "unknown regularizer 'nope'"),
        (TRAIN + ["-o", 'attention_options={"nosuch": 1}'], "does not take option 'nosuch'"),
        (TRAIN + ["-o", "device=gpu"], "train setting device: expected a torch device"),
        (TRAIN + ["-o", "dim"], "override 'dim' must look like key=value"),
        (TRAIN + ["-o"], "argument -o/--set: expected one argument"),
        (TRAIN + ["--resume"], "--resume: there is no checkpoint in"),
        (TRAIN + ["--config", "{tmp}/missing.yaml"], "missing.yaml does not exist"),
        (TRAIN + ["--config", "{tmp}/broken.yaml"], "is not valid YAML at line 2"),
        (TRAIN + ["--config", "{tmp}/typed.yaml"], "train setting steps: expected an integer"),
        (TRAIN + ["--config", "{tmp}/list.yaml"], "must hold a mapping, got list"),
        (TRAIN + ["--config", "{tmp}/section.yaml"], "unknown section 'trian'"),
        (TRAIN + ["--config", "{tmp}/broken.json"], "is not valid JSON at line 1"),
        (TRAIN + ["--task", "nosuch"], "unknown task 'nosuch'"),
        (TRAIN + ["-o", "task.nosuch=1"], "task 'copy' does not take option 'nosuch'"),
        (TRAIN + ["-o", "task.length=0"], "copy: length must be an integer >= 1, got 0"),
        (
            [
                "train",
                "--task",
                "ptb-char",
                "-o",
                "task.download=false",
                "--out",
                "{tmp}/run",
                "--data-dir",
                "{tmp}/empty",
            ],
            "data file ptb-char/ptb.char.train.txt is missing from",
        ),  # fmt: skip
        (["train", "--task", "copy", "--out", "{tmp}/a_file"], "--out: {tmp}/a_file is a file"),
        (["train", "--task", "copy", "--out", "{tmp}/a_file/run"], "which is a file"),
        (["train", "--task", "copy", "--out", "/proc/atlas-run"], "under /proc, where nothing"),
        (TRAIN + ["--config", "{tmp}/pipe.yaml"], "pipe.yaml is not a regular file"),
        (TRAIN + ["--config", "{tmp}"], "is not a regular file"),
        (["train", "--task", "copy", "--out", "{tmp}/done"], "holds the checkpoint of an earlier"),
    ],
    "bench": [
        (BENCH + ["nosuch"], "bench: unknown attention variant 'nosuch'"),
        (BENCH + ["dot", "-L", "-5"], "bench setting length: expected a value >= 1, got -5"),
        (BENCH + ["dot", "-B", "0"], "bench setting batch: expected a value >= 1"),
        (BENCH[:-3] + ["--reps", "0", "dot"], "bench setting reps"),
        (BENCH + ["dot", "--warmup", "-1"], "bench setting warmup: expected a value >= 0"),
        (BENCH + ["dot@fast"], "the only path suffix is '@explicit'"),
        (BENCH + ["dot", "--baseline", "nosuch"], "unknown attention variant 'nosuch'"),
        (BENCH + ["dot", "--options", "{bad json"], "--options: not valid JSON"),
        (BENCH + ["dot", "--options", '{"euclidean": {}}'], "is not one of the variants"),
        (BENCH + ["euclidean", "--options", '{"euclidean": {"nosuch": 1}}'], "does not take"),
        (BENCH + ["dot", "--device", "gpu"], "--device: expected a torch device"),
        (BENCH + ["--train", "--device", "gpu"], "--device: expected a torch device"),
        (BENCH + ["--train", "--device", "cuda"], "'cuda' asked for, but CUDA is not available"),
        (BENCH + ["--train", "--machine", "xeon"], "--machine xeon: names where --store puts"),
        (BENCH + ["--train", "--store", "--machine", "Xeon 2GHz"], "--machine: a machine label is"),
        (BENCH + ["dot", "--dtype", "float8"], "argument --dtype: invalid choice"),
        (BENCH + ["dot", "-L", "abc"], "argument -L/--length: invalid int value"),
        (BENCH + ["dot", "--json", "{tmp}/a_file/b.json"], "--json: {tmp}/a_file/b.json is under"),
        (BENCH + ["dot", "--json", "{tmp}"], "is a folder, expected a file name"),
        (BENCH + ["--lengths", "8", "--max-call-s", "nan"], "--max-call-s: expected a finite"),
        (BENCH + ["--lengths", "8", "--max-memory-gib", "0"], "--max-memory-gib: expected a"),
    ],
    "sweep": [
        (["sweep", "nosuch"], "argument experiment: invalid choice: 'nosuch'"),
        (["sweep", "fiber-bundle", "--preset", "nosuch"], "--preset: unknown preset 'nosuch'"),
        (["sweep", "fiber-bundle", "-p", "nosuch=1"], "has no grid parameter 'nosuch'"),
        (["sweep", "fiber-bundle", "-p", "steps"], "-p 'steps' must look like key=value"),
        (["sweep", "fiber-bundle", "--seeds", "-1"], "--seeds: expected distinct integers >= 0"),
        (["sweep", "fiber-bundle", "--seeds", "0", "0"], "--seeds: expected distinct"),
        (["sweep", "fiber-bundle", "--preset", "smoke", "--only", "zzz"], "--only: unknown"),
        (["sweep", "fiber-bundle", "--out", "{tmp}/a_file"], "--out: {tmp}/a_file is a file"),
        (["sweep", "toy", "--out", "{tmp}/a_file/grid"], "which is a file"),
        (["sweep", "toy", "--out", "/proc/atlas-grid"], "under /proc, where nothing"),
        (["sweep", "toy", "--gpus-per-cell", "1"], "--gpus-per-cell is a Dask resource request"),
        (["sweep", "toy", "--workers", "100000"], "--workers: 100000 processes, but this machine"),
        (
            ["sweep", "toy", "--backend", "dask", "--workers", "100000"],
            "--workers: 100000 processes, but this machine",
        ),
        (
            [
                "sweep",
                "toy",
                "--backend",
                "dask",
                "--address",
                "tcp://127.0.0.1:1",
                "--workers",
                "2",
            ],
            "--workers starts local processes: a cluster at --address runs cells on its own",
        ),
        (["sweep", "toy", "--threads", "100000"], "--threads 100000 x --workers 1: more threads"),
        (["sweep", "toy", "--address", "tcp://127.0.0.1:1"], "--address and --scheduler-file need"),
        (
            ["sweep", "toy", "--backend", "dask", "--scheduler-file", "{tmp}/a_file"],
            "--scheduler-file {tmp}/a_file: no scheduler address",
        ),
        (
            ["sweep", "toy", "--checkpoint-every", "-3"],
            "--checkpoint-every must be at least 0, got -3",
        ),
    ],
    "sweep values": [
        (["sweep", "toy", "--preset", "book", "-p", "steps=-5"], "steps: expected an integer >= 1"),
        (["sweep", "toy", "-p", "steps=2.5"], "steps: expected an integer >= 1, got 2.5"),
        (["sweep", "toy", "-p", "lr=NaN"], "-p lr: expected finite numbers, got NaN"),
        (["sweep", "toy", "-p", "lr=-1"], "lr: expected a finite number > 0, got -1"),
        (["sweep", "toy", "-p", "dims=[8,0]"], "dims[1]: expected an integer >= 1, got 0"),
        (["sweep", "toy", "-p", "dims=[9]"], "dims: 9 is not divisible by n_heads=2"),
        (["sweep", "fiber-bundle", "-p", "steps=Infinity"], "-p steps: expected finite numbers"),
    ],
    "notebooks": [
        (["notebooks", "run", "no_such_chapter"], "no chapter 'no_such_chapter'"),
        (NOTEBOOK + ["-p", "no_such_parameter=1"], "unknown parameter(s) ['no_such_parameter']"),
        (NOTEBOOK + ["-p", "n='three'"], "parameter 'n' in -p expects int"),
        (NOTEBOOK + ["-p", "1x=3"], "-p expects key=value with a Python name as key"),
        (NOTEBOOK + ["-j", "0"], "--jobs: expected an integer >= 1, got 0"),
        (NOTEBOOK + ["--timeout", "-1"], "--timeout: expected a number of seconds > 0"),
        (["notebooks", "run", "{tmp}/99_tiny.py", "--out", "{tmp}/a_file"], "is a file"),
        (["notebooks", "run", "{tmp}/99_tiny.py", "--out", "{tmp}/a_file/x"], "which is a file"),
        (["notebooks", "nosuch"], "invalid choice: 'nosuch'"),
    ],
    "data": [
        (["data", "fetch", "nosuch.txt"], "unknown data file 'nosuch.txt'"),
        (["data", "fetch", "--timeout", "0"], "--timeout: expected a number of seconds > 0"),
        (["data", "where", "--data-dir", "{tmp}/a_file"], "is a file, expected a folder"),
        (["data", "verify", "--data-dir", "{tmp}/a_file"], "is a file, expected a folder"),
        (["data", "nosuch"], "invalid choice: 'nosuch'"),
    ],
    "results": [
        (["results", "show", "nosuch", "book"], "unknown experiment 'nosuch'"),
        (["results", "show", "toy", "nosuch"], "no stored 'nosuch' grid of toy"),
        (["results", "verify", "--sample", "-1"], "--sample: expected an integer >= 1, got -1"),
        (["results", "verify", "--sample", "0"], "--sample: expected an integer >= 1, got 0"),
        (["results", "verify", "--rtol", "nan"], "--rtol: expected a finite number >= 0"),
        (["results", "verify", "--rtol", "-1"], "--rtol: expected a finite number >= 0"),
        (["results", "verify", "--experiment", "nosuch"], "--experiment: unknown experiment"),
        (["results", "nosuch"], "invalid choice: 'nosuch'"),
    ],
    "lab": [
        (["lab", "nosuch", "--no-browser"], "CHAPTER: no chapter 'nosuch'"),
        (["lab", "--port", "99999", "--no-browser"], "--port: expected a port from 1 to 65535"),
        (["lab", "--port", "0", "--no-browser"], "--port: expected a port from 1 to 65535"),
        (["lab", "--port", "x"], "argument --port: invalid int value"),
        (["lab", "--token", "t"], "unrecognized arguments: --token"),
    ],
    "serve": [
        (["serve", "--port", "99999"], "--port: expected a port from 1 to 65535"),
        (["serve", "--jupyter-port", "-1"], "--jupyter-port: expected a port from 1 to 65535"),
        (["serve", "--port", "{port}", "--jupyter-port", "{port}"], "must differ, both are"),
        (["serve", "--html", "{tmp}/empty", "--port", "{port}"], "--html: no built book at"),
        (["serve", "--token", "t"], "unrecognized arguments: --token"),
    ],
    "atlas": [
        (["atlas", "report", "nosuch"], "variant: expected a registered name"),
        (["atlas", "report", "{tmp}/missing.py:X"], "no such file"),
        (["atlas", "report", "{tmp}/99_tiny.py:Nope"], "has no attribute 'Nope'"),
        (
            ["atlas", "report", "os:sep"],
            "expected a subclass of attention_atlas.attention.Attention",
        ),
        (["atlas", "report", "no_such_module:Cls"], "cannot import module 'no_such_module'"),
        (
            ["atlas", "report", "dot", "--preset", "nosuch"],
            "--preset: expected one of smoke, book, long",
        ),
        (["atlas", "report", "dot", "-o", "nosuch=1"], "dot has no constructor option 'nosuch'"),
        (["atlas", "report", "dot", "-o", "1x=3"], "-o '1x=3': expected key=value"),
        (["atlas", "report", "dot", "-p", "depht=3"], "no parameter 'depht'; did you mean 'depth'"),
        (["atlas", "report", "dot", "-p", "depth=0"], "depth: expected an integer >= 1, got 0"),
        (["atlas", "report", "dot", "--seeds", "-1"], "--seeds: expected distinct integers >= 0"),
        (["atlas", "report", "dot", "--out", "{tmp}/a_file"], "is a file"),
        (["atlas", "nosuch"], "invalid choice: 'nosuch'"),
    ],
    "(none)": [
        ([], "the following arguments are required: COMMAND"),
        (["nosuch"], "argument COMMAND: invalid choice: 'nosuch'"),
    ],
}
CASES = [(cmd, argv, frag) for cmd, rows in BAD.items() for argv, frag in rows]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """The files the bad command lines name: broken config files, a file where a folder is
    expected, an empty data folder, a finished run's folder, a tiny chapter."""
    tmp = tmp_path_factory.mktemp("bad")
    (tmp / "broken.yaml").write_text("model: {dim: 16\n")
    (tmp / "typed.yaml").write_text("train: {steps: five}\n")
    (tmp / "list.yaml").write_text("- model\n- train\n")
    (tmp / "section.yaml").write_text("trian: {steps: 3}\n")
    (tmp / "broken.json").write_text('{"model": {"dim": 16,}}')
    (tmp / "a_file").write_text("not a folder\n")
    os.mkfifo(tmp / "pipe.yaml")  # a named pipe: reading it would wait for a writer
    (tmp / "empty").mkdir()
    (tmp / "done").mkdir()
    (tmp / "done" / "checkpoint.pt").write_bytes(b"")
    chapter = """\
        # %% tags=["parameters"]
        n = 3

        # %% tags=["smoke"]
        SMOKE = {"n": 2}

        # %%
        assert n > 0
    """
    (tmp / "99_tiny.py").write_text(textwrap.dedent(chapter))
    return tmp


def test_there_are_at_least_40_bad_inputs_and_every_command_has_some():
    assert len(CASES) >= 40
    assert {"train", "bench", "sweep", "notebooks", "data", "results", "lab", "serve",
            "atlas"} <= set(BAD)  # fmt: skip


@pytest.mark.parametrize(
    "command,argv,fragment", CASES, ids=[f"{c}:{' '.join(a[-3:])}" for c, a, _ in CASES]
)
def test_bad_input_exits_2_with_one_line_naming_it(
    command, argv, fragment, scratch, capsys, monkeypatch
):
    port = str(free_port())
    argv = [a.replace("{tmp}", str(scratch)).replace("{port}", port) for a in argv]
    if command.startswith("sweep"):  # its default --out is the results store: a scratch one
        monkeypatch.setenv("ATTENTION_ATLAS_RESULTS", str(scratch / "store"))
    before = sorted(map(str, scratch.rglob("*")))
    rc = main(argv)
    assert sorted(map(str, scratch.rglob("*"))) == before, "a refused command wrote something"
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    assert fragment.replace("{tmp}", str(scratch)) in lines[0], lines[0]


def run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "attention_atlas", *argv], capture_output=True, text=True,
        timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}, cwd=ROOT,
    )  # fmt: skip


def test_a_real_process_prints_one_line_and_debug_shows_the_traceback(tmp_path):
    bad = ["train", "--task", "copy", "-o", "dim=-5", "--out", str(tmp_path / "r")]
    plain = run(*bad)
    assert plain.returncode == 2
    assert plain.stderr.strip().splitlines() == [
        "error: model setting dim: expected a value >= 1, got -5"
    ]
    debug = run("--debug", *bad)
    assert debug.returncode != 0 and "Traceback (most recent call last)" in debug.stderr
    assert "ConfigError: model setting dim" in debug.stderr


def test_without_a_data_folder_the_readme_example_fails_in_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "ATTENTION_ATLAS_DATA"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # an empty user cache
    proc = subprocess.run(
        [sys.executable, "-m", "attention_atlas", "train", "--task", "ptb-char", "-o", "steps=1",
         "-o", "task.download=false", "--out", str(tmp_path / "r")],
        capture_output=True, text=True, timeout=120, env=env, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: data file ptb-char/ptb.char.train.txt is missing from")
    assert str(tmp_path / "cache") in line and "ATTENTION_ATLAS_DATA is not set" in line
    assert line.count("ptb.char.train.txt") == 1 and len(line) < 600  # said once, not nested

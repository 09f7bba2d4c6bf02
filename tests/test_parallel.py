"""tests/parallel.py, the shard runner of make test and make test-live: every test file in
exactly one shard, a failing shard fails the run with every shard's output shown, and a stopped
runner stops its shards and shows what they wrote."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import parallel  # noqa: E402

TESTS = Path(__file__).resolve().parent


def test_the_shards_cover_every_test_file_once_with_the_smoke_files_together() -> None:
    first, rest = parallel.shards("not live")
    assert set(parallel.SMOKE_FILES) <= set(parallel.FIRST_SHARD)
    assert sorted(Path(p).name for p in first) == sorted(parallel.FIRST_SHARD)
    assert all((TESTS / name).is_file() for name in parallel.FIRST_SHARD)
    assert rest[0] == str(TESTS)
    assert sorted(Path(a.split("=", 1)[1]).name for a in rest[1:]) == sorted(parallel.FIRST_SHARD)
    live = parallel.shards("live")
    assert [Path(s[0]).name for s in live] == ["test_lab_browser.py", "test_live_book.py"]
    assert all(len(s) == 1 for s in live)


def test_every_file_that_uses_the_smoke_chapters_is_in_their_shard() -> None:
    uses = re.compile(r"\b(smoke_runs|smoke_book)\b")
    others = [p for p in TESTS.glob("test_*.py") if p.name != Path(__file__).name]
    users = {p.name for p in others if uses.search(p.read_text())}
    assert users == set(parallel.SMOKE_FILES)


def test_a_failing_shard_fails_the_run_and_every_output_is_shown(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "conftest.py").write_text("")
    body = "import pytest\npytestmark = pytest.mark.live\n"
    (tmp_path / "test_ok.py").write_text(body + "def test_passes():\n    assert 1 + 1 == 2\n")
    (tmp_path / "test_bad.py").write_text(body + "def test_fails():\n    assert 1 + 1 == 3\n")
    rc = parallel.main(["-m", "live"], tests=tmp_path)
    out = capfd.readouterr().out
    assert rc == 1, out
    assert "test_bad.py F" in out and "test_ok.py ." in out, out
    assert "shard 0: exit 1" in out and "shard 1: exit 0" in out, out
    (tmp_path / "test_bad.py").unlink()
    assert parallel.main(["-m", "live"], tests=tmp_path) == 0
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # restored


def test_a_marker_other_than_live_or_not_live_is_refused() -> None:
    with pytest.raises(SystemExit, match="must be 'live' or 'not live', got 'slow'"):
        parallel.shards("slow")


def test_a_stopped_runner_stops_its_shards_and_prints_their_output_so_far(tmp_path: Path) -> None:
    body = "import pytest\npytestmark = pytest.mark.live\n"
    (tmp_path / "conftest.py").write_text("")
    marker = tmp_path / "started"
    (tmp_path / "test_slow.py").write_text(
        body + "import pathlib, time\n"
        f"def test_first():\n    pass\n\n"
        f"def test_waits():\n    pathlib.Path({str(marker)!r}).write_text('1')\n    time.sleep(300)\n"
    )
    code = (f"import sys; sys.path.insert(0, {str(TESTS)!r}); import parallel, pathlib; "
            f"sys.exit(parallel.main(['-m', 'live'], tests=pathlib.Path({str(tmp_path)!r})))")  # fmt: skip
    runner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert time.monotonic() < deadline and runner.poll() is None, "the shard never started"
        time.sleep(0.2)
    shard = [p for p in psutil.Process(runner.pid).children() if "pytest" in " ".join(p.cmdline())]
    assert len(shard) == 1
    runner.send_signal(signal.SIGTERM)
    out, _ = runner.communicate(timeout=60)
    assert runner.returncode == 128 + signal.SIGTERM, out
    assert "test_slow.py ." in out and "shard 0 stopped: its output so far is above" in out, out
    assert not shard[0].is_running() or shard[0].status() == psutil.STATUS_ZOMBIE

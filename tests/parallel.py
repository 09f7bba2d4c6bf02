"""Run the tests as concurrent pytest processes (shards) and fail if any of them fails: ``make
test`` and ``make test-live`` use it, so the two cores CI has both work.

    python tests/parallel.py -m "not live"     # two shards: the smoke-chapter files (and one
                                               # more), the rest
    python tests/parallel.py -m live           # one shard per live file (its own servers)
    python tests/parallel.py -m "not live" -k cofactor   # more pytest arguments: one process

The shards split by file, so a module's fixtures are made once; the files that share the
smoke-executed chapters and the book built from them (``conftest.py``'s session fixtures) are
one shard. (pytest-xdist's ``--dist loadgroup`` would do this, but under this pytest, 9.2, its
groups are not applied and the chapters ran once per worker.) Each shard's output is printed
whole when it ends, then one line per shard: its exit status and seconds. Stopped (Ctrl-C or
SIGTERM), it stops its shards and prints what each had written.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent
#: the files whose tests use the smoke-executed chapters (``smoke_runs``, ``smoke_book``)
SMOKE_FILES = ("test_notebooks.py", "test_book.py", "test_browser.py")
#: the first shard's other files, to even the shards: in a clean-clone CI run (73c9619) the
#: smoke files took 342 s and the rest 669 s, of which the GPU run's rehearsal 110 to 160
FIRST_SHARD = (*SMOKE_FILES, "test_gpu_scripts.py")


def live_files(tests: Path = TESTS) -> list[str]:
    """The test files marked ``live``, one shard each (each starts its own servers)."""
    marked = re.compile(r"^pytestmark = .*pytest\.mark\.live\b", re.MULTILINE)
    return sorted(p.name for p in tests.glob("test_*.py") if marked.search(p.read_text()))


def shards(marker: str, tests: Path = TESTS) -> list[list[str]]:
    """pytest arguments of each shard for ``-m marker`` (``"live"`` or ``"not live"``)."""
    if marker == "live":
        return [[str(tests / name)] for name in live_files(tests)]
    if marker == "not live":
        first = [str(tests / name) for name in FIRST_SHARD if (tests / name).exists()]
        rest = [str(tests)] + [f"--ignore={path}" for path in first]
        return [first, rest] if first else [rest]
    raise SystemExit(f"parallel.py: -m must be 'live' or 'not live', got {marker!r}")


def _stop(signum: int, frame: object) -> None:
    """SIGTERM (a CI job cancelled, ``timeout``): unwind through ``main``'s clean-up."""
    raise SystemExit(128 + signum)


def main(argv: list[str], tests: Path = TESTS) -> int:
    """Run ``pytest -m MARKER`` in shards (or, with more arguments, in one process); returns the
    first failing shard's exit status, else 0."""
    if len(argv) < 2 or argv[0] != "-m":
        raise SystemExit(f"usage: parallel.py -m 'live'|'not live' [pytest args], got {argv}")
    marker, extra = argv[1], argv[2:]
    base = [sys.executable, "-m", "pytest", "-m", marker]
    if extra:  # a selection of its own: one process, as pytest would run it
        return subprocess.call([*base, *extra])
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        return _run_shards(base, shards(marker, tests))
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_shards(base: list[str], shard_args: list[list[str]]) -> int:
    """:func:`main`'s shards: started at once, each one's output printed when it ends."""
    procs = []
    with tempfile.TemporaryDirectory(prefix="shards-") as tmp:
        for i, args in enumerate(shard_args):
            log = open(Path(tmp) / f"shard{i}.log", "w+")  # noqa: SIM115 (closed below)
            cmd = [*base, *args]
            print(f"[parallel] shard {i}: {' '.join(cmd[1:])}", flush=True)
            procs.append((i, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log))
        start, status = time.monotonic(), {}
        try:
            while len(status) < len(procs):
                for i, proc, log in procs:
                    if i in status or proc.poll() is None:
                        continue
                    status[i] = (proc.returncode, time.monotonic() - start)
                    log.seek(0)
                    sys.stdout.write(log.read())
                    log.close()
                    print(f"[parallel] shard {i} ended: exit {proc.returncode}", flush=True)
                time.sleep(0.5)
        finally:  # stopped (Ctrl-C, SIGTERM): no shard outlives the runner, no output is lost
            for i, proc, log in procs:
                if i in status:
                    continue
                if proc.poll() is None:
                    proc.terminate()
                    proc.wait()
                log.seek(0)
                sys.stdout.write(log.read())
                log.close()
                print(f"[parallel] shard {i} stopped: its output so far is above", flush=True)
    for i, (rc, seconds) in sorted(status.items()):
        print(f"[parallel] shard {i}: exit {rc} after {seconds:.0f} s")
    return next((rc for rc, _ in status.values() if rc), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

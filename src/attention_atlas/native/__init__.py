"""Native CPU kernels for the Fiber Bundle Transformer's hot paths, the cofactor regulariser's
causal heads (:class:`attention_atlas.cofactor.penalty.CausalHeadPenalty`) and the SSM's
intra-chunk decay mask (:class:`attention_atlas.attention.sma.duality._MaskedScoresT`), and the
switch that selects them.

The library's own paths are PyTorch operators: many small ones per token and per pair, whose
cost on a CPU is their number and their memory traffic, not their arithmetic (chapter 8). The
kernels in ``kernels.c`` do the same maths in one loop each, with every intermediate in
registers or the first-level cache. They are plain C (no Python or torch headers), built once
per machine with the system's C compiler (``$CC``, else ``cc`` or ``gcc``; ``-O3
-march=native``, 30 to 120 s of one core with gcc 12) into a cache folder, loaded with
:mod:`ctypes` and called on contiguous CPU tensors; float32 and float64.

They are **opt-in**: ``with native.enabled(True): ...`` (or ``TrainConfig(native=True)``,
``sweep --native``, ``train -o native=true``). Their rounding differs from the PyTorch paths',
so a run records whether it used them and at which :data:`LEVEL` (a kernel that changes a run's
rounding comes at a new level; ``enabled(1)`` keeps the older set), and ``results verify``
re-runs a record the way it was made. Where a kernel does not apply (a CUDA tensor, another
dtype, a ``torch.compile`` trace) or no compiler is found, the PyTorch path runs; :func:`status`
says which and why.

Each kernel is tested against the library's reference in float64 (values and gradients, and
``torch.autograd.gradcheck`` of the autograd functions built on them).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attention_atlas.provenance import cpu_id, cpu_model

__all__ = [
    "SOURCE",
    "active",
    "applies",
    "enabled",
    "is_enabled",
    "level",
    "resolve_level",
    "LEVEL",
    "call",
    "kernel",
    "library",
    "status",
    "vector_lanes",
]

#: the C source of the kernels
SOURCE = Path(__file__).with_name("kernels.c")
_FLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-fPIC", "-shared", "-std=c99")

_state = threading.local()
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_error: str | None = None


#: the level :func:`enabled` switches on by default: the set of kernels a run uses. Each new
#: kernel that changes a training run's rounding comes at a new level, so that a run made at an
#: earlier level (its record says ``native_level``; records without it were made at level 1)
#: re-runs exactly at that level. Level 1: the pairwise, projection, Woodbury, skew and Gram
#: kernels and the cofactor regulariser's causal heads. Level 2 adds the Fiber Bundle
#: regulariser in one kernel per layer (:class:`attention_atlas.native.functions.FiberBundleTerms`)
#: and the metric strength ``kappa_t`` of the curvature in one pass
#: (:class:`attention_atlas.native.functions.MetricStrength`), and forms the base of the causal
#: scores inside the pairwise kernels (:class:`attention_atlas.native.functions.CausalScores`,
#: head dimension 16). Level 3 forms the cofactor regulariser's causal heads
#: (:class:`attention_atlas.cofactor.native_heads.CausalHeadsPenalty`) with fused multiply-adds.
#: The SSM's decay-mask kernels (``ssm_mask_forward``, ``ssm_mask_backward``) run at every level:
#: they give the PyTorch path's bits exactly, so they change no run's rounding.
LEVEL = 3


def level() -> int:
    """The native kernels' level switched on in this thread (0: off; :func:`enabled`)."""
    return int(getattr(_state, "level", 0))


def is_enabled() -> bool:
    """Whether the native kernels are switched on in this thread (:func:`enabled`)."""
    return level() > 0


def resolve_level(on: bool | int) -> int:
    """The level that ``enabled(on)`` switches on: ``True`` :data:`LEVEL`, ``False`` 0, an int
    that level (``0 <= on <= LEVEL``)."""
    if isinstance(on, bool):
        return LEVEL if on else 0
    if not isinstance(on, int) or not 0 <= on <= LEVEL:
        raise ValueError(f"native level must be a bool or an int from 0 to {LEVEL}, got {on!r}")
    return on


@contextlib.contextmanager
def enabled(on: bool | int = True) -> Iterator[None]:
    """Switch the native kernels on (or off) inside the block, in this thread: ``True`` at
    :data:`LEVEL`, an int at that level (a record's ``native_level``), ``False`` off."""
    before = level()
    _state.level = resolve_level(on)
    try:
        yield
    finally:
        _state.level = before


def _cache_dir() -> Path:
    root = os.environ.get("ATTENTION_ATLAS_CACHE")
    base = Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return (base if root else base / "attention_atlas") / "native"


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return name
    return None


def _build(cc: str) -> Path:
    """Compile ``kernels.c`` into the cache (once per source, flags, compiler and processor:
    its model name and vector units, :func:`~attention_atlas.provenance.cpu_id`), the
    shared object written beside its final name and renamed over it (atomic)."""
    text = SOURCE.read_bytes()
    key = hashlib.sha256(
        text + " ".join((cc, *_FLAGS, platform.machine(), cpu_model(), cpu_id())).encode()
    ).hexdigest()[:16]
    target = _cache_dir() / f"kernels-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # one build per machine: the first process compiles under an exclusive lock on a file beside
    # the target; the others wait for it (however long a busy machine takes) and load its build
    with open(target.with_name(f".{target.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            return target
        tmp = target.with_name(f".{target.name}.{os.getpid()}.partial")
        try:
            proc = subprocess.run(
                [cc, *_FLAGS, str(SOURCE), "-o", str(tmp), "-lm"], capture_output=True, text=True
            )
            if proc.returncode != 0:
                raise RuntimeError(
                    f"building the native kernels with {cc} failed: {proc.stderr.strip()[-400:]}"
                )
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
    return target


#: argument types of each kernel (the suffix _f32 or _f64 picks the dtype); ``p`` a pointer,
#: ``n`` a size, ``f`` a scalar (double), ``i`` a flag
_SIGNATURES = {
    "pairwise_forward": "pppnnnnfippf",
    "pairwise_backward": "pppppnnnnfifipppp",
    "projection_forward": "pppnnnnnnnnfi",
    "projection_backward": "pppppnnnnnnnnfi",
    "woodbury_forward": "pppnnn",
    "woodbury_backward": "pppppnnn",
    "skew_forward": "ppppnnnnnnnnnni",
    "skew_backward": "pppppppnnnnnnnnnni",
    "gram_forward": "pppppnnnn",
    "gram_backward": "ppppppnnnn",
    "fbt_terms": "pppnnnnpfffi",
    "sumsq": "ppnn",
    "causal_head_forward": "pppppnnnnnfff",
    "causal_head_backward": "pppppppnnnnnnnfff",
    "causal_heads_fused": "ppnnnnnnnpppnnnnfffii",
    "ssm_mask_forward": "pppnn",
    "ssm_mask_backward": "pppppnni",
}
_CTYPES = {"p": ctypes.c_void_p, "n": ctypes.c_long, "f": ctypes.c_double, "i": ctypes.c_int}
#: the largest metric or factor rank the kernels take (RMAX in kernels.c)
MAX_RANK = 16


def _declare(lib: ctypes.CDLL) -> None:
    for name, sig in _SIGNATURES.items():
        for suf in ("f32", "f64"):
            fn = getattr(lib, f"{name}_{suf}")
            fn.argtypes = [_CTYPES[c] for c in sig]
            fn.restype = ctypes.c_double if name == "projection_backward" else None


def library() -> ctypes.CDLL | None:
    """The loaded kernels (built on first use), or None when they cannot be built here (no C
    compiler, or it failed: :func:`status` says why)."""
    global _lib, _error
    if _lib is not None or _error is not None:
        return _lib
    with _lock:
        if _lib is None and _error is None:
            cc = _compiler()
            if cc is None:
                _error = "no C compiler found ($CC, cc or gcc)"
                return None
            try:
                lib = ctypes.CDLL(str(_build(cc)))
                _declare(lib)
                _lib = lib
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                _error = str(exc)
    return _lib


def status() -> str:
    """One line: whether the native kernels are built and loaded here, or why not."""
    lib = library()
    if lib is None:
        return f"native kernels unavailable: {_error}"
    return "native kernels loaded"


def vector_lanes() -> int:
    """The lanes of the kernels' vector values in the loaded build (``VW`` in ``kernels.c``): 16
    where 16 floats fit one vector register (x86 with AVX-512), else 8 (the pairwise kernels
    then take each block of 16 keys or head columns as two halves, the lane path of the
    projection and skew kernels (``functions.TOKEN_LANES = 1``) 8 tokens per pass: the same
    bits); 0 where the kernels do not load."""
    lib = library()
    return int(lib.vector_lanes()) if lib is not None else 0


def applies(*tensors: Tensor) -> bool:
    """Whether a native kernel can take these tensors: CPU, float32 or float64 (one dtype), not
    inside a ``torch.compile`` trace, and the kernels load."""
    if torch.compiler.is_compiling():
        return False
    dtype = tensors[0].dtype
    if dtype not in (torch.float32, torch.float64):
        return False
    if any(t.device.type != "cpu" or t.dtype != dtype for t in tensors):
        return False
    return library() is not None


def active(*tensors: Tensor, since: int = 1) -> bool:
    """Switched on (:func:`enabled`) at level ``since`` or above and applicable to these tensors
    (:func:`applies`)."""
    return level() >= since and applies(*tensors)


def kernel(name: str, dtype: torch.dtype) -> Any:
    """Kernel ``name``'s ctypes function for ``dtype`` (float64, else the float32 build), to be
    called with ints (addresses from ``Tensor.data_ptr()``) and floats as :data:`_SIGNATURES`
    lists them: no checks, for a caller that made its own (:func:`call` checks each tensor)."""
    lib = library()
    if lib is None:
        raise RuntimeError(status())
    return getattr(lib, f"{name}_{'f64' if dtype == torch.float64 else 'f32'}")


def call(name: str, *args: Tensor | int | float) -> float | None:
    """Run kernel ``name`` (:data:`_SIGNATURES`) on ``args``: tensors (contiguous, CPU, all of
    the first tensor's dtype, which picks the float32 or float64 build) pass as pointers."""
    lib = library()
    if lib is None:
        raise RuntimeError(status())
    dtype = next(a for a in args if isinstance(a, Tensor)).dtype
    suffix = "f64" if dtype == torch.float64 else "f32"
    conv: list[int | float] = []
    for a in args:
        if isinstance(a, Tensor):
            if not a.is_contiguous() or a.device.type != "cpu":
                raise ValueError(
                    f"kernel {name} needs contiguous CPU tensors, got {a.device} strides {a.stride()}"
                )
            if a.dtype != dtype and a.dtype != torch.float64:
                raise ValueError(f"kernel {name}: tensors of {dtype}, got one of {a.dtype}")
            conv.append(a.data_ptr())
        else:
            conv.append(a)
    result: float | None = getattr(lib, f"{name}_{suffix}")(*conv)
    return result

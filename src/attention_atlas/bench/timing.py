"""Benchmarks: time functions against a baseline in the same process, side by side.

Timings on a shared machine are noisy; ratios measured in one process, interleaved, are not
(much). :func:`compare` therefore

1. warms every function up (and picks how many calls make one timing sample, so a sample lasts
   at least ``min_sample_s``);
2. runs ``reps`` rounds; in each round every function is timed once, forward and
   forward+backward, in a rotated order (round-robin, so no function always runs first);
3. reports per function the median time, and the median and quartiles of the per-round ratio
   to the baseline (a ratio is taken within one round, so slow phases of the machine cancel);
4. measures peak memory of one forward+backward, separately from the timing:

   * CUDA: ``torch.cuda.max_memory_allocated`` minus the memory allocated before the call;
   * CPU: the high-water mark of live tensor bytes reconstructed from a ``torch.profiler``
     trace with ``profile_memory=True`` (each event's net self allocation, in time order). It
     counts tensor memory only (not allocator overhead), and a buffer allocated and freed
     inside one operator is missed, so it is a lower bound on what the call touches.

:func:`bench_attention` builds registered variants (``"name"``, or ``"name@explicit"`` for the
materialised path with ``need_weights=True``) on the same random ``q, k, v`` and compares their
:meth:`~attention_atlas.attention.base.Attention.attend`. Results are plain dicts, written as JSON
for the chapters to plot; ``python -m attention_atlas bench`` is the command line.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from attention_atlas.atomic import atomic_write_text
from attention_atlas.attention.base import AttentionResult
from attention_atlas.attention.registry import build_attention

__all__ = [
    "bench_attention",
    "compare",
    "count_flops",
    "cpu_time_ratio",
    "peak_memory",
    "quiet_stderr_fd",
    "time_steps",
]


def _first_tensor(out: Any) -> Tensor:
    if isinstance(out, Tensor):
        return out
    if isinstance(out, AttentionResult):
        return out.out
    if isinstance(out, tuple | list) and out and isinstance(out[0], Tensor):
        return out[0]
    raise TypeError(
        f"a benchmarked function must return a Tensor, an AttentionResult or a tuple whose first "
        f"item is a Tensor; got {type(out).__name__}"
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":  # pragma: no cover
        torch.mps.synchronize()


def _leaves(args: Sequence[Any]) -> list[Tensor]:
    return [a for a in args if isinstance(a, Tensor) and a.requires_grad]


def _make_step(fn: Callable[..., Any], args: Sequence[Any], backward: bool) -> Callable[[], None]:
    leaves = _leaves(args)
    params: list[Tensor] = []
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, torch.nn.Module):
        params = [p for p in owner.parameters() if p.requires_grad]
    extra = getattr(fn, "bench_params", None)
    if extra:
        params = params + list(extra)
    wrt = leaves + params

    def fwd() -> None:
        with torch.no_grad():
            fn(*args)

    def fwd_bwd() -> None:
        out = _first_tensor(fn(*args))
        if not wrt:
            raise ValueError("forward+backward needs inputs with requires_grad=True")
        torch.autograd.grad(out, wrt, grad_outputs=torch.ones_like(out), allow_unused=True)

    return fwd_bwd if backward else fwd


@contextlib.contextmanager
def quiet_stderr_fd() -> Iterator[None]:
    """Silence file descriptor 2 (the profiler's C++ start/stop lines, which would otherwise
    land in a notebook's output) for the duration of the block."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real fd 2 (an embedded interpreter): nothing to silence
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def peak_memory(step: Callable[[], None], device: torch.device) -> int:
    """Peak bytes allocated by ``step()`` above what was allocated before it (see module doc)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - before)
    from torch.profiler import ProfilerActivity, profile

    with (
        quiet_stderr_fd(),
        profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof,
    ):
        step()
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    cur = peak = 0
    for e in events:
        cur += int(e.self_cpu_memory_usage)
        peak = max(peak, cur)
    return peak


#: the clocks :func:`compare` can time with: wall time, or this thread's CPU time
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.thread_time}


def time_steps(
    step: Callable[[], None], number: int, device: torch.device, clock: str = "wall"
) -> float:
    """Seconds per call of ``step`` over ``number`` calls on ``clock`` (``"wall"`` or
    ``"cpu"``), the device synchronised before and after."""
    now = CLOCKS[clock]
    _sync(device)
    t0 = now()
    for _ in range(number):
        step()
    _sync(device)
    return (now() - t0) / number


def cpu_time_ratio(
    slow: Callable[..., Any],
    fast: Callable[..., Any],
    args: Sequence[Any] = (),
    reps: int = 5,
    min_sample_s: float = 0.02,
) -> float:
    """Median over interleaved rounds of CPU-time(``slow``) / CPU-time(``fast``), no grad.

    CPU time is this thread's (``time.thread_time``), which time-sharing with other processes
    does not inflate, unlike wall time; each sample repeats a call until it lasts at least
    ``min_sample_s``. Meaningful for single-threaded work (``torch.set_num_threads(1)``).
    """

    def sample(f: Callable[..., Any], number: int) -> float:
        t0 = time.thread_time()
        for _ in range(number):
            f(*args)
        return (time.thread_time() - t0) / number

    with torch.no_grad():
        number = {
            f: max(1, math.ceil(min_sample_s / max(sample(f, 1), 1e-6))) for f in (slow, fast)
        }
        ratios = [sample(slow, number[slow]) / sample(fast, number[fast]) for _ in range(reps)]
    return statistics.median(ratios)


def count_flops(fn: Callable[..., Any], *args: Any, backward: bool = False) -> int:
    """FLOPs of the matrix products one call of ``fn(*args)`` runs, counted exactly by
    :class:`torch.utils.flop_counter.FlopCounterMode` (elementwise work is not counted;
    ``2 m n k`` per ``(m, k) @ (k, n)`` product). With ``backward`` the count includes the
    backward of the output's sum with respect to every argument that requires grad."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        out = _first_tensor(fn(*args))
        if backward:
            out.sum().backward()
    return int(counter.get_total_flops())


def compare(
    fns: dict[str, Callable[..., Any]],
    baseline: str,
    args: Sequence[Any] = (),
    *,
    backward: bool = True,
    warmup: int = 2,
    reps: int = 10,
    min_sample_s: float = 0.02,
    memory: bool = True,
    meta: dict[str, Any] | None = None,
    json_path: str | os.PathLike[str] | None = None,
    clock: str = "wall",
    device: torch.device | str | None = None,
    settle: int = 0,
) -> dict[str, Any]:
    """Time ``fn(*args)`` for each function (forward, and forward+backward) against ``baseline``.

    Args:
        fns: name -> callable; each returns a Tensor (or an AttentionResult, or a tuple whose
            first item is the output). Backward takes the gradient with respect to the tensors
            of ``args`` that require grad (and the parameters of a bound ``nn.Module`` method,
            or those listed in a ``bench_params`` attribute of the callable).
        baseline: the key of ``fns`` every ratio is taken against.
        args: the shared inputs (on the device to measure on).
        backward: also time forward+backward.
        warmup: untimed calls of each function before timing.
        reps: timed rounds (each gives one ratio per function).
        min_sample_s: calls are repeated within a sample until it lasts about this long.
        memory: measure peak memory of one forward+backward (forward when ``backward=False``).
        meta: extra fields for the result (shapes, dtype, ...).
        json_path: write the result there as JSON.
        clock: ``"wall"`` (default) or ``"cpu"``: this thread's CPU time (``time.thread_time``),
            which time-sharing with other processes does not inflate; for single-threaded CPU
            work only (``torch.set_num_threads(1)``).
        device: where the functions compute (synchronised around each sample on a GPU);
            default the device of the first tensor of ``args``, else the CPU.
        settle: untimed calls of a function right before each of its timed samples, so that no
            sample pays for the caches the function before it in the round left behind (a
            training loop runs one model's steps back to back).

    Returns:
        ``{"baseline", "device", "meta", "results": {name: {"forward": {...},
        "forward_backward": {...}, "peak_memory_bytes"}}}``, where each timing dict holds
        ``median_s``, ``q25_s``, ``q75_s``, ``ratio_median``, ``ratio_q25``, ``ratio_q75``,
        ``samples_s`` and ``number`` (calls per sample).
    """
    if baseline not in fns:
        raise ValueError(f"baseline {baseline!r} is not one of the functions: {', '.join(fns)}")
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    tensors = [a for a in args if isinstance(a, Tensor)]
    if device is not None:
        device = torch.device(device)
    else:
        device = tensors[0].device if tensors else torch.device("cpu")
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)}, got {clock!r}")
    if clock == "cpu" and (device.type != "cpu" or torch.get_num_threads() != 1):
        raise ValueError(
            f"clock='cpu' times one CPU thread: needs CPU tensors and torch.get_num_threads() "
            f"== 1, got device {device} and {torch.get_num_threads()} threads"
        )
    modes = ["forward"] + (["forward_backward"] if backward else [])
    steps = {
        (n, m): _make_step(f, args, m == "forward_backward") for n, f in fns.items() for m in modes
    }
    # 1. warm-up and calibration
    number: dict[tuple[str, str], int] = {}
    for key, step in steps.items():
        for _ in range(max(1, warmup)):
            t = time_steps(step, 1, device, clock)
        number[key] = max(1, math.ceil(min_sample_s / max(t, 1e-9)))
    # 2. interleaved rounds
    names = list(fns)
    samples: dict[tuple[str, str], list[float]] = {k: [] for k in steps}
    for r in range(reps):
        order = names[r % len(names) :] + names[: r % len(names)]
        for m in modes:
            for n in order:
                for _ in range(settle):
                    steps[(n, m)]()
                samples[(n, m)].append(time_steps(steps[(n, m)], number[(n, m)], device, clock))
    # 3. summaries
    results: dict[str, Any] = {}
    for n in names:
        res: dict[str, Any] = {}
        for m in modes:
            s = samples[(n, m)]
            ratios = [a / b for a, b in zip(s, samples[(baseline, m)])]
            res[m] = {
                "median_s": statistics.median(s),
                "q25_s": _quantile(s, 0.25),
                "q75_s": _quantile(s, 0.75),
                "ratio_median": statistics.median(ratios),
                "ratio_q25": _quantile(ratios, 0.25),
                "ratio_q75": _quantile(ratios, 0.75),
                "samples_s": s,
                "number": number[(n, m)],
            }
        results[n] = res
    # 4. memory, outside the timed loop
    if memory:
        for n in names:
            results[n]["peak_memory_bytes"] = peak_memory(steps[(n, modes[-1])], device)
            results[n]["peak_memory_of"] = modes[-1]
    out = {
        "baseline": baseline,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "reps": reps,
        "clock": clock,
        "memory_method": (
            "cuda.max_memory_allocated"
            if device.type == "cuda"
            else "torch.profiler live tensor bytes"
        ),
        "meta": meta or {},
        "results": results,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if json_path is not None:
        atomic_write_text(json.dumps(out, indent=2), json_path)
    return out


def _quantile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def bench_attention(
    variants: Sequence[str],
    baseline: str = "dot",
    *,
    batch: int = 4,
    heads: int = 8,
    length: int = 1024,
    head_dim: int = 16,
    causal: bool = True,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device | None = None,
    options: dict[str, dict[str, Any]] | None = None,
    seed: int = 0,
    **compare_kwargs: Any,
) -> dict[str, Any]:
    """Compare registered variants' :meth:`attend` on the same ``q, k, v (B, H, L, d)``.

    ``variants`` are registry names; ``"name@explicit"`` times the materialised path
    (``need_weights=True``). ``options[name]`` are constructor options of a variant. The
    baseline must be one of ``variants`` (it is added if missing).
    """
    dev = torch.device(device) if device is not None else (
        torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    )  # fmt: skip
    variants = list(variants)
    if baseline not in variants:
        variants.insert(0, baseline)
    g = torch.Generator(device="cpu").manual_seed(seed)
    shape = (batch, heads, length, head_dim)
    q, k, v = (
        torch.randn(shape, generator=g, dtype=dtype).to(dev).requires_grad_() for _ in range(3)
    )
    x = torch.randn(batch, length, heads * head_dim, generator=g, dtype=dtype).to(dev)
    fns: dict[str, Callable[..., Any]] = {}
    for spec in variants:
        name, _, path = spec.partition("@")
        if path not in ("", "explicit"):
            raise ValueError(f"variant spec {spec!r}: the only path suffix is '@explicit'")
        torch.manual_seed(seed)
        mod = build_attention(
            name, dim=heads * head_dim, n_heads=heads, **(options or {}).get(name, {})
        ).to(device=dev, dtype=dtype)
        need_w = path == "explicit"

        def fn(q: Tensor, k: Tensor, v: Tensor, _m: Any = mod, _w: bool = need_w) -> Tensor:
            return _m.attend(q, k, v, x=x, causal=causal, mask=None, need_weights=_w).out

        fn.bench_params = [  # type: ignore[attr-defined]
            p for n_, p in mod.named_parameters() if not n_.startswith(("qkv.", "proj."))
        ]  # type: ignore[attr-defined]
        fns[spec] = fn
    meta = {
        "batch": batch, "heads": heads, "length": length, "head_dim": head_dim,
        "causal": causal, "dtype": str(dtype).replace("torch.", ""),
    }  # fmt: skip
    return compare(fns, baseline, (q, k, v), meta=meta, **compare_kwargs)


def format_table(result: dict[str, Any]) -> str:
    """A plain-text table of a :func:`compare` result."""
    lines = [
        f"baseline {result['baseline']} on {result['device']} ({result['threads']} threads), "
        f"{result['reps']} rounds; {result['meta']}",
        f"{'name':<28} {'fwd ms':>9} {'ratio':>7} {'[q25,q75]':>15} {'fwd+bwd ms':>11} "
        f"{'ratio':>7} {'[q25,q75]':>15} {'peak MiB':>9}",
    ]
    for n, r in result["results"].items():
        f = r["forward"]
        row = f"{n:<28} {f['median_s'] * 1e3:>9.3f} {f['ratio_median']:>7.3f} " + (
            f"[{f['ratio_q25']:.2f},{f['ratio_q75']:.2f}]".rjust(15)
        )
        if "forward_backward" in r:
            b = r["forward_backward"]
            row += f" {b['median_s'] * 1e3:>11.3f} {b['ratio_median']:>7.3f} " + (
                f"[{b['ratio_q25']:.2f},{b['ratio_q75']:.2f}]".rjust(15)
            )
        if "peak_memory_bytes" in r:
            row += f" {r['peak_memory_bytes'] / 2**20:>9.2f}"
        lines.append(row)
    return "\n".join(lines)

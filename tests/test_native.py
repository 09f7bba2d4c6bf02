"""The native CPU kernels (attention_atlas.native): each equals the library's PyTorch path, and
so its reference, in float64 (values and gradients), passes gradcheck, and takes the place of
that path only where switched on, at its level; a run records that it used them and at which
level; without a compiler the PyTorch paths run."""

from __future__ import annotations

import ctypes
import itertools
import json
import subprocess
from pathlib import Path

import pytest
import torch

from attention_atlas import native
from attention_atlas.attention.riemannian import geometry as G
from attention_atlas.attention.riemannian import pairwise as P
from attention_atlas.attention.riemannian import regularizers as R
from attention_atlas.cofactor.penalty import CausalHeadPenalty
from attention_atlas.native import functions as NF

DT = torch.float64


pytestmark = pytest.mark.usefixtures("one_thread")


def _factor(b: int, h: int, seq: int, d: int, r: int, g: torch.Generator) -> torch.Tensor:
    """``U (B, H, L, d, r)`` stored r-major, as MetricNet stores it."""
    return torch.randn(b, h, seq, r, d, dtype=DT, generator=g).transpose(-1, -2)


def _both_paths(fn, inputs):  # type: ignore[no-untyped-def]
    """``fn(*inputs)`` and the gradients of a fixed random projection of its outputs, with the
    native kernels off and on."""
    out = []
    for on in (False, True):
        xs = [t.detach().clone().requires_grad_(True) for t in inputs]
        with native.enabled(on):
            y = fn(*xs)
        ys = y if isinstance(y, tuple) else (y,)
        g = torch.Generator().manual_seed(7)
        loss = sum((t * torch.randn(t.shape, dtype=t.dtype, generator=g)).sum() for t in ys)
        out.append((ys, torch.autograd.grad(loss, xs)))
    return out


def _assert_same(out, rtol: float = 1e-11) -> None:  # type: ignore[no-untyped-def]
    (y0, g0), (y1, g1) = out
    for a, b in zip((*y0, *g0), (*y1, *g1)):
        torch.testing.assert_close(
            b.detach(), a.detach(), rtol=rtol, atol=rtol * (1 + float(a.detach().abs().max()))
        )


SHAPES = [(2, 3, 9, 5, 3), (1, 2, 40, 16, 4), (1, 1, 17, 16, 2), (2, 1, 33, 16, 8)]


def test_kernels_build_here() -> None:
    assert native.library() is not None, native.status()
    assert native.status().startswith("native kernels loaded")


@pytest.mark.parametrize(("shape", "causal"), list(itertools.product(SHAPES, [True, False])))
def test_pairwise_terms_equal_eq16_torch_path(shape: tuple[int, ...], causal: bool) -> None:
    b, h, seq, d, r = shape
    g = torch.Generator().manual_seed(0)
    U, q, k = _factor(*shape, g), torch.randn(b, h, seq, d, dtype=DT, generator=g), None
    k = torch.randn(b, h, seq, d, dtype=DT, generator=g)
    base = torch.randn(b * h, seq, seq, dtype=DT, generator=g)

    def terms(U, q, k):  # type: ignore[no-untyped-def]
        if causal:
            return P.pairwise_metric_terms(
                U, q, k, scale=-0.3, causal=True, base=base.clone(), softmax=True
            )
        return P.pairwise_metric_terms(U, q, k, scale=-0.3)

    _assert_same(_both_paths(terms, [U, q, k]))


def test_pairwise_terms_equal_the_materialised_definition() -> None:
    """Independent of the PyTorch path: every ``U_i^T (q_i - k_j)`` formed."""
    g = torch.Generator().manual_seed(1)
    n, seq, r, d = 3, 21, 4, 16
    ut = torch.randn(n, seq, r, d, dtype=DT, generator=g)
    x = torch.randn(n, 2 * seq, d, dtype=DT, generator=g)
    q, k = x[:, :seq], x[:, seq:]
    diff = q.unsqueeze(2) - k.unsqueeze(1)  # (n, i, j, d)
    pi = torch.einsum("nird,nijd->nijr", ut, diff)
    pj = torch.einsum("njrd,nijd->nijr", ut, diff)
    want = 0.7 * ((pi * pi).sum(-1) + (pj * pj).sum(-1))
    got = NF.PairwiseTerms.apply(ut, x, 0.7)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", SHAPES)
def test_metric_projection_equals_torch_path(shape: tuple[int, ...]) -> None:
    b, h, seq, d, r = shape
    g = torch.Generator().manual_seed(2)
    U = _factor(*shape, g)
    q, k = (torch.randn(b, h, seq, d, dtype=DT, generator=g) for _ in range(2))
    gamma = torch.tensor(0.4, dtype=DT)
    _assert_same(_both_paths(lambda U, q, k, s: G.metric_aware_projections(U, s, q, k),
                             [U, q, k, gamma]))  # fmt: skip
    # q and k as the model passes them: strided views of one projection (B, L, 2, H, d)
    qk = torch.stack([q, k]).permute(1, 3, 0, 2, 4).contiguous()

    def views(U: torch.Tensor, qk: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q, k = qk.permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, L, d), rows 2 H d apart
        return G.metric_aware_projections(U, s, q, k)

    _assert_same(_both_paths(views, [U, qk, gamma]))


@pytest.mark.parametrize("shape", SHAPES)
def test_woodbury_update_equals_torch_path(shape: tuple[int, ...]) -> None:
    b, h, seq, d, r = shape
    g = torch.Generator().manual_seed(3)
    U = _factor(*shape, g)
    x, m = (torch.randn(b, h, seq, d, dtype=DT, generator=g) for _ in range(2))
    _assert_same(_both_paths(G.metric_preconditioned_update, [x, U, m]))


@pytest.mark.parametrize(("shape", "pairs"), list(itertools.product(SHAPES, [1, 2])))
def test_skew_factors_apply_equals_torch_path(shape: tuple[int, ...], pairs: int) -> None:
    b, h, seq, d, r = shape
    g = torch.Generator().manual_seed(4)
    wt = torch.randn(b, seq, h, 2 * pairs, r, d, dtype=DT, generator=g)
    x = torch.randn(b, seq, h, d, dtype=DT, generator=g)
    w = torch.rand(pairs, dtype=DT, generator=g)
    _assert_same(_both_paths(G.skew_factors_apply, [wt, x, w]))
    # the pairs as separate tensors and x a transposed view, as the model passes them
    per_pair = list(wt.view(b, seq, h, pairs, 2, r, d).unbind(3))
    xt = x.transpose(1, 2).contiguous()  # (b, h, seq, d)

    def split(*a: torch.Tensor) -> torch.Tensor:
        return G.skew_factors_apply(list(a[:-2]), a[-2].transpose(1, 2), a[-1])

    _assert_same(_both_paths(split, [*per_pair, xt, w]))


@pytest.mark.parametrize("shape", SHAPES)
def test_gram_sums_equal_torch_path(shape: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(5)
    _assert_same(_both_paths(R.gram_sums, [_factor(*shape, g)]))


def _causal_head_penalty(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return CausalHeadPenalty.apply(q, k, 0.3, 0.5, 1e-8)


def _causal_head_penalty_native(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    with native.enabled(True):
        return _causal_head_penalty(q, k)


@pytest.mark.parametrize("shape", [(3, 7, 5), (2, 2, 3), (4, 64, 16), (2, 33, 16), (1, 17, 32)])
def test_causal_head_penalty_equals_torch_path(shape: tuple[int, int, int]) -> None:
    g = torch.Generator().manual_seed(8)
    q, k = (2 * torch.randn(shape, dtype=DT, generator=g) for _ in range(2))
    _assert_same(_both_paths(_causal_head_penalty, [q, k]))


def test_causal_head_penalty_with_a_vanished_row_sum_equals_torch_path() -> None:
    """Row 1 of head 0 puts all its weight on itself (``s_1`` underflows to 0, so ``m = 0``):
    the kernel's exclusive products must match the PyTorch path's fallback branch."""
    g = torch.Generator().manual_seed(10)
    q, k = (torch.randn(2, 9, 4, dtype=DT, generator=g) for _ in range(2))
    q[0, 1], k[0, 1], k[0, 0] = 60.0, 60.0, -60.0  # z_11 - z_10 = 0.3 * 2 * 4 * 3600
    s = torch.softmax(0.3 * q[0, 1] @ k[0, :2].T, -1)[0]
    assert float(s) == 0.0  # the case under test really happens
    _assert_same(_both_paths(_causal_head_penalty, [q, k]))


def test_causal_head_penalty_float32_kernel_matches_float64() -> None:
    """The float build (its own vectorised exp) against the float64 PyTorch path."""
    g = torch.Generator().manual_seed(9)
    q, k = (3 * torch.randn(4, 64, 16, dtype=DT, generator=g) for _ in range(2))
    w = torch.arange(1.0, 5.0, dtype=DT)
    results = []
    for dtype, on in ((DT, False), (torch.float32, True)):
        xs = [t.to(dtype).requires_grad_(True) for t in (q, k)]
        with native.enabled(on):
            loss = _causal_head_penalty(*xs)
        assert loss.dtype == DT  # the penalty is float64 whatever the logits' dtype
        results.append((loss.detach(), *torch.autograd.grad((loss * w).sum(), xs)))
    for want, got in zip(*results):
        scale = float(want.abs().max())
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * scale)


GRADCHECKS = {
    "causal_head_penalty": (_causal_head_penalty_native, [(3, 7, 5), (3, 7, 5)]),
    "pairwise": (lambda ut, x: NF.PairwiseTerms.apply(ut, x, 0.3), [(3, 6, 2, 5), (3, 12, 5)]),
    "causal_pairwise": (
        lambda base, ut, x: NF.CausalPairwiseTerms.apply(base.clone(), ut, x, 0.3, True),
        [(3, 6, 6), (3, 6, 2, 5), (3, 12, 5)],
    ),
    "projection": (
        lambda ut, s, a, b: NF.MetricProjection.apply(ut, s, a, b),
        [(7, 3, 5), (), (7, 5), (7, 5)],
    ),  # fmt: skip
    "projection_strided": (  # x a (B, H, L, d) view of (B, L, H, d): 2 x 3 x 2 tokens
        lambda ut, s, x: NF.MetricProjection.apply(ut, s, x.transpose(1, 2)),
        [(12, 3, 5), (), (2, 2, 3, 5)],
    ),
    "woodbury": (NF.WoodburyApply.apply, [(7, 3, 5), (7, 5)]),
    "skew": (  # one tensor of both pairs, x contiguous
        lambda wt, x, w: NF.SkewFactorsApply.apply(x, w, wt),
        [(7, 1, 1, 4, 2, 5), (7, 1, 1, 5), (2,)],
    ),
    "skew_pairs": (  # a tensor per pair, x a transposed view (B, H, Q, d) -> (B, Q, H, d)
        lambda a, b, xt, w: NF.SkewFactorsApply.apply(xt.transpose(1, 2), w, a, b),
        [(2, 3, 2, 2, 2, 5), (2, 3, 2, 2, 2, 5), (2, 2, 3, 5), (2,)],
    ),
    "gram": (NF.GramSums.apply, [(3, 6, 2, 5)]),
    "metric_strength": (NF.MetricStrength.apply, [(37, 10)]),
}


@pytest.mark.parametrize("name", sorted(GRADCHECKS))
def test_native_functions_pass_gradcheck(name: str) -> None:
    fn, shapes = GRADCHECKS[name]
    g = torch.Generator().manual_seed(6)
    args = [torch.randn(s, dtype=DT, generator=g).requires_grad_() for s in shapes]
    assert torch.autograd.gradcheck(fn, args)


# -- the skew kernels' two paths at head dimension 16: token by token, and tokens as lanes ------

#: 21 tokens (a block of 16 and a tail of 5) of (B, Q, H) = (1, 3, 7), two pairs of rank 2
_LANES = (1, 3, 7, 2, 2, 16)


@pytest.mark.parametrize("lanes", [1, 0])
@pytest.mark.parametrize("strided", [False, True])
def test_skew_lanes_pass_gradcheck(
    strided: bool, lanes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The skew kernels' lane path and token path (d = 16) pass gradcheck, x contiguous or a
    transposed view."""
    monkeypatch.setattr(NF, "TOKEN_LANES", lanes)
    b, q, h, pairs, r, d = _LANES
    g = torch.Generator().manual_seed(11)
    wt = torch.randn(b, q, h, 2 * pairs, r, d, dtype=DT, generator=g).requires_grad_()
    w = torch.rand(pairs, dtype=DT, generator=g).requires_grad_()
    shape = (b, h, q, d) if strided else (b, q, h, d)  # strided: (B, H, Q, d) read as (B, Q, H, d)
    x = torch.randn(shape, dtype=DT, generator=g).requires_grad_()

    def fn(wt, x, w):  # type: ignore[no-untyped-def]
        return NF.SkewFactorsApply.apply(x.transpose(1, 2) if strided else x, w, wt)

    assert torch.autograd.gradcheck(fn, [wt, x, w])


def _skew_kernels(wt, x, w, gy, lanes: int, call=native.call):  # type: ignore[no-untyped-def]
    """``(y, dwt, dx, dw)`` of the skew kernels called directly, on either path (``call``: as
    :func:`attention_atlas.native.call`, by default the build loaded here)."""
    *_, p2, r, d = wt.shape
    ptrs, fs = NF._pair_pointers([wt], p2 // 2)
    tokens = NF._tokens(x, x.numel() // d)
    y, dwt, dx = torch.empty(x.shape, dtype=x.dtype), torch.empty_like(wt), torch.empty_like(x)
    dw = torch.zeros(p2 // 2, dtype=torch.float64)
    call("skew_forward", ptrs.data_ptr(), x.data_ptr(), w, y, *tokens, p2 // 2, r, d, fs, lanes)
    dptrs, _ = NF._pair_pointers([dwt], p2 // 2)
    call("skew_backward", ptrs.data_ptr(), x.data_ptr(), gy, w, dptrs.data_ptr(), dx.data_ptr(),
         dw, *tokens, p2 // 2, r, d, fs, lanes)  # fmt: skip
    return y, dwt, dx, dw


@pytest.mark.parametrize("lanes", [1, 0])
def test_projection_lanes_pass_gradcheck(lanes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The metric-aware projection's lane path and token path (d = 16): queries a (B, H, L, d)
    view of a (B, L, H, d) tensor (21 tokens: a block and a tail), keys contiguous."""
    monkeypatch.setattr(NF, "TOKEN_LANES", lanes)
    g = torch.Generator().manual_seed(13)
    args = [torch.randn(s, dtype=DT, generator=g).requires_grad_()
            for s in [(21, 3, 16), (), (1, 7, 3, 16), (21, 16)]]  # fmt: skip

    def fn(ut, s, x, k):  # type: ignore[no-untyped-def]
        return NF.MetricProjection.apply(ut, s, x.transpose(1, 2), k)

    assert torch.autograd.gradcheck(fn, args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("shape", "r"), [((1, 3, 7), 3), ((8, 4, 64), 4), ((2, 2, 5), 2)])
def test_projection_lanes_equal_the_token_path(
    dtype: torch.dtype, shape: tuple[int, int, int], r: int
) -> None:
    """The lane path against the token-by-token path, forward and backward (the factor's
    gradient accumulated over two calls, as the backward of a query and a key does), bit for
    bit in float and double: both sum over the head dimension in the order of ``tree16``."""
    b, h, seq = shape
    n = b * h * seq
    g = torch.Generator().manual_seed(14)
    ut = torch.randn(n, r, 16, dtype=dtype, generator=g)
    x = torch.randn(b, seq, h, 16, dtype=dtype, generator=g).transpose(1, 2)  # a view
    gy = [torch.randn(n, 16, dtype=dtype, generator=g) for _ in range(2)]
    outs = []
    for lanes in (0, 1):
        y, dx = torch.empty(n, 16, dtype=dtype), torch.empty(n, 16, dtype=dtype)
        dut = torch.zeros_like(ut)
        native.call("projection_forward", ut, x.data_ptr(), y, *NF._tokens(x, n), r, 16, 0.3, lanes)
        ds = [native.call("projection_backward", ut, x.data_ptr(), gk, dx, dut, *NF._tokens(x, n),
                          r, 16, 0.3, lanes) for gk in gy]  # fmt: skip
        outs.append((y, dx, dut, torch.tensor(ds, dtype=torch.float64)))
    for a, c in zip(*outs):
        assert torch.equal(a, c)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [_LANES, (8, 64, 4, 2, 2, 16), (2, 5, 3, 1, 4, 16)])
def test_skew_lanes_equal_the_token_path(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    """The lane path against the token-by-token path, bit for bit in float and double (training
    runs keep their bits whichever path runs); x a view."""
    b, q, h, pairs, r, d = shape
    g = torch.Generator().manual_seed(12)
    wt = torch.randn(b, q, h, 2 * pairs, r, d, dtype=dtype, generator=g)
    x = torch.randn(b, h, q, d, dtype=dtype, generator=g).transpose(1, 2)
    w = torch.rand(pairs, dtype=dtype, generator=g) + 0.5
    gy = torch.randn(b, q, h, d, dtype=dtype, generator=g)
    token, lanes = (_skew_kernels(wt, x, w, gy, on) for on in (0, 1))
    for a, c in zip(token, lanes):
        assert torch.equal(a, c)


def _fbt(seed: int = 0) -> torch.nn.Module:
    from attention_atlas.models import FiberBundleConfig, fbt_attentions

    torch.manual_seed(seed)
    cfg = FiberBundleConfig(vocab_size=11, dim=32, n_layers=2, n_heads=2, max_len=20)
    model = cfg.build().to(DT)
    gen = torch.Generator().manual_seed(1)
    for m in fbt_attentions(model):  # factors clearly non-zero (init makes them ~0)
        for net in (m.metric_net, m.transport, m.torsion):
            with torch.no_grad():
                net.fc2.weight.copy_(0.3 * torch.randn(net.fc2.weight.shape, generator=gen))
    return model


def test_fiber_bundle_step_is_the_same_with_native_kernels() -> None:
    """A whole Fiber Bundle Transformer forward, its three regularisers and backward, float64:
    loss and every parameter's gradient agree with and without the native kernels."""
    from attention_atlas.models.fiber_bundle import fiber_bundle_regularizer

    x = torch.randint(0, 11, (3, 20), generator=torch.Generator().manual_seed(2))
    results = []
    for on in (False, True):
        model = _fbt()
        with native.enabled(on):
            out = model(x)
            reg = fiber_bundle_regularizer(model, out, None, anti=1.0, div=2.0, smooth=0.5,
                                           cap=3.0, kappa_min=0.5, kappa_max=2.0)  # fmt: skip
            loss = out.logits.square().mean() + reg
            loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (l0, g0), (l1, g1) = results
    torch.testing.assert_close(l1, l0, rtol=1e-12, atol=0)
    assert g0.keys() == g1.keys()
    for name in g0:
        if g0[name] is None:
            assert g1[name] is None, name
            continue
        torch.testing.assert_close(g1[name], g0[name], rtol=1e-10, atol=1e-12, msg=name)


def test_kernels_run_only_where_switched_on_and_applicable(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    calls: list[str] = []
    real = native.call
    monkeypatch.setattr(native, "call", lambda name, *a: calls.append(name) or real(name, *a))
    monkeypatch.setattr(NF, "call", native.call)
    g = torch.Generator().manual_seed(0)
    U, x = _factor(1, 2, 5, 4, 2, g), torch.randn(1, 2, 5, 4, dtype=DT, generator=g)
    G.metric_preconditioned_update(x, U, x)
    assert calls == []  # off by default
    with native.enabled():
        G.metric_preconditioned_update(x, U, x)
        assert calls == ["woodbury_forward"]
        assert not native.applies(x.half(), U.half())  # float16: the PyTorch path
        assert not native.applies(x, U.float())  # mixed dtypes
        assert native.active(x, U)
    assert not native.is_enabled()


def test_without_a_compiler_the_pytorch_paths_run(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setattr(native, "_error", None)
    monkeypatch.setattr(native, "_compiler", lambda: None)
    assert native.library() is None
    assert native.status() == "native kernels unavailable: no C compiler found ($CC, cc or gcc)"
    g = torch.Generator().manual_seed(0)
    U, x = _factor(1, 2, 5, 4, 2, g), torch.randn(1, 2, 5, 4, dtype=DT, generator=g)
    with native.enabled():
        assert not native.active(x)
        got = G.metric_preconditioned_update(x, U, x)
    torch.testing.assert_close(got, G.metric_preconditioned_update(x, U, x), rtol=0, atol=0)


def test_a_failed_build_says_why(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "kernels.c"
    bad.write_text("this is not C\n")
    monkeypatch.setenv("ATTENTION_ATLAS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "SOURCE", bad)
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setattr(native, "_error", None)
    assert native.library() is None
    assert native.status().startswith("native kernels unavailable: building the native kernels")
    assert not list((tmp_path / "cache" / "native").glob("*.so"))  # nothing half-written kept


def test_a_fresh_build_goes_to_the_cache_folder(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ATTENTION_ATLAS_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setattr(native, "_error", None)
    assert native.library() is not None, native.status()
    built = list((tmp_path / "native").glob("kernels-*.so"))
    assert len(built) == 1 and not list((tmp_path / "native").glob(".*partial"))


def test_a_training_run_records_the_native_kernels(tmp_path: Path) -> None:
    from train_helpers import tiny_cfg

    from attention_atlas.data import copy_task
    from attention_atlas.models import FiberBundleConfig
    from attention_atlas.train import train

    data = copy_task(64, 16, length=6, vocab=5)
    cfg = tiny_cfg(steps=3, log_every=3, native=True, out_dir=str(tmp_path))
    res = train(FiberBundleConfig(dim=16, n_layers=1, n_heads=2), cfg, data)
    assert res.record["train_config"]["native"] is True
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["train_config"]["native"] is True
    assert record["train_config"]["native_level"] == native.LEVEL
    assert not native.is_enabled()  # the switch was the run's only
    with native.enabled(1):  # an enclosing level (a record's, re-run) wins over the config's
        res = train(FiberBundleConfig(dim=16, n_layers=1, n_heads=2), cfg, data)
    assert res.record["train_config"]["native_level"] == 1


def test_a_sweep_cell_records_the_native_kernels() -> None:
    from attention_atlas.sweep.backends import execute_cell

    def cell(params, seed):  # type: ignore[no-untyped-def]
        return {"on": native.is_enabled()}

    out = execute_cell(cell, {}, 0, 1, native=True)
    assert out["metrics"] == {"on": True}
    assert out["environment"]["native"] is True
    assert out["environment"]["native_status"] == native.status()
    assert out["environment"]["native_status"].startswith("native kernels loaded")
    assert "native" not in execute_cell(cell, {}, 0, 1)["environment"]


# -- level 2: the Fiber Bundle regularisers in one kernel -----------------------------------------

WEIGHT_SETS = [
    {"anti": 1.0, "div": 11.3, "smooth": 1.13, "cap": 10.0, "l2": 0.0},  # chapter 4's "three"
    {"anti": 0.5, "div": 0.0, "smooth": 0.0, "cap": 2.0, "l2": 1.0},  # no Gram sums
    {"anti": 0.0, "div": 1.0, "smooth": 0.0, "cap": 0.0, "l2": 0.0},
    {"anti": 0.0, "div": 0.0, "smooth": 2.0, "cap": 0.0, "l2": 0.0},
]


def _terms_reference(Us: list[torch.Tensor], w: dict[str, float], kmin: float,
                     kmax: float) -> torch.Tensor:  # fmt: skip
    """The scheduled sum, mean over layers, from the explicit definitions of eqs. (31) to (34):
    ``A_t = U_t U_t^T`` materialised, every pair of positions."""
    total = torch.zeros((), dtype=DT)
    for U in Us:
        A = U @ U.transpose(-1, -2)  # (B, H, L, d, d)
        kappa = U.square().sum((-1, -2))
        seq = U.shape[-3]
        D = (A.unsqueeze(-3) - A.unsqueeze(-4)).square().sum((-1, -2))  # (B, H, L, L)
        terms = {
            "anti": torch.relu(kmin - kappa).mean(),
            "div": -(D.sum((-1, -2)) / (seq * (seq - 1))).mean(),
            "smooth": (A[..., 1:, :, :] - A[..., :-1, :, :]).square().sum((-1, -2)).mean(),
            "cap": torch.relu(kappa - kmax).mean(),
            "l2": kappa.mean(),
        }
        total = total + sum(w[k] * v for k, v in terms.items())
    return total / len(Us)


@pytest.mark.parametrize("shape", [*SHAPES, (1, 1, 2, 16, 4), (2, 2, 16, 6, 3)])
@pytest.mark.parametrize("w", WEIGHT_SETS)
def test_fiber_bundle_terms_equal_the_definitions(
    shape: tuple[int, ...], w: dict[str, float]
) -> None:
    g = torch.Generator().manual_seed(11)
    Us = [(0.4 * _factor(*shape, g)).requires_grad_() for _ in range(2)]
    kappa = Us[0].detach().square().sum((-1, -2))
    kmin, kmax = float(kappa.quantile(0.4)), float(kappa.quantile(0.6))  # both ReLUs act
    want = _terms_reference(Us, w, kmin, kmax)
    want_g = torch.autograd.grad(want, Us)
    b, h, seq, d, r = shape
    uts = [U.transpose(-1, -2).reshape(-1, seq, r, d) for U in Us]
    got = NF.FiberBundleTerms.apply(([w[k] for k in R.TERMS], kmin, kmax), *uts)
    got_g = torch.autograd.grad(got * 2.5, Us)  # an upstream gradient other than 1
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for a, e in zip(got_g, want_g):
        torch.testing.assert_close(a, 2.5 * e, rtol=1e-10, atol=1e-12)


def test_fiber_bundle_terms_float32_kernel_matches_float64() -> None:
    g = torch.Generator().manual_seed(12)
    U = 0.2 * _factor(4, 4, 64, 16, 4, g)
    w = [1.0, 11.3, 1.13, 10.0, 0.5]
    out = []
    for dtype in (DT, torch.float32):
        ut = U.to(dtype).transpose(-1, -2).reshape(-1, 64, 4, 16).requires_grad_()
        loss = NF.FiberBundleTerms.apply((w, 0.3, 0.6), ut)
        out.append((loss.detach(), torch.autograd.grad(loss, ut)[0]))
    (l64, g64), (l32, g32) = out
    assert l32.dtype == torch.float32
    torch.testing.assert_close(l32.double(), l64, rtol=1e-5, atol=1e-6 * float(l64.abs()))
    torch.testing.assert_close(g32.double(), g64, rtol=1e-4, atol=1e-5 * float(g64.abs().max()))


@pytest.mark.parametrize("w", WEIGHT_SETS[:2])
def test_fiber_bundle_terms_pass_gradcheck(w: dict[str, float]) -> None:
    g = torch.Generator().manual_seed(13)
    uts = [torch.randn(3, 6, 2, 5, dtype=DT, generator=g).requires_grad_() for _ in range(2)]

    def fn(*a: torch.Tensor) -> torch.Tensor:
        return NF.FiberBundleTerms.apply(([w[k] for k in R.TERMS], 3.0, 6.0), *a)

    assert torch.autograd.gradcheck(fn, uts)


def test_fiber_bundle_terms_refuse_layers_that_differ() -> None:
    a, b = torch.zeros(2, 4, 2, 5, dtype=DT), torch.zeros(2, 5, 2, 5, dtype=DT)
    with pytest.raises(ValueError, match="contiguous CPU"):
        NF.FiberBundleTerms.apply(([1.0] * 5, 0.0, 1.0), a, b)
    with pytest.raises(ValueError, match="ranks up to 16, got r=17"):
        NF.FiberBundleTerms.apply(([1.0] * 5, 0.0, 1.0), torch.zeros(2, 4, 17, 5, dtype=DT))
    with pytest.raises(ValueError, match="5 weights"):
        NF.FiberBundleTerms.apply(([1.0] * 4, 0.0, 1.0), a)


def test_levels_choose_the_kernels(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Level 1 keeps the regularisers on the PyTorch path (with the Gram kernel), the level a
    record made before levels re-runs at; ``True`` is :data:`native.LEVEL`, which adds the one
    kernel; the two agree in float64."""
    from attention_atlas.models.fiber_bundle import fiber_bundle_regularizer

    calls: list[str] = []
    real = NF.FiberBundleTerms.apply
    monkeypatch.setattr(NF.FiberBundleTerms, "apply", lambda *a: calls.append("fbt") or real(*a))
    x = torch.randint(0, 11, (3, 20), generator=torch.Generator().manual_seed(2))
    model = _fbt()
    opts = {"anti": 1.0, "div": 2.0, "smooth": 0.5, "cap": 3.0, "kappa_min": 0.5, "kappa_max": 2.0}
    values = []
    for on, want in ((1, 1), (True, native.LEVEL)):
        with native.enabled(on):
            assert native.level() == want
            values.append(fiber_bundle_regularizer(model, model(x), None, **opts))
    assert calls == ["fbt"]  # level 2 only
    torch.testing.assert_close(values[1], values[0], rtol=1e-12, atol=0)
    assert native.level() == 0 and native.resolve_level(False) == 0
    with pytest.raises(ValueError, match="native level must be a bool or an int from 0 to"):
        native.resolve_level(native.LEVEL + 1)


def test_records_carry_the_level_and_verify_reads_it() -> None:
    from attention_atlas.sweep.backends import execute_cell
    from attention_atlas.sweep.verify import native_level

    def cell(params, seed):  # type: ignore[no-untyped-def]
        return {"level": native.level()}

    out = execute_cell(cell, {}, 0, 1, native=1)
    assert out["metrics"] == {"level": 1} and out["environment"]["native_level"] == 1
    assert execute_cell(cell, {}, 0, 1, native=True)["environment"]["native_level"] == native.LEVEL
    assert native_level({"native": True}) == 1  # made before levels
    assert native_level({"native": True, "native_level": 2}) == 2
    assert native_level({}) == 0


@pytest.mark.parametrize("shape", SHAPES)
def test_metric_strength_at_level_2_equals_the_definition(shape: tuple[int, ...]) -> None:
    """kappa_t = |U_t|_F^2 in one pass (level 2) against the sum of squares of the entries."""
    g = torch.Generator().manual_seed(14)
    U = _factor(*shape, g).requires_grad_()
    want = torch.stack([(u * u).sum() for u in U.reshape(-1, *shape[-2:])]).view(shape[:-2])
    with native.enabled(2):
        got = G.metric_strength(U)
    torch.testing.assert_close(got, want, rtol=1e-13, atol=0)
    w = torch.randn(got.shape, dtype=DT, generator=g)
    (dg,) = torch.autograd.grad((got * w).sum(), U)
    torch.testing.assert_close(dg, 2 * w[..., None, None] * U.detach(), rtol=1e-14, atol=0)
    with native.enabled(1):  # level 1: the PyTorch path, no kernel
        assert G.metric_strength(U).grad_fn.name() == "SumBackward1"


@pytest.mark.parametrize(
    "shape", [(2, 3, 9, 16, 3), (1, 2, 40, 16, 4), (2, 1, 33, 16, 8), (1, 1, 2, 16, 2)]
)
@pytest.mark.parametrize("softmax", [True, False])
def test_causal_scores_with_their_base_equal_level_1(shape: tuple[int, ...], softmax: bool) -> None:
    """Level 2's CausalScores (the base c1 q.k + row + col formed in the pairwise kernel) against
    level 1's product of the base and pairwise terms, float64, with curvature and blending."""
    from attention_atlas.attention.riemannian.scores import geodesic_scores_decomposed

    g = torch.Generator().manual_seed(15)
    b, h, seq, d, r = shape
    U = 0.5 * _factor(*shape, g)
    q, k = (torch.randn(b, h, seq, d, dtype=DT, generator=g) for _ in range(2))
    om = torch.rand(b, h, seq, dtype=DT, generator=g)
    w = torch.randn(b, h, seq, seq, dtype=DT, generator=g).tril()
    results = []
    for level in (1, 2):
        xs = [t.clone().requires_grad_() for t in (U, q, k, om)]
        with native.enabled(level):
            y = geodesic_scores_decomposed(xs[1], xs[2], xs[0], 5.66, curvature=xs[3], alpha=0.7,
                                           baseline="distance", causal=True, softmax=softmax)  # fmt: skip
        fused = "CausalScores" in y.grad_fn.next_functions[0][0].name()
        assert fused == (level == 2)
        finite = torch.where(torch.isinf(y), 0.0, y)
        results.append((finite.detach(), *torch.autograd.grad((finite * w).sum(), xs)))
    for want, got in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_causal_scores_pass_gradcheck_and_take_head_dimension_16_only() -> None:
    g = torch.Generator().manual_seed(16)
    args = [torch.randn(s, dtype=DT, generator=g).requires_grad_()
            for s in [(2, 5, 2, 16), (2, 10, 16), (2, 5), (2, 5)]]  # fmt: skip

    def fn(ut: torch.Tensor, x: torch.Tensor, row: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
        return NF.CausalScores.apply(ut, x, row, col, 0.8, -0.3, True)

    assert torch.autograd.gradcheck(fn, args)
    with pytest.raises(ValueError, match="head dimension 16 and ranks up to 16, got d=5, r=2"):
        NF.CausalScores.apply(torch.zeros(2, 5, 2, 5, dtype=DT), torch.zeros(2, 10, 5, dtype=DT),
                              args[2], args[3], 0.8, -0.3, True)  # fmt: skip


def test_causal_scores_softmax_in_float_is_the_double_builds_to_float_precision() -> None:
    """The pairwise kernel's row softmax (``softmax_row``: its own exponential in float, a few
    ulp) against the double build's (libm's exponential), which the test above holds to level 1's
    ``torch.softmax`` at 1e-12: rows that sum to 1, zeros above the diagonal."""
    g = torch.Generator().manual_seed(18)
    args = [torch.randn(3, 37, 4, 16, dtype=DT, generator=g) / 2,
            torch.randn(3, 74, 16, dtype=DT, generator=g), *torch.randn(2, 3, 37, dtype=DT, generator=g)]  # fmt: skip
    want = NF.CausalScores.apply(*args, 0.7, -0.05, True)
    got = NF.CausalScores.apply(*(t.float() for t in args), 0.7, -0.05, True)
    assert float(want.amax(-1).min()) < 0.9  # rows that spread their weight
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.sum(-1), torch.ones(3, 37), rtol=0, atol=1e-6)
    assert float(got.triu(1).abs().max()) == 0.0
    # scores spread over hundreds (c1 = 40): exp(s - max) overflows unless max is each row's
    # largest entry, wherever in the row it lies
    want, got = (NF.CausalScores.apply(*(t.to(dt) for t in args), 40.0, -0.05, True)
                 for dt in (DT, torch.float32))  # fmt: skip
    assert float(want.amax(-1).min()) < 0.99 and bool(got.isfinite().all())
    torch.testing.assert_close(got.double(), want, rtol=1e-3, atol=1e-4)


def test_factor_rows_are_u_transposed_token_by_token_and_a_view_of_r_major_storage() -> None:
    g = torch.Generator().manual_seed(17)
    U = _factor(2, 3, 5, 4, 2, g)  # stored r-major
    rows = G.factor_rows(U)
    assert rows.shape == (30, 2, 4) and rows.data_ptr() == U.data_ptr() and rows.is_contiguous()
    torch.testing.assert_close(rows[7], U.reshape(-1, 4, 2)[7].T, rtol=0, atol=0)
    seqs = G.factor_rows(U, per_sequence=True)
    assert seqs.shape == (6, 5, 2, 4)
    torch.testing.assert_close(seqs[4, 3], U[1, 1, 3].T, rtol=0, atol=0)
    dense = U.contiguous()  # d-major: a copy with the same entries
    torch.testing.assert_close(G.factor_rows(dense), rows, rtol=0, atol=0)


def test_fused_causal_heads_take_fused_multiply_adds_at_level_3() -> None:
    """The regulariser's fused kernel (:class:`CausalHeadsPenalty` through ``heads_penalty``, on
    strided head views of a projection): level 3 (fused multiply-adds, and its own float exp)
    agrees with level 1 in float64 to 1e-12 and, in float32, with the float64 result to float32
    round-off; levels 1 and 2 run the same kernel, bit for bit, and level 3 another one."""
    from attention_atlas.cofactor.native_heads import heads_penalty

    g = torch.Generator().manual_seed(12)
    qkv = 2 * torch.randn(2, 3, 40, 3, 4, 16, dtype=DT, generator=g)  # (layers, B, n, 3, H, d)

    def run(dtype: torch.dtype, level: int) -> list[torch.Tensor]:
        p = qkv.to(dtype).requires_grad_(True)
        views = p.permute(3, 0, 1, 4, 2, 5)  # (3, layers, B, H, n, d), rows 3 H d apart
        with native.enabled(level):
            loss = heads_penalty(list(views[0]), list(views[1]), [1, 2], 2, 0.3, 0.2, 1e-8)
        return [loss.detach(), *torch.autograd.grad(loss, p)]

    want = run(DT, 1)
    for a, b in zip(run(DT, 3), want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12 * float(b.abs().max()))
    level1, level2, level3 = (run(torch.float32, lv) for lv in (1, 2, 3))
    assert all(torch.equal(a, b) for a, b in zip(level1, level2))
    assert not torch.equal(level3[1], level1[1])
    for a, b in zip(level3, want):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))


def _vector_outputs(lib, dtype: torch.dtype):  # type: ignore[no-untyped-def]
    """Every output of the kernels of ``lib`` (a ctypes library of ``kernels.c``) whose d = 16
    bodies work on VW-lane vector values, at head dimension 16: the pairwise kernels causal at
    level 2 (the base formed inside), at level 1 and over every pair, forward and backward; the
    Woodbury kernels and the Fiber Bundle terms (tokens staged by 16 x 16 transposes); the
    projection and skew kernels with tokens as lanes; ranks 4 (an unrolled body) and 3; L = 37
    (blocks of 16 cut short, tiles of 32 and a tail)."""
    native._declare(lib)

    def fn(name: str):  # type: ignore[no-untyped-def]
        return getattr(lib, f"{name}_{'f64' if dtype == torch.float64 else 'f32'}")

    def ptr(t: torch.Tensor | None) -> int | None:
        return None if t is None else t.data_ptr()

    def call(name: str, *args):  # type: ignore[no-untyped-def]  # as native.call, on lib
        return fn(name)(*(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args))

    outs = []
    for r in (4, 3):
        g = torch.Generator().manual_seed(r)
        n, seq = 3, 37
        ut = torch.randn(n, seq, r, 16, dtype=dtype, generator=g) / 2
        x = torch.randn(n, 2 * seq, 16, dtype=dtype, generator=g)
        row, col = torch.randn(2, n, seq, dtype=dtype, generator=g)
        grad = torch.randn(n, seq, seq, dtype=dtype, generator=g)
        for causal, base in ((1, True), (1, False), (0, False), (2, True)):  # 2: softmax
            out = torch.zeros(n, seq, seq, dtype=dtype)
            dut, dx = torch.empty_like(ut), torch.empty_like(x)
            c1 = 0.7 if base else 0.0
            rc = (ptr(row), ptr(col)) if base else (None, None)
            fn("pairwise_forward")(ptr(ut), ptr(x), ptr(out), n, seq, r, 16, 0.3, causal, *rc, c1)
            sg, sums = (1, torch.empty(2, n, seq, dtype=dtype)) if causal == 2 else (0, None)
            fn("pairwise_backward")(ptr(ut), ptr(x), ptr(grad), ptr(dut), ptr(dx), n, seq, r, 16,
                                    0.3, causal, c1, sg, ptr(out) if sg else None, None,
                                    *((ptr(sums[0]), ptr(sums[1])) if sg else (None, None)))  # fmt: skip
            outs += [out, dut, dx, *([] if sums is None else [sums])]  # 2: through the softmax
        tokens = n * seq
        y, dxw = torch.empty(2, tokens, 16, dtype=dtype)
        dutw = torch.empty_like(ut)
        dy = torch.randn(tokens, 16, dtype=dtype, generator=g)
        xw = x[:, :seq].contiguous()  # held: the kernel reads it after ptr() returns
        fn("woodbury_forward")(ptr(ut), ptr(xw), ptr(y), tokens, r, 16)
        fn("woodbury_backward")(ptr(ut), ptr(y), ptr(dy), ptr(dxw), ptr(dutw), tokens, r, 16)
        terms, dut = torch.empty(5, dtype=torch.float64), torch.empty_like(ut)
        w = torch.tensor([1.0, 0.5, 0.25, 1.0, 0.1], dtype=torch.float64)
        fn("fbt_terms")(ptr(ut), ptr(dut), ptr(terms), n, seq, r, 16, ptr(w), 0.1, 2.0, 0.5, 1)
        outs += [y, dxw, dutw, terms, dut]
        # the per-token kernels, tokens as lanes (VW per pass)
        ut3 = ut.reshape(tokens, r, 16)
        yp, dxp = torch.empty(2, tokens, 16, dtype=dtype)
        dutp = torch.zeros_like(ut3)
        tok = (tokens, 1, 1, 16, 0, 0)
        fn("projection_forward")(ptr(ut3), ptr(xw), ptr(yp), *tok, r, 16, 0.3, 1)
        ds = fn("projection_backward")(ptr(ut3), ptr(xw), ptr(dy), ptr(dxp), ptr(dutp), *tok, r,
                                       16, 0.3, 1)  # fmt: skip
        wt = torch.randn(1, tokens, 1, 4, r, 16, dtype=dtype, generator=g)
        ws = torch.rand(2, dtype=dtype, generator=g) + 0.5
        xq, gq = xw.reshape(1, tokens, 1, 16), dy.reshape(1, tokens, 1, 16)
        outs += [yp, dxp, dutp, torch.tensor([ds]), *_skew_kernels(wt, xq, ws, gq, 1, call)]
    return outs


def test_the_vector_kernels_give_the_same_bits_in_halves(tmp_path: Path) -> None:
    """The kernels' d = 16 bodies hold 16 lanes per vector value where the processor has
    registers for them (x86 with AVX-512) and 8 elsewhere, each block of 16 then taken as two
    halves (8 tokens per pass, a 16 x 16 transpose as four of 8 x 8): both widths give the same bits (built
    here with ``-DVW=8`` and ``-DVW=16`` without optimisation: gcc neither fuses nor reorders
    float operations at any level), and so does the build that runs here (-O3,
    ``native.vector_lanes()`` lanes); float and double."""
    cc = native._compiler()
    assert cc is not None, native.status()
    libs = []
    for vw in (8, 16):
        so = tmp_path / f"kernels-{vw}.so"
        subprocess.run([cc, "-O0", "-fPIC", "-shared", "-std=c99", f"-DVW={vw}",
                        str(native.SOURCE), "-o", str(so), "-lm"], check=True)  # fmt: skip
        libs.append(ctypes.CDLL(str(so)))
    assert [lib.vector_lanes() for lib in libs] == [8, 16]
    here = native.library()
    assert here is not None, native.status()
    assert native.vector_lanes() in (8, 16)
    for dtype in (torch.float32, torch.float64):
        want = _vector_outputs(here, dtype)
        assert torch.isneginf(want[0][0, 0, 1])  # causal: -inf above the diagonal
        assert not any(bool(t.isnan().any() or t.isposinf().any()) for t in want)
        for lib in libs:
            got = _vector_outputs(lib, dtype)
            for a, b in zip(want, got):
                assert torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))

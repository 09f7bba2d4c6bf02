"""Matroidal and dense Mahalanobis distance attention (attention/matroidal.py and
attention/mahalanobis.py, chapter 5)."""

from __future__ import annotations

import pytest
import torch

from attention_atlas.attention import build_attention
from attention_atlas.attention.dot import masked_softmax
from attention_atlas.attention.graphs import GRAPH_FAMILIES, covector_matrix, graph_family_admits
from attention_atlas.attention.mahalanobis import (
    MahalanobisAttention,
    mahalanobis_attention,
    mahalanobis_logits,
    metric_factor,
)
from attention_atlas.attention.matroidal import (
    MatroidalAttention,
    matroidal_attention,
    matroidal_coefficients,
    matroidal_factor,
    matroidal_logits,
    matroidal_metric,
    prune_columns,
)

D64 = torch.float64
D = 9  # head dimension of the sweeps: 4d = 36 = d(d-1)/2, so every family reaches m = 4d


CASES = [(f, m) for f in GRAPH_FAMILIES for m in (D, 2 * D, 4 * D) if graph_family_admits(f, D, m)]


def reference_attention(z, v, A, theta, eps, tau, causal=False):
    logits = matroidal_logits(z, A, theta, eps, tau)
    n = z.shape[-2]
    keep = torch.ones(n, n, dtype=torch.bool).tril() if causal else None
    return masked_softmax(logits, keep) @ v


def test_the_stable_api_names_of_attention_metric_are_the_matroidal_functions():
    from attention_atlas.attention import metric

    assert metric.matroidal_logits is matroidal_logits
    assert metric.matroidal_attention is matroidal_attention
    assert set(metric.__all__) == {"matroidal_logits", "matroidal_attention"}


# -- the paper's side: nonnegative coefficients, rank-one PSD decomposition -----------------


def test_coefficients_are_nonnegative_and_metric_positive_definite():
    theta = torch.tensor([-1e4, -30.0, -1.0, 0.0, 3.0, 1e4], dtype=D64)
    assert (matroidal_coefficients(theta) >= 0).all()
    A = covector_matrix("ring", 6, 6, dtype=D64)
    eps = 1e-4
    evals = torch.linalg.eigvalsh(matroidal_metric(A, theta, eps))
    assert evals.min() >= eps - 1e-10  # M - eps I = A diag(l) A^T is PSD


@pytest.mark.parametrize("family,m", CASES)
def test_quadratic_form_is_the_sum_of_rank_one_terms(family, m):
    g = torch.Generator().manual_seed(0)
    A = covector_matrix(family, D, m, seed=2, dtype=D64)
    theta = torch.randn(m, generator=g, dtype=D64)
    eps = 1e-3
    x = torch.randn(50, D, generator=g, dtype=D64)
    M = matroidal_metric(A, theta, eps)
    lhs = torch.einsum("nd,de,ne->n", x, M, x)
    l = matroidal_coefficients(theta)
    rhs = ((x @ A) ** 2 * l).sum(-1) + eps * (x * x).sum(-1)  # sum_e l_e (a_e.x)^2 + eps |x|^2
    torch.testing.assert_close(lhs, rhs, rtol=1e-12, atol=1e-12)
    for method in ("qr", "cholesky"):
        R = matroidal_factor(A, theta, eps, method=method)
        torch.testing.assert_close(R.T @ R, M, rtol=1e-12, atol=1e-12)
        assert torch.equal(R, R.triu())


def test_metric_factor_of_dense_columns():
    g = torch.Generator().manual_seed(1)
    W = torch.randn(3, 5, 4, generator=g, dtype=D64)
    R = metric_factor(W, 1e-4)
    M = W @ W.transpose(-1, -2) + 1e-4 * torch.eye(5, dtype=D64)
    torch.testing.assert_close(R.transpose(-1, -2) @ R, M, rtol=1e-12, atol=1e-12)


# -- fast path == the seed's pseudocode -----------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("family,m", CASES)
def test_fast_path_equals_pseudocode(family, m, causal):
    g = torch.Generator().manual_seed(m)
    A = covector_matrix(family, D, m, seed=5, dtype=D64)
    theta = torch.randn(m, generator=g, dtype=D64)
    z = torch.randn(3, 11, D, generator=g, dtype=D64)
    v = torch.randn(3, 11, D, generator=g, dtype=D64)
    for eps, tau in ((1e-4, 1.0), (0.3, 0.25)):
        ref = reference_attention(z, v, A, theta, eps, tau, causal)
        out = matroidal_attention(z, v, A, theta, eps, tau, causal=causal)
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)


def test_fast_path_accepts_extra_leading_dims_and_other_value_widths():
    g = torch.Generator().manual_seed(0)
    A = covector_matrix("knn", 8, 16, dtype=D64)
    theta = torch.randn(16, generator=g, dtype=D64)
    z = torch.randn(2, 3, 7, 8, generator=g, dtype=D64)
    v = torch.randn(2, 3, 7, 5, generator=g, dtype=D64)  # d_v != d: the padded route
    ref = reference_attention(z, v, A, theta, 1e-4, 0.5)
    torch.testing.assert_close(
        matroidal_attention(z, v, A, theta, 1e-4, 0.5), ref, rtol=0, atol=1e-10
    )


@pytest.mark.parametrize("method", ["qr", "cholesky"])
def test_gradients_to_theta_z_v_pass_gradcheck_and_match_the_reference(method):
    g = torch.Generator().manual_seed(0)
    d, m = 5, 10
    A = covector_matrix("ring_chords", d, m, seed=0, dtype=D64)
    theta = torch.randn(m, generator=g, dtype=D64, requires_grad=True)
    z = torch.randn(1, 5, d, generator=g, dtype=D64, requires_grad=True)
    v = torch.randn(1, 5, d, generator=g, dtype=D64, requires_grad=True)
    for causal in (False, True):

        def fast(z, v, th, causal=causal):
            return matroidal_attention(z, v, A, th, 1e-2, 0.7, causal, method=method)

        assert torch.autograd.gradcheck(fast, (z, v, theta))
        ref = lambda z, v, th, c=causal: reference_attention(z, v, A, th, 1e-2, 0.7, c)
        w = torch.randn(1, 5, d, generator=g, dtype=D64)
        g_fast = torch.autograd.grad((fast(z, v, theta) * w).sum(), (z, v, theta))
        g_ref = torch.autograd.grad((ref(z, v, theta) * w).sum(), (z, v, theta))
        for a, b in zip(g_fast, g_ref):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_gradient_to_theta_at_tiny_eps_and_tiny_weights_is_finite_in_float32():
    d, m = 16, 64
    A = covector_matrix("ring_chords", d, m)
    theta = torch.full((m,), -20.0, requires_grad=True)  # l_e ~ 2e-9
    z = torch.randn(2, 32, d, requires_grad=True)
    out = matroidal_attention(z, z.detach(), A, theta, 1e-4, 1.0)
    out.square().sum().backward()
    assert theta.grad is not None and torch.isfinite(theta.grad).all()
    assert z.grad is not None and torch.isfinite(z.grad).all()


def test_dense_mahalanobis_fast_path_and_gradcheck():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 3, generator=g, dtype=D64) for _ in range(3))
    W = torch.randn(2, 3, 3, generator=g, dtype=D64, requires_grad=True)
    for causal in (False, True):
        logits = mahalanobis_logits(q, k, W, 1e-3, 0.8)
        keep = torch.ones(6, 6, dtype=torch.bool).tril() if causal else None
        ref = masked_softmax(logits, keep) @ v
        out = mahalanobis_attention(q, k, v, W, 1e-3, 0.8, causal=causal)
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)
    qg = q.clone().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda qq, WW: mahalanobis_attention(qq, k, v, WW, 1e-3, 0.8, causal=True), (qg, W)
    )


# -- modules ----------------------------------------------------------------------------------


MODULE_CASES = [
    ("matroidal", {"m": 16, "graph": "ring_chords"}),
    ("matroidal", {"m": 16, "graph": "ring_chords", "grounded": True, "shared": True}),
    ("matroidal", {"m": 8, "graph": "ring", "shared": True, "bias": True}),
    ("mahalanobis", {}),
    ("mahalanobis", {"shared": True, "bias": True}),
]


@pytest.mark.parametrize("name,opts", MODULE_CASES)
def test_module_fast_path_equals_its_explicit_reference(name, opts):
    torch.manual_seed(0)
    attn = build_attention(name, dim=32, n_heads=4, **opts).double()
    with torch.no_grad():  # move off the initial metric so every head differs
        for p in attn.metric_parameters():
            p.add_(0.3 * torch.randn_like(p))
    x = torch.randn(2, 10, 32, dtype=D64)
    mask = torch.rand(2, 1, 10, 10) > 0.3
    mask[..., 0] = True
    for causal, msk in ((False, None), (True, None), (False, mask), (True, mask)):
        fast = attn(x, causal=causal, mask=msk)
        slow = attn(x, causal=causal, mask=msk, need_weights=True)
        torch.testing.assert_close(fast.out, slow.out, rtol=0, atol=1e-10)
        assert slow.probs is not None and int(slow.diagnostics["nonfinite_logits"]) == 0


@pytest.mark.parametrize("shared", [False, True])
def test_module_gradcheck_through_the_fast_path(shared):
    torch.manual_seed(0)
    attn = MatroidalAttention(12, 2, m=12, graph="knn", shared=shared, bias=True).double()
    x = torch.randn(1, 5, 12, dtype=D64, requires_grad=True)
    names = ("theta", "qkv.weight", "qkv.bias")  # the metric and the weights R is folded into
    params = [
        p.detach().clone().requires_grad_() for p in (attn.theta, attn.qkv.weight, attn.qkv.bias)
    ]

    def f(xx, *ps):
        return torch.func.functional_call(attn, dict(zip(names, ps)), (xx,), {"causal": True}).out

    assert torch.autograd.gradcheck(f, (x, *params))


def test_the_shared_form_scores_one_projection_z_as_the_seeds_pseudocode():
    """shared=True: z = x W_z (one projection for queries and keys), logits from
    matroidal_logits(z) per head, as the seed writes them; the projection has two blocks."""
    torch.manual_seed(0)
    D, H, d, n = 24, 3, 8, 7
    attn = MatroidalAttention(D, H, m=16, graph="ring_chords", shared=True).double()
    with torch.no_grad():
        attn.theta.add_(torch.randn_like(attn.theta))
    assert attn.qkv.weight.shape == (2 * H * d, D)
    x = torch.randn(2, n, D, dtype=D64)
    Wz, Wv = attn.qkv.weight[: H * d].view(H, d, D), attn.qkv.weight[H * d :].view(H, d, D)
    heads = []
    for h in range(H):
        z, v = x @ Wz[h].T, x @ Wv[h].T  # (2, n, d)
        logits = matroidal_logits(z, attn.A[h].double(), attn.theta[h], attn.eps, attn.tau)
        assert (logits.diagonal(dim1=-2, dim2=-1) == 0).all()  # S_ii = 0, the row maximum
        assert (logits <= 0).all()
        keep = torch.ones(n, n, dtype=torch.bool).tril()
        heads.append(masked_softmax(logits, keep) @ v)
    ref = attn.proj(torch.cat(heads, -1))
    with torch.no_grad():
        torch.testing.assert_close(attn(x, causal=True).out, ref, rtol=0, atol=1e-10)


def test_shared_and_separate_forms_differ_and_both_models_train_a_step():
    from attention_atlas.models import ModelConfig

    x = torch.randn(2, 6, 16)
    outs = {}
    for shared in (False, True):
        torch.manual_seed(0)
        cfg = ModelConfig(task="classify", patch_dim=16, dim=16, n_layers=1, n_heads=2,
                          attention="matroidal", attention_options={"m": 8, "shared": shared})  # fmt: skip
        model = cfg.build()
        out = model(x).logits
        out.sum().backward()
        assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
        outs[shared] = out.detach()
    assert not torch.allclose(outs[False], outs[True])


def test_metric_parameters_separate_the_geometry():
    m = build_attention("matroidal", dim=64, n_heads=8, m=16, graph="ring_chords")
    w = build_attention("mahalanobis", dim=64, n_heads=8)
    assert sum(p.numel() for p in m.metric_parameters()) == 8 * 16  # theta (H, m)
    assert sum(p.numel() for p in w.metric_parameters()) == 8 * 8 * 8  # W (H, d, d)
    assert isinstance(m, MatroidalAttention) and isinstance(w, MahalanobisAttention)
    # default initialisation: trace(M) ~= head_dim for matroidal, M = I + eps I for dense
    d = 8
    torch.testing.assert_close(
        m.metric().diagonal(dim1=-2, dim2=-1).sum(-1), torch.full((8,), d + d * 1e-4)
    )
    torch.testing.assert_close(w.metric(), (1 + 1e-4) * torch.eye(d).expand(8, d, d))


@pytest.mark.parametrize(
    "graph,grounded", [("ring_chords", False), ("ring_chords", True), ("random", True),
                       ("sparse_random", False), ("unsigned", False)],
)  # fmt: skip
def test_initial_trace_of_M_is_head_dim_for_every_family(graph, grounded):
    """init_weight = d / |A|_F^2, so trace(M) = d + eps d whatever the column norms."""
    d = 12
    attn = MatroidalAttention(48, 4, m=24, graph=graph, grounded=grounded).double()
    trace = attn.metric().diagonal(dim1=-2, dim2=-1).sum(-1)
    torch.testing.assert_close(trace, torch.full((4,), d * (1 + 1e-4), dtype=D64))
    assert (attn.m > 24) == grounded  # a ground column per connected component


def test_pruning_keeps_outputs_of_the_kept_columns():
    g = torch.Generator().manual_seed(0)
    A = covector_matrix("ring_chords", 8, 24, dtype=D64)
    theta = torch.randn(24, generator=g, dtype=D64) * 3
    z = torch.randn(2, 7, 8, generator=g, dtype=D64)
    delta = 0.5
    A_k, th_k, kept = prune_columns(A, theta, delta)
    assert 0 < kept.numel() < 24 and A_k.shape == (8, kept.numel())
    zeroed = theta.clone()
    dropped = torch.ones(24, dtype=torch.bool)
    dropped[kept] = False
    zeroed[dropped] = float("-inf")  # l_e = softplus(-inf) = 0
    ref = reference_attention(z, z, A, zeroed, 1e-4, 0.9)
    torch.testing.assert_close(
        matroidal_attention(z, z, A_k, th_k, 1e-4, 0.9), ref, rtol=0, atol=1e-10
    )


def test_module_pruning_gives_a_smaller_module_with_the_same_outputs():
    torch.manual_seed(0)
    attn = MatroidalAttention(48, 4, m=32, graph="ring_chords").double()
    with torch.no_grad():
        attn.theta.copy_(torch.randn(4, 32) * 3)
    delta = 0.5
    small = attn.pruned(delta)
    assert small.m < attn.m
    assert small.active_columns() == int((attn.coefficients() >= delta).sum()) < 4 * 32
    ref = MatroidalAttention(48, 4, m=32, graph="ring_chords").double()
    ref.load_state_dict(attn.state_dict())
    with torch.no_grad():
        ref.theta.masked_fill_(attn.coefficients() < delta, float("-inf"))
    x = torch.randn(2, 9, 48, dtype=D64)
    for need_weights in (False, True):
        a = small(x, causal=True, need_weights=need_weights).out
        b = ref(x, causal=True, need_weights=True).out
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    assert sum(p.numel() for p in small.metric_parameters()) < attn.theta.numel()


# -- clear errors -------------------------------------------------------------------------------


def test_clear_errors():
    A = covector_matrix("ring", 4, 4)
    theta = torch.zeros(4)
    z = torch.randn(2, 5, 4)
    with pytest.raises(ValueError, match="eps must be nonnegative"):
        matroidal_logits(z, A, theta, -1e-4, 1.0)
    with pytest.raises(ValueError, match="tau must be positive"):
        matroidal_attention(z, z, A, theta, 1e-4, 0.0)
    with pytest.raises(ValueError, match="eps > 0"):
        matroidal_attention(z, z, A, theta, 0.0, 1.0)
    with pytest.raises(ValueError, match=r"A must have shape \(\.\.\., d=5, m\)"):
        matroidal_logits(torch.randn(2, 5, 5), A, theta, 1e-4, 1.0)
    with pytest.raises(ValueError, match=r"theta must have shape \(\.\.\., m=4\)"):
        matroidal_attention(z, z, A, torch.zeros(5), 1e-4, 1.0)
    with pytest.raises(ValueError, match=r"z must have shape \(batch, \.\.\., n, d\), got \(4,\)"):
        matroidal_logits(torch.randn(4), A, theta, 1e-4, 1.0)
    with pytest.raises(
        ValueError, match=r"z must have shape \(batch, \.\.\., n, d\), got \(5, 4\)"
    ):
        matroidal_logits(torch.randn(5, 4), A, theta, 1e-4, 1.0)  # no batch dimension
    with pytest.raises(ValueError, match=r"z must have shape .*got \(5, 4\)"):
        matroidal_attention(torch.randn(5, 4), torch.randn(5, 4), A, theta, 1e-4, 1.0)
    with pytest.raises(
        ValueError, match=r"v must have shape .* like z \(2, 5, 4\), got \(2, 6, 4\)"
    ):
        matroidal_attention(z, torch.randn(2, 6, 4), A, theta, 1e-4, 1.0)
    with pytest.raises(ValueError, match="z and v must share a dtype"):
        matroidal_attention(z, z.double(), A, theta, 1e-4, 1.0)
    with pytest.raises(
        ValueError, match=r"z, A, theta must be on one device, got z on cpu, A on meta"
    ):
        matroidal_attention(z, z, A.to("meta"), theta, 1e-4, 1.0)
    with pytest.raises(ValueError, match=r"z, A, theta must be on one device.*theta on meta"):
        matroidal_logits(z, A, theta.to("meta"), 1e-4, 1.0)
    with pytest.raises(TypeError, match="A must be a torch.Tensor"):
        matroidal_logits(z, A.tolist(), theta, 1e-4, 1.0)
    with pytest.raises(ValueError, match="eps must be positive"):
        MatroidalAttention(16, 2, eps=0.0)
    with pytest.raises(ValueError, match=r"W must have shape \(\.\.\., d=4, r\), got \(5, 5\)"):
        mahalanobis_logits(z, z, torch.randn(5, 5), 1e-4, 1.0)
    with pytest.raises(ValueError, match="grounded applies to the graph families"):
        MatroidalAttention(16, 2, m=8, graph="sparse_random", grounded=True)
    from attention_atlas.attention.euclidean import EuclideanAttention

    for tau in (0.0, -1.0):
        with pytest.raises(ValueError, match=f"tau must be positive .*got tau={tau}"):
            EuclideanAttention(16, 2, tau=tau)  # at construction, not at the first forward


def test_fast_path_runs_the_cpu_flash_kernel_at_head_dimension_d():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.calls.append((func, args))
            return func(*args, **(kwargs or {}))

    aten = torch.ops.aten
    A = covector_matrix("ring_chords", 16, 64)
    theta = torch.zeros(64, requires_grad=True)
    z = torch.randn(2, 32, 16, requires_grad=True)  # 3-D, as in the stable API
    attn = MatroidalAttention(64, 4, m=32, graph="knn")
    x = torch.randn(2, 32, 64, requires_grad=True)
    for run in (
        lambda: matroidal_attention(z, z, A, theta, 1e-4, 1.0),
        lambda: attn(x, causal=True).out,
    ):
        with Record() as rec:
            run().sum().backward()
        fwd = [
            a for f, a in rec.calls if f == aten._scaled_dot_product_flash_attention_for_cpu.default
        ]
        bwd = [
            a
            for f, a in rec.calls
            if f == aten._scaled_dot_product_flash_attention_for_cpu_backward.default
        ]
        assert len(fwd) == 1 and fwd[0][0].dim() == 4 and fwd[0][0].shape[-1] == 16
        assert len(bwd) == 1 and bwd[0][1].shape[-1] == 17  # the augmented backward
        assert not any(f == aten._softmax.default for f, _ in rec.calls)  # no math path

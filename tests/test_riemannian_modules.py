"""The modules: factor networks, and RiemannianAttention with its phase switches."""

from __future__ import annotations

import math

import pytest
import torch
from riemannian_inputs import DT, TOL, rel

from attention_atlas.attention import build_attention
from attention_atlas.attention import riemannian as R
from attention_atlas.attention.euclidean import euclidean_attention_explicit

ALL_PHASES = dict(rank=3, metric_init_std=1.0, curvature=True, metric_projection=True,
                  transport_rank=2, torsion_rank=1)  # fmt: skip


def test_metric_net_last_layer_starts_at_the_stated_scale():
    torch.manual_seed(0)
    net = R.MetricNet(dim=32, n_heads=4, head_dim=8, rank=4, expansion=2.0, init_std=0.02)
    hidden = 64
    assert net.fc2.weight.shape == (4 * 8 * 4, hidden)
    assert float(net.fc2.weight.detach().std()) == pytest.approx(0.02 / math.sqrt(hidden), rel=0.05)
    assert float(net.fc2.bias.detach().abs().max()) == 0.0
    x = torch.randn(2, 10, 32)
    U = net(x)
    assert U.shape == (2, 4, 10, 8, 4)
    # U is linear in the last layer's scale: the same draws at ten times the std give 10 U
    torch.manual_seed(0)
    big = R.MetricNet(dim=32, n_heads=4, head_dim=8, rank=4, expansion=2.0, init_std=0.2)
    assert rel(big(x), 10 * U) < 1e-5


def test_factor_networks_read_their_last_layer_as_heads_then_d_then_r():
    # eq. (19): U_t[h] is the (d, r) block h of the last layer's output, whatever the layout
    torch.manual_seed(1)
    net = R.TorsionNet(dim=12, n_heads=3, head_dim=4, rank=2).double()
    x = torch.randn(2, 5, 12, dtype=DT)
    y = net.fc2(torch.nn.functional.silu(net.fc1(x))).view(2, 5, 2, 3, 4, 2)  # (B, L, 2, H, d, r)
    left, right = net(x)
    assert torch.equal(left, y[:, :, 0].permute(0, 2, 1, 3, 4))
    assert torch.equal(right, y[:, :, 1].permute(0, 2, 1, 3, 4))
    # stored r-major: U^T is a contiguous (r, d) block per token
    assert left.mT.is_contiguous()


def test_riemannian_attention_is_registered_and_equals_euclidean_at_zero_metric():
    torch.manual_seed(0)
    attn = build_attention("riemannian", dim=24, n_heads=3, rank=2).double()
    torch.nn.init.zeros_(attn.metric_net.fc2.weight)
    x = torch.randn(2, 11, 24, dtype=DT)
    res = attn(x, causal=True)
    q, k, v = attn.split_heads(x)
    euc, _, _ = euclidean_attention_explicit(q, k, v, attn.tau, causal=True)
    expected = attn.proj(euc.transpose(1, 2).reshape(2, 11, 24))
    assert rel(res.out, expected) < TOL
    assert res.extras["metric_factor"].shape == (2, 3, 11, 8, 2)


@pytest.mark.parametrize("name", ["riemannian", "fiber_bundle"])
def test_weights_path_equals_fast_path_and_reports_diagnostics(name):
    torch.manual_seed(1)
    attn = build_attention(name, dim=16, n_heads=2, **ALL_PHASES).double()
    x = torch.randn(2, 9, 16, dtype=DT)
    fast = attn(x, causal=True)
    slow = attn(x, causal=True, need_weights=True)
    assert rel(fast.out, slow.out) < TOL
    assert slow.probs is not None and slow.probs.shape == (2, 2, 9, 9)
    assert int(slow.diagnostics["nonfinite_logits"]) == 0
    assert "metric_kappa_mean" not in fast.diagnostics  # a training forward skips monitoring
    attn.eval()
    watched = attn(x, causal=True)
    kappa = (watched.extras["metric_factor"].detach() ** 2).sum((-1, -2))
    assert float(watched.diagnostics["metric_kappa_mean"]) == pytest.approx(float(kappa.mean()))
    assert float(watched.diagnostics["metric_kappa_max"]) == pytest.approx(float(kappa.max()))
    with torch.no_grad():  # so does any forward without autograd, in either mode
        assert "metric_kappa_var" in attn.train()(x, causal=True).diagnostics


def test_fiber_bundle_attention_is_riemannian_attention_with_eq16_scores():
    torch.manual_seed(2)
    fba = build_attention("fiber_bundle", dim=16, n_heads=2, **ALL_PHASES).double()
    ra = build_attention("riemannian", dim=16, n_heads=2, method="lowrank", **ALL_PHASES).double()
    ra.load_state_dict(fba.state_dict())
    assert isinstance(fba, R.RiemannianAttention) and fba.method == "decomposed"
    x = torch.randn(2, 9, 16, dtype=DT)
    assert rel(fba(x, causal=True).out, ra(x, causal=True).out) < TOL


def test_transport_and_torsion_act_on_each_head_output():
    torch.manual_seed(3)
    attn = build_attention("riemannian", dim=16, n_heads=2, **ALL_PHASES).double()
    x = torch.randn(2, 9, 16, dtype=DT)
    q, k, v = attn.split_heads(x)
    res = attn.attend(q, k, v, x=x, causal=True, mask=None, need_weights=True)
    assert res.probs is not None
    plain = res.probs @ v  # the aggregated values, before transport (eq. (24))
    P = R.transport_dense(res.extras["transport_a"], res.extras["transport_b"])
    T = R.torsion_dense(res.extras["torsion_l"], res.extras["torsion_r"])
    gate = torch.sigmoid(attn.torsion_gate)
    expected = ((P + gate * T) @ plain.unsqueeze(-1)).squeeze(-1)  # P' = P + gamma_T T
    assert rel(res.out, expected) < TOL


def test_torsion_without_transport_is_identity_plus_gated_torsion():
    torch.manual_seed(4)
    attn = build_attention("riemannian", dim=16, n_heads=2, torsion_rank=2).double()
    x = torch.randn(1, 7, 16, dtype=DT)
    res = attn.attend(*attn.split_heads(x), x=x, causal=False, mask=None, need_weights=True)
    assert "transport_a" not in res.extras
    q, k, v = attn.split_heads(x)
    U = res.extras["metric_factor"]
    plain = R.geodesic_attention_reference(q, k, v, U, attn.tau)[0]
    T = R.torsion_dense(res.extras["torsion_l"], res.extras["torsion_r"])
    expected = plain + torch.sigmoid(attn.torsion_gate) * (T @ plain.unsqueeze(-1)).squeeze(-1)
    assert rel(res.out, expected) < TOL


def test_phase_switches_remove_the_metric_and_the_geodesic_terms():
    torch.manual_seed(5)
    x = torch.randn(1, 7, 16, dtype=DT)
    no_metric = build_attention("riemannian", dim=16, n_heads=2, metric=False, curvature=True)
    res = no_metric.double().attend(*no_metric.split_heads(x), x=x, causal=False, mask=None,
                                    need_weights=True)  # fmt: skip
    assert torch.count_nonzero(res.extras["metric_factor"]) == 0
    flat = build_attention("riemannian", dim=16, n_heads=2, geodesic=False, curvature=True,
                           metric_init_std=1.0, transport_rank=2).double()  # fmt: skip
    q, k, v = flat.split_heads(x)
    res = flat.attend(q, k, v, x=x, causal=False, mask=None, need_weights=True)
    assert float(res.extras["metric_factor"].detach().abs().max()) > 1e-3  # a metric exists ...
    euc = euclidean_attention_explicit(q, k, v, flat.tau)[0]
    assert rel(res.out, euc) < TOL  # ... but neither scores nor transport use it
    assert "transport_a" not in res.extras


def test_riemannian_attention_metric_parameters_get_gradients():
    torch.manual_seed(2)
    attn = build_attention("riemannian", dim=16, n_heads=2, rank=2, metric_init_std=0.5)
    mp = attn.metric_parameters()
    assert mp and {id(p) for p in mp}.isdisjoint({id(p) for p in attn.qkv.parameters()})
    attn(torch.randn(2, 7, 16)).out.pow(2).sum().backward()
    assert all(
        p.grad is not None and float(p.grad.abs().sum()) > 0 for p in attn.metric_net.parameters()
    )


def test_riemannian_attention_rejects_bad_options():
    with pytest.raises(ValueError, match="baseline must be"):
        build_attention("riemannian", dim=8, n_heads=2, baseline="nope")
    with pytest.raises(ValueError, match="rank must be positive"):
        build_attention("riemannian", dim=8, n_heads=2, rank=0)
    with pytest.raises(ValueError, match="unknown method"):
        build_attention("fiber_bundle", dim=8, n_heads=2, method="fastest")
    with pytest.raises(ValueError, match="kind must be 'linear' or 'cayley'"):
        build_attention("riemannian", dim=8, n_heads=2, transport_rank=1, transport_kind="exp")


def test_perturbation_entry_scale_bounds_every_score_change_and_is_attained_in_its_factors() -> (
    None
):
    """|S_riem - S_euc|_ij <= U-bar^2 M / tau entrywise (Proposition 3.5), with U-bar^2 and M the
    explicit maxima."""
    from attention_atlas.attention.riemannian import geodesic_scores
    from attention_atlas.attention.riemannian.diagnostics import perturbation_entry_scale

    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 7, 5, generator=g, dtype=torch.float64).unbind(0)
    U = torch.randn(7, 5, 2, generator=g, dtype=torch.float64)
    tau = 1.7
    scale = perturbation_entry_scale(q, k, U, tau)
    ubar2 = max(float((U[t] ** 2).sum()) for t in range(7))
    M = max(float(((q[i] - k[j]) ** 2).sum()) for i in range(7) for j in range(7))
    assert float(scale) == pytest.approx(ubar2 * M / tau, rel=1e-14)
    dS = geodesic_scores(q, k, U, tau) - geodesic_scores(q, k, torch.zeros_like(U), tau)
    assert float(dS.abs().max()) <= float(scale) * (1 + 1e-12)


def test_auto_method_materialises_eq16_when_small_and_takes_the_fast_path_beyond(monkeypatch):
    from attention_atlas.attention.riemannian import modules

    torch.manual_seed(5)
    attn = build_attention("riemannian", dim=8, n_heads=2, rank=2, metric_init_std=1.0).double()
    x = torch.randn(2, 6, 8, dtype=DT)
    q, k, v = attn.split_heads(x)
    U = attn.metric_factor(x, DT)
    ref = R.geodesic_attention_reference(q, k, v, U, attn.tau, True)[0]
    calls: list[str] = []
    for name in ("geodesic_scores_decomposed", "geodesic_attention"):
        inner = getattr(modules, name)
        monkeypatch.setattr(
            modules, name, lambda *a, _f=inner, _n=name, **kw: calls.append(_n) or _f(*a, **kw)
        )
    small = attn.attend(q, k, v, x=x, causal=True, mask=None, need_weights=False).out
    monkeypatch.setattr(modules.scores_module, "PAIRWISE_CHUNK", 6 * 2 * 12 - 1)  # one too few
    large = attn.attend(q, k, v, x=x, causal=True, mask=None, need_weights=False).out
    assert calls == ["geodesic_scores_decomposed", "geodesic_attention"]
    assert rel(small, ref) < TOL and rel(large, ref) < TOL

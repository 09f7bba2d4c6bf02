"""The cofactor regulariser's fast paths: the closed form of causal heads, the inverse taken in
the forward, and head probabilities from the forward's own queries and keys. Each is checked
against an independent reference (explicit minors or the explicit attention path, float64)."""

from __future__ import annotations

import math

import pytest
import torch

from attention_atlas import native
from attention_atlas.cofactor import cofactor_penalty, head_probs, softmax_matrices
from attention_atlas.cofactor.heads import head_qk
from attention_atlas.cofactor.native_heads import heads_penalty, inplace_grads
from attention_atlas.cofactor.penalty import (
    CausalHeadPenalty,
    FastPenalty,
    regularizer,
)

F64 = torch.float64


def _causal_logits(batch: int, n: int, seed: int, scale: float = 1.5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    z = scale * torch.randn(batch, n, n, generator=g, dtype=F64)
    return z.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))


@pytest.mark.parametrize("beta", [0.0, 0.3])
@pytest.mark.parametrize("n", [1, 2, 7, 12])
def test_causal_closed_form_equals_the_minors_in_value_and_in_the_logits_gradient(beta, n):
    """c = (prod_{i>=1} s_i) e_0 gives the seed's penalty of every causal head; through the
    softmax its gradient is the minors' (and the general LU's). The minors give the vanishing
    cofactors as exact zeros, as the closed form does; the LU leaves round-off of 1e-17, which
    moves log(max(c_i, 0) + eps) by up to 1e-9 relative, hence its looser tolerance."""
    z = _causal_logits(4, n, seed=n).requires_grad_(True)
    out = {}
    for name, kw in {"closed": {"causal": True}, "minors": {"method": "minors"},
                     "lu": {}}.items():  # fmt: skip
        p = cofactor_penalty(torch.softmax(z, -1), beta=beta, reduce="none", **kw)
        out[name] = (p.detach(), torch.autograd.grad(p.sum(), z)[0])
    for ref, tol in (("minors", 1e-12), ("lu", 1e-9)):
        torch.testing.assert_close(out["closed"][0], out[ref][0], rtol=tol, atol=tol)
        scale = float(out[ref][1].abs().max()) + 1e-300
        torch.testing.assert_close(out["closed"][1], out[ref][1], rtol=1e-9, atol=1e-10 * scale)


def test_causal_closed_form_is_the_explicit_formula():
    """-log(m + eps) + beta (log S - mean log p - log n), p = (m + eps, eps, ..., eps)."""
    n, beta, eps = 6, 0.4, 1e-3
    A = softmax_matrices(3, n, n, mask="causal", seed=2)
    m = (1 - A.diagonal(dim1=-2, dim2=-1)[:, 1:]).prod(-1)
    p = torch.full((3, n), eps, dtype=F64)
    p[:, 0] += m
    kl = (
        torch.full((3, n), 1.0 / n, dtype=F64) * (1.0 / n / (p / p.sum(-1, keepdim=True))).log()
    ).sum(-1)
    want = -torch.log(m + eps) + beta * kl
    got = cofactor_penalty(A, beta=beta, eps=eps, causal=True, reduce="none")
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


def test_causal_closed_form_passes_gradcheck_through_the_softmax():
    z = _causal_logits(2, 5, seed=7).requires_grad_(True)
    for beta, eps in [(0.0, 1e-8), (0.5, 1e-8), (0.5, 1e-2)]:
        assert torch.autograd.gradcheck(
            lambda t, b=beta, e=eps: cofactor_penalty(
                torch.softmax(t, -1), beta=b, eps=e, causal=True, reduce="none"
            ),
            (z,),
        )


def test_causal_closed_form_of_a_saturated_token_has_the_exact_gradient():
    """s_2 = 0 (token 2 attends only to itself): m = 0, the loss is -log(eps) and dloss/ds_2 =
    -prod_{i != 2} s_i / eps, finite, through the product."""
    A = softmax_matrices(1, 5, 5, mask="causal", seed=1)
    A[0, 2] = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0], dtype=F64)
    A.requires_grad_(True)
    loss = cofactor_penalty(A, causal=True)
    assert abs(float(loss.detach()) + math.log(1e-8)) < 1e-12
    (g,) = torch.autograd.grad(loss, A)
    s = A.detach().tril(-1).sum(-1)
    others = s[0, [1, 3, 4]].prod()
    torch.testing.assert_close(g[0, 2, :2], (-others / 1e-8).expand(2), rtol=1e-12, atol=0)
    assert torch.isfinite(g).all()


def _explicit_causal_penalty(q, k, scale, beta, eps, method="minors"):
    """The reference: logits, causal mask and softmax written out, then the penalty by the
    minors (or another ``method`` of :func:`cofactor_penalty`)."""
    n = q.shape[-2]
    z = (q @ k.transpose(-2, -1)) * scale
    z = z.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return cofactor_penalty(torch.softmax(z, -1), beta=beta, eps=eps, method=method, reduce="none")


@pytest.mark.parametrize("beta", [0.0, 0.3])
@pytest.mark.parametrize("n", [1, 2, 7, 12])
def test_causal_head_penalty_equals_the_minors_of_the_explicit_softmax(beta, n):
    """One node from queries and keys (product, mask, softmax, row sums, closed form, and its
    written-out backward) against the minors of the explicit probabilities: value and the
    gradients in q and k (float64), and gradcheck."""
    g = torch.Generator().manual_seed(10 + n)
    q = torch.randn(5, n, 4, dtype=F64, generator=g).requires_grad_(True)
    k = torch.randn(5, n, 4, dtype=F64, generator=g).requires_grad_(True)
    got = CausalHeadPenalty.apply(q, k, 0.7, beta, 1e-8)
    ref = _explicit_causal_penalty(q, k, 0.7, beta, 1e-8)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    w = torch.randn(5, dtype=F64, generator=g)  # a gradient that differs per head
    for a, b in zip(torch.autograd.grad((got * w).sum(), (q, k)),
                    torch.autograd.grad((ref * w).sum(), (q, k))):  # fmt: skip
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradcheck(
        lambda a, b: CausalHeadPenalty.apply(a, b, 0.7, beta, 1e-3), (q, k)
    )


def test_causal_head_penalty_of_a_saturated_token_takes_the_exclusive_products():
    """Token 2 attends only to itself (s_2 = 0 to working precision): m = 0, and dloss/ds_i =
    dloss/dm prod_{k != i} s_k must come from the exclusive products (m / s_i would be 0/0).
    The gradient equals autograd through the explicit product, finite."""
    q = torch.randn(1, 5, 3, dtype=F64, generator=torch.Generator().manual_seed(3))
    k = q.clone()
    q[0, 2], k[0, 2] = 40.0, 40.0  # z_22 = 4800 dwarfs z_2j: A_22 = 1, s_2 = 0 in float64
    q.requires_grad_(True)
    k.requires_grad_(True)
    got = CausalHeadPenalty.apply(q, k, 1.0, 0.2, 1e-8)
    z = (q @ k.transpose(-2, -1)).masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1),
                                              float("-inf"))  # fmt: skip
    ref = cofactor_penalty(torch.softmax(z, -1), beta=0.2, causal=True, reduce="none")
    assert float(torch.softmax(z.detach(), -1)[0, 2, :2].sum()) == 0.0  # the case under test
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(torch.autograd.grad(got.sum(), (q, k)), torch.autograd.grad(ref.sum(), (q, k))):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_causal_head_penalty_in_float32_keeps_the_dtype_and_matches_float64():
    """The training dtype: gradients come back in float32, the loss in float64, both within
    float32 round-off of the float64 computation."""
    g = torch.Generator().manual_seed(4)
    q64, k64 = (
        torch.randn(6, 16, 8, dtype=F64, generator=g),
        torch.randn(6, 16, 8, dtype=F64, generator=g),
    )
    q32, k32 = q64.float().requires_grad_(True), k64.float().requires_grad_(True)
    got = CausalHeadPenalty.apply(q32, k32, 0.35, 0.1, 1e-8)
    assert got.dtype == F64
    q64.requires_grad_(True)
    k64.requires_grad_(True)
    ref = CausalHeadPenalty.apply(q64, k64, 0.35, 0.1, 1e-8)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    gq, gk = torch.autograd.grad(got.sum(), (q32, k32))
    rq, rk = torch.autograd.grad(ref.sum(), (q64, k64))
    assert gq.dtype == gk.dtype == torch.float32
    torch.testing.assert_close(gq.double(), rq, rtol=1e-4, atol=1e-5 * float(rq.abs().max()))
    torch.testing.assert_close(gk.double(), rk, rtol=1e-4, atol=1e-5 * float(rk.abs().max()))


def test_causal_flag_names_a_matrix_that_is_not_lower_triangular():
    A = softmax_matrices(2, 5, 5, seed=0)
    with pytest.raises(ValueError, match="lower-triangular"):
        cofactor_penalty(A, causal=True)


def test_fast_penalty_without_a_gradient_gives_the_same_values():
    """With a gradient wanted x comes from M^{-1} (column means), without it from one solve."""
    A = softmax_matrices(5, 9, 9, scale=2.0, seed=4)
    with torch.no_grad():
        free = FastPenalty.apply(A, 0.3, 1e-8)[0]
    graded = FastPenalty.apply(A.clone().requires_grad_(True), 0.3, 1e-8)[0]
    torch.testing.assert_close(graded.detach(), free, rtol=1e-13, atol=1e-13)


# -- head probabilities from the forward's queries and keys ----------------------------------


def _model(task: str, temperature: float = 1.0):
    from attention_atlas.models import ModelConfig, Transformer

    torch.manual_seed(0)
    opts = {"attention_options": {"temperature": temperature}} if temperature != 1.0 else {}
    if task == "lm":
        cfg = ModelConfig(task="lm", vocab_size=11, dim=16, n_layers=3, n_heads=4, max_len=9,
                          **opts)  # fmt: skip
        x = torch.randint(0, 11, (3, 9))
    else:
        cfg = ModelConfig(task="classify", patch_dim=4, n_classes=3, dim=16, n_layers=3,
                          n_heads=4, max_len=7, **opts)  # fmt: skip
        x = torch.randn(3, 7, 4, dtype=F64)
    return Transformer(cfg).double(), x


def test_dot_attention_returns_queries_and_keys_only_under_autograd():
    model, x = _model("lm")
    res = model(x).attentions[0]
    assert res.extras["query"].shape == res.extras["key"].shape == (3, 4, 9, 4)
    with torch.no_grad():
        assert not model(x).attentions[0].extras


@pytest.mark.parametrize("task", ["lm", "classify"])
@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_head_probs_from_the_forward_equal_the_recomputed_and_the_explicit_ones(task, temperature):
    model, x = _model(task, temperature)
    explicit = [a.probs for a in model(x, need_weights=True).attentions]
    out = model(x)
    bare = type(out)(out.logits, [type(a)(a.out) for a in out.attentions], out.hidden)
    for heads, idx in [(1, [0]), ([1, 3], [1, 3])]:
        ref = torch.stack([explicit[li][:2, idx] for li in range(3)])
        for o in (out, bare):  # the forward's q, k; recomputed from the hidden states
            got = head_probs(model, o, heads=heads, max_items=2)
            torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("task", ["lm", "classify"])
@pytest.mark.parametrize("kernels", [False, True])
def test_regularizer_gradient_equals_the_minors_reference_on_the_explicit_probabilities(
    task, kernels
):
    """The harness's regulariser (forward's q, k; the closed form for the causal model, with
    ``kernels`` the native one reading the heads in place) against the O(n^4) minors on the
    explicit path's probabilities: value and every parameter's gradient (float64 model)."""
    model, x = _model(task)
    params = list(model.parameters())
    out = model(x)
    with native.enabled(kernels):
        fast = regularizer(model, out, None, heads=2, beta=0.1)
    g_fast = torch.autograd.grad(fast, params, allow_unused=True)
    probs = [a.probs[:, :2] for a in model(x, need_weights=True).attentions]
    ref = cofactor_penalty(torch.cat([p.reshape(-1, 9 if task == "lm" else 7,
                                                9 if task == "lm" else 7) for p in probs]),
                           beta=0.1, method="minors")  # fmt: skip
    g_ref = torch.autograd.grad(ref, params, allow_unused=True)
    torch.testing.assert_close(fast, ref, rtol=1e-11, atol=0)
    for a, b in zip(g_fast, g_ref):
        if a is None or b is None:
            assert a is None or float(a.abs().max()) == 0.0
            continue
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9 * float(b.abs().max()) + 1e-15)


@pytest.mark.parametrize(("heads", "items"), [(1, None), ([1, 2], 2), ([1, 3], 2), ([2, 0], None)])
def test_native_heads_read_in_place_equal_the_stacked_heads(heads, items):
    """The regulariser's native path (:class:`CausalHeadsPenalty`: the heads read where the
    forward left them, the gradient formed in the forward kernel) against
    :class:`CausalHeadPenalty`'s kernels on stacked copies: the same loss and gradient of every
    parameter, in float64 to 1e-12 (the two round differently: one scales by the upstream
    gradient last)."""
    model, x = _model("lm")
    params = list(model.parameters())
    out = model(x)
    with native.enabled(True):
        got = regularizer(model, out, None, heads=heads, beta=0.1, max_items=items)
        g_got = torch.autograd.grad(3 * got, params, retain_graph=True, allow_unused=True)
        q, k, temperature = head_qk(model, out, heads=heads, max_items=items)
        scale = 1.0 / (math.sqrt(q.shape[-1]) * temperature)
        want = CausalHeadPenalty.apply(q.flatten(0, -3), k.flatten(0, -3), scale, 0.1, 1e-8).mean()
        g_want = torch.autograd.grad(3 * want, params, allow_unused=True)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    for a, b in zip(g_got, g_want):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("idx", [[2, 0], [1, 2]])
def test_native_heads_read_in_place_pass_gradcheck(idx):
    """:func:`heads_penalty` (:class:`CausalHeadsPenalty`) on strided views ``(B, H, n, d)`` of a
    projection (q and k interleaved, as a forward's ``qkv``), two layers, two heads of the first
    two items (gathered, or a run of consecutive heads passed as a view); and without autograd
    the same value."""
    g = torch.Generator().manual_seed(11)
    qkv = [torch.randn(3, 6, 2, 3, 4, dtype=F64, generator=g).requires_grad_() for _ in range(2)]

    def loss(*ps: torch.Tensor) -> torch.Tensor:
        qs = [p.permute(2, 0, 3, 1, 4)[0] for p in ps]  # (B, H, n, d) views, rows 2 H d apart
        ks = [p.permute(2, 0, 3, 1, 4)[1] for p in ps]
        with native.enabled(True):
            return heads_penalty(qs, ks, idx, 2, 0.4, 0.3, 1e-8)

    with_grad = loss(*qkv)
    with torch.no_grad():
        assert torch.equal(loss(*qkv), with_grad.detach()) and with_grad.shape == ()
    assert torch.autograd.gradcheck(loss, qkv)


def test_native_heads_out_of_range_say_so():
    """A head range or item count outside the tensors is refused with both in the message."""
    q = torch.randn(2, 3, 4, 2, dtype=F64)
    with (
        native.enabled(True),
        pytest.raises(
            ValueError,
            match=r"items 1\.\.2 and heads within 0\.\.2 expected, got 2 items and heads 2\.\.3",
        ),
    ):
        heads_penalty([q], [q], [2, 3], 2, 0.4, 0.3, 1e-8)


@pytest.mark.parametrize(("heads", "items"), [(1, None), ([1, 2], 2), (1, 2)])
def test_native_heads_inplace_gradients_equal_the_dense_ones(heads, items):
    """Inside :func:`inplace_grads` (the training step's setting) the regulariser's node returns
    no gradient for the chosen heads' queries and keys, and a hook on each adds it into the
    gradient the logits give it: every parameter's gradient of ``task + 3 reg`` equals the dense
    path's bit for bit, and again in a second pass through a kept graph (each pass adds its
    own); a pass that does not reach the regulariser adds nothing; a leaf input keeps the dense
    gradient; a loss of the regulariser alone, which gives the views no other gradient, is
    refused with it on (why it is off by default)."""
    model, x = _model("lm")
    params = list(model.parameters())
    grads, task_only = [], []
    for on in (False, True):
        out = model(x)
        with native.enabled(True), inplace_grads(on):
            reg = regularizer(model, out, None, heads=heads, beta=0.1, max_items=items)
        task = out.logits.square().mean()
        node = reg.grad_fn
        assert type(node).__name__ == "CausalHeadsPenaltyBackward"
        first = torch.autograd.grad(task + 3 * reg, params, allow_unused=True, retain_graph=True)
        task_only.append(torch.autograd.grad(task, params, allow_unused=True, retain_graph=True))
        second = torch.autograd.grad(task + 3 * reg, params, allow_unused=True)
        grads.append((first, second))
    for got, want in [(grads[1][0], grads[0][0]), (grads[1][1], grads[0][0]),
                      (task_only[1], task_only[0])]:  # fmt: skip
        for a, b in zip(want, got):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(b, a, rtol=0, atol=0)
    assert not all(torch.equal(a, b) for a, b in zip(grads[0][0], task_only[0]) if a is not None)
    q = torch.randn(3, 4, 5, 2, dtype=F64, requires_grad=True)
    with native.enabled(True):
        loss = heads_penalty([q], [q], [1], 2, 0.4, 0.3, 1e-8, inplace_grad=True)
    (g,) = torch.autograd.grad(loss, q)
    assert float(g[:2, 1].abs().min()) > 0.0  # items 0, 1 of head 1 only
    assert float(g[:, [0, 2, 3]].abs().max()) == 0.0 and float(g[2:].abs().max()) == 0.0
    out = model(x)
    with native.enabled(True), inplace_grads():
        alone = regularizer(model, out, None, heads=heads, beta=0.1, max_items=items)
    with pytest.raises(
        RuntimeError, match="need a gradient of its queries and keys from elsewhere"
    ):
        torch.autograd.grad(alone, params, allow_unused=True)

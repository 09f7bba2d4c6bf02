"""The stable functional API (DESIGN.md), property-based: for any valid shapes and float
dtypes every function returns its documented shape in the input's dtype; for a wrong rank,
width, length, dtype or an empty sequence it raises naming the argument and its shape, not
an error from deep inside torch."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_atlas import build_attention
from attention_atlas.attention.dot import explicit_attention, sdpa
from attention_atlas.attention.registry import attention_class, available_attention
from attention_atlas.attention.sma import SSD_METHODS, ssd
from attention_atlas.linalg import metric_inverse_apply

torch.set_num_threads(1)  # tiny ops on a shared 2-core machine: threads only contend

FLOATS = st.sampled_from([torch.float32, torch.float64])
SIZES = st.fixed_dictionaries(
    {
        "batch": st.lists(st.integers(1, 3), min_size=0, max_size=2),  # leading dims (...)
        "L": st.integers(1, 6),
        "d": st.integers(1, 5),
        "r": st.integers(1, 3),
    }
)
EXAMPLES = settings(max_examples=25, deadline=None)


def randn(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype)


# -- valid inputs: the documented shapes and dtypes -------------------------------------------


@EXAMPLES
@given(SIZES, FLOATS, st.booleans())
def test_dot_attention_returns_the_values_shape_in_their_dtype(s, dtype, causal):
    *b, n, d = [*s["batch"], s["L"], s["d"]]
    q, k, v = (randn(*b, n, d, dtype=dtype) for _ in range(3))
    out, probs, logits = explicit_attention(q, k, v, causal=causal)
    assert out.shape == (*b, n, d) and out.dtype == dtype
    assert probs.shape == logits.shape == (*b, n, n)
    fast = sdpa(q, k, v, causal=causal)
    assert fast.shape == out.shape and fast.dtype == dtype
    torch.testing.assert_close(fast, out)


@EXAMPLES
@given(SIZES, FLOATS)
def test_metric_inverse_apply_returns_x_shape_and_inverts_the_metric(s, dtype):
    b, d, r = s["batch"], s["d"], s["r"]
    U, x = randn(*b, d, r, dtype=dtype), randn(*b, d, dtype=dtype)
    y = metric_inverse_apply(U, x)
    assert y.shape == x.shape and y.dtype == dtype
    g = torch.eye(d, dtype=torch.float64) + U.double() @ U.double().transpose(-1, -2)
    back = (g @ y.double().unsqueeze(-1)).squeeze(-1)  # g (g^-1 x) = x
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(back, x.double(), atol=tol, rtol=tol)


@EXAMPLES
@given(SIZES, FLOATS)
def test_geodesic_scores_and_attention_have_the_documented_shapes(s, dtype):
    from attention_atlas.attention.riemannian import geodesic_attention, geodesic_scores

    *b, n, d, r = [*s["batch"], s["L"], s["d"], s["r"]]
    q, k, v = (randn(*b, n, d, dtype=dtype) for _ in range(3))
    U = randn(*b, n, d, r, dtype=dtype)
    S = geodesic_scores(q, k, U, 1.0)
    assert S.shape == (*b, n, n) and S.dtype == dtype
    out = geodesic_attention(q, k, v, U, 1.0)
    assert out.shape == (*b, n, d) and out.dtype == dtype


@EXAMPLES
@given(st.integers(1, 2), st.integers(1, 6), st.integers(1, 4), st.integers(1, 4), FLOATS)
def test_matroidal_logits_and_attention_have_the_documented_shapes(batch, n, d, m, dtype):
    from attention_atlas.attention.metric import matroidal_attention, matroidal_logits

    z, v = randn(batch, n, d, dtype=dtype), randn(batch, n, d, dtype=dtype)
    A, theta = randn(d, m, dtype=dtype), randn(m, dtype=dtype)
    logits = matroidal_logits(z, A, theta, 1e-3, 1.0)
    assert logits.shape == (batch, n, n) and logits.dtype == dtype
    out = matroidal_attention(z, v, A, theta, 1e-3, 1.0)
    assert out.shape == (batch, n, d) and out.dtype == dtype


@EXAMPLES
@given(st.integers(1, 2), st.integers(1, 9), st.integers(1, 2), st.integers(1, 3), FLOATS)
def test_ssd_returns_x_shape_for_any_length(batch, length, heads, n, dtype):
    from attention_atlas.attention.sma import ssd

    x = randn(batch, length, heads, 3, dtype=dtype)
    log_a = -torch.rand(batch, length, heads, dtype=dtype)
    B, C = randn(batch, length, heads, n, dtype=dtype), randn(batch, length, heads, n, dtype=dtype)
    for method in ("chunked", "quadratic", "recurrent"):
        y = ssd(x, log_a, B, C, method=method, chunk_size=4)
        assert y.shape == x.shape and y.dtype == dtype, method


@EXAMPLES
@given(st.lists(st.integers(1, 3), max_size=2), st.integers(2, 5), FLOATS)
def test_principal_cofactors_have_one_entry_per_state(batch, n, dtype):
    from attention_atlas.cofactor import principal_cofactors, stability_margin

    A = torch.softmax(randn(*batch, n, n, dtype=dtype), dim=-1)
    c = principal_cofactors(A)
    assert c.shape == (*batch, n) and c.dtype == dtype
    assert stability_margin(A).shape == tuple(batch)


# -- invalid inputs: refused, naming the argument ---------------------------------------------

BAD_QKV = st.sampled_from(["rank", "width", "length", "empty", "int", "mixed dtype", "list"])


def corrupt(kind: str, q, k, v):
    """``(q, k, v, argument named in the error, its shape in the message or None)``."""
    if kind == "rank":
        return q[..., 0, :], k, v, "q", tuple(q[..., 0, :].shape)
    if kind == "width":
        k2 = torch.cat([k, k[..., :1]], dim=-1)
        return q, k2, v, "k", tuple(k2.shape)
    if kind == "length":
        v2 = torch.cat([v, v[..., :1, :]], dim=-2)
        return q, k, v2, "v", tuple(v2.shape)
    if kind == "empty":
        k0, v0 = k[..., :0, :], v[..., :0, :]
        return q, k0, v0, "k", tuple(k0.shape)
    if kind == "int":
        return q.long(), k, v, "q", None
    if kind == "mixed dtype":
        return q, k.double() if k.dtype == torch.float32 else k.float(), v, "k", None
    return q.tolist(), k, v, "q", None


@EXAMPLES
@given(SIZES, FLOATS, BAD_QKV)
def test_dot_attention_names_the_bad_argument(s, dtype, kind):
    shape = (*s["batch"], s["L"] + 1, s["d"] + 1)  # L, d >= 2: every corruption is possible
    q, k, v = (randn(*shape, dtype=dtype) for _ in range(3))
    q, k, v, name, bad_shape = corrupt(kind, q, k, v)
    for fn in (sdpa, lambda *a: explicit_attention(*a)[0]):
        with pytest.raises((TypeError, ValueError)) as err:
            fn(q, k, v)
        msg = str(err.value)
        assert re.search(rf"\b{name}\b", msg), msg
        if bad_shape is not None:
            assert str(bad_shape) in msg, msg


@EXAMPLES
@given(SIZES, FLOATS, st.sampled_from(["x width", "U rank", "empty d", "int x", "mixed dtype"]))
def test_metric_inverse_apply_names_the_bad_argument(s, dtype, kind):
    b, d, r = s["batch"], s["d"], s["r"]
    U, x = randn(*b, d, r, dtype=dtype), randn(*b, d, dtype=dtype)
    name = {"x width": "x", "U rank": "U", "empty d": "U", "int x": "x", "mixed dtype": "x"}[kind]
    if kind == "x width":
        x = randn(*b, d + 1, dtype=dtype)
    elif kind == "U rank":
        U = randn(d, dtype=dtype)
    elif kind == "empty d":
        U, x = U[..., :0, :], x[..., :0]
    elif kind == "int x":
        x = x.long()
    else:
        x = x.double() if dtype == torch.float32 else x.float()
    with pytest.raises((TypeError, ValueError)) as err:
        metric_inverse_apply(U, x)
    assert re.search(rf"\b{name}\b", str(err.value)), str(err.value)


#: variants whose module does not (yet) go through Attention.check_input (own forward)
OWN_FORWARD = {"fiber_bundle"}


#: the library's own variants (not those other test modules register, such as the broken ones of
#: tests/test_atlas_contract.py, which this process may have imported first)
LIBRARY_VARIANTS = sorted(
    v for v in available_attention() if attention_class(v).__module__.startswith("attention_atlas.")
)


@pytest.mark.parametrize("variant", sorted(set(LIBRARY_VARIANTS) - OWN_FORWARD))
@settings(max_examples=8, deadline=None)
@given(st.sampled_from(["rank", "width", "empty", "dtype", "tensor"]))
def test_every_variant_names_x_and_its_shape_for_bad_input(variant, kind):
    opts = {"groups": [{"name": "dot", "heads": 2}]} if variant == "mixed" else {}
    attn = build_attention(variant, dim=8, n_heads=2, **opts)
    x = torch.randn(2, 5, 8)
    bad = {
        "rank": x[0], "width": torch.randn(2, 5, 6), "empty": x[:, :0], "dtype": x.double(),
        "tensor": x.tolist(),
    }[kind]  # fmt: skip
    with pytest.raises((TypeError, ValueError), match=r"expected x of") as err:
        attn(bad)
    if kind in ("rank", "width", "empty"):
        assert str(tuple(bad.shape)) in str(err.value)


# -- structured masked attention and SSD (attention_atlas.attention.sma) -----------------------

SSD_SIZES = st.fixed_dictionaries(
    {"b": st.integers(1, 2), "L": st.integers(1, 9), "h": st.integers(1, 2),
     "p": st.integers(1, 3), "n": st.integers(1, 3), "chunk": st.integers(1, 5)}
)  # fmt: skip


def ssd_args(s, dtype):
    b, L, h, p, n = s["b"], s["L"], s["h"], s["p"], s["n"]
    x = randn(b, L, h, p, dtype=dtype)
    log_a = -torch.rand(b, L, h, dtype=dtype)
    return x, log_a, randn(b, L, h, n, dtype=dtype), randn(b, L, h, n, dtype=dtype)


@EXAMPLES
@given(SSD_SIZES, FLOATS)
def test_ssd_methods_agree_and_its_matrix_and_step_have_the_documented_shapes(s, dtype):
    from attention_atlas.attention.sma import ssd_matrix, ssd_step

    x, log_a, B, C = ssd_args(s, dtype)
    y = {m: ssd(x, log_a, B, C, method=m, chunk_size=s["chunk"]) for m in SSD_METHODS}
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    for m, ym in y.items():
        assert ym.shape == x.shape and ym.dtype == dtype, m
        torch.testing.assert_close(ym, y["recurrent"], atol=tol, rtol=tol)
    M = ssd_matrix(log_a, B, C)
    assert M.shape == (s["b"], s["h"], s["L"], s["L"]) and M.dtype == dtype
    state = torch.zeros(s["b"], s["h"], s["p"], s["n"], dtype=dtype)
    y0, state = ssd_step(x[:, 0], log_a[:, 0], B[:, 0], C[:, 0], state)
    assert y0.shape == x[:, 0].shape and state.shape == (s["b"], s["h"], s["p"], s["n"])


@EXAMPLES
@given(st.lists(st.integers(1, 3), max_size=2), st.integers(1, 6), st.integers(1, 3),
       st.booleans(), FLOATS)  # fmt: skip
def test_masked_attention_and_its_structured_forms_equal_the_dense_product(batch, n, p, vec, dtype):
    from attention_atlas.attention.sma import (
        Semiseparable,
        low_rank_masked_product,
        masked_attention,
    )

    U, V, Bm = randn(n, p, dtype=dtype), randn(n, p, dtype=dtype), randn(n, n, dtype=dtype)
    x = randn(n, dtype=dtype) if vec else randn(n, 2, dtype=dtype)
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    dense = (Bm * (U @ V.T)) @ x
    for y in (masked_attention(U @ V.T, Bm, x), low_rank_masked_product(Bm, U, V, x)):
        assert y.shape == x.shape and y.dtype == dtype
        torch.testing.assert_close(y, dense, atol=tol, rtol=tol)
    y = Semiseparable(U, V) @ x  # tril(U V^T) x
    assert y.shape == x.shape and y.dtype == dtype
    torch.testing.assert_close(y, torch.tril(U @ V.T) @ x, atol=tol, rtol=tol)
    L, xb = randn(*batch, n, n, dtype=dtype), randn(*batch, n, dtype=dtype)
    assert masked_attention(L, L, xb).shape == xb.shape


BAD_SSD = st.sampled_from(["rank", "length", "empty", "int", "mixed dtype", "list", "state"])


@EXAMPLES
@given(SSD_SIZES, FLOATS, BAD_SSD, st.sampled_from(SSD_METHODS))
def test_ssd_names_the_bad_argument_and_its_shape(s, dtype, kind, method):
    x, log_a, B, C = ssd_args({**s, "L": s["L"] + 1}, dtype)  # L >= 2: a shorter length exists
    kw: dict = {}
    if kind == "rank":
        x, name, shown = x[..., 0], "x", str(tuple(x[..., 0].shape))
    elif kind == "length":
        B, name, shown = B[:, :-1], "B", str(tuple(B[:, :-1].shape))
    elif kind == "empty":
        x, log_a, B, C = (t[:, :0] for t in (x, log_a, B, C))
        name, shown = "x", str(tuple(x.shape))
    elif kind == "int":
        log_a, name, shown = log_a.long(), "log_a", "int64"
    elif kind == "mixed dtype":
        C = C.double() if dtype == torch.float32 else C.float()
        name, shown = "C", str(C.dtype).replace("torch.", "")
    elif kind == "list":
        x, name, shown = x.tolist(), "x", "list"
    else:
        bad = torch.zeros(s["b"], s["h"], s["p"] + 1, s["n"], dtype=dtype)
        kw, name, shown = {"initial_state": bad}, "initial_state", str(tuple(bad.shape))
    with pytest.raises((TypeError, ValueError)) as err:
        ssd(x, log_a, B, C, method=method, chunk_size=s["chunk"], **kw)
    msg = str(err.value)
    assert re.search(rf"\b{name}\b", msg) and shown in msg, msg


MASKED_BAD = {  # kind -> the argument each function must name (None: not applicable)
    "mask size": ("mask", None),
    "x length": ("x", "x"),
    "empty": ("mask", "U"),
    "int": ("x", "x"),
    "mixed dtype": ("scores", "scores"),
    "V rank": (None, "V"),
}


@EXAMPLES
@given(st.integers(2, 6), st.integers(1, 3), FLOATS, st.sampled_from(sorted(MASKED_BAD)))
def test_masked_attention_api_names_the_bad_argument(n, p, dtype, kind):
    from attention_atlas.attention.sma import low_rank_masked_product, masked_attention

    U, V, Bm = randn(n, p, dtype=dtype), randn(n, p, dtype=dtype), randn(n, n, dtype=dtype)
    x = randn(n, dtype=dtype)
    L = U @ V.T
    if kind == "mask size":
        L = L[:-1, :-1]
    elif kind == "x length":
        x = x[:-1]
    elif kind == "empty":
        U, V, L, Bm, x = U[:0], V[:0], L[:0, :0], Bm[:0, :0], x[:0]
    elif kind == "int":
        x = x.long()
    elif kind == "mixed dtype":
        Bm = Bm.double() if dtype == torch.float32 else Bm.float()
    else:
        V = V[0]
    calls = (lambda: masked_attention(L, Bm, x), lambda: low_rank_masked_product(Bm, U, V, x))
    for call, name in zip(calls, MASKED_BAD[kind]):
        if name is None:
            continue
        with pytest.raises((TypeError, ValueError)) as err:
            call()
        assert re.search(rf"\b{name}\b", str(err.value)), str(err.value)

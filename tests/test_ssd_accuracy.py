"""Chapter 7's numerical experiments (experiments/ssd_accuracy.py): the seed's generator product
overflows in float32 where the log-space SSD does not, the three SSD methods agree, and the
float32 error is the one computed against an independent float64 reference."""

from __future__ import annotations

import math

import pytest
import torch

from attention_atlas.attention.sma import ssd
from attention_atlas.experiments.sma.accuracy import (
    accuracy_check,
    first_failure,
    float32_accuracy,
    float32_error,
    generator_overflow,
    method_agreement,
    rel_err,
)
from attention_atlas.experiments.sma.scaling import make_inputs


def test_rel_err_is_the_max_abs_error_relative_to_the_largest_reference_entry() -> None:
    b = torch.tensor([1.0, -4.0, 2.0], dtype=torch.float64)
    assert rel_err(b + torch.tensor([0.0, 0.0, 0.2], dtype=torch.float64), b) == pytest.approx(0.05)
    assert rel_err(b, b) == 0.0


def test_float32_generators_overflow_by_length_150_and_log_space_ssd_never_does() -> None:
    """Decays in [0.4, 0.6]: the generators u_t = a_0 ... a_{t-1} ~ 2^-t and v_t = 1 / u_t;
    v_t passes the float32 maximum (~2^128) after about 128 steps, and the product is no longer
    finite. Segment sums in log space stay finite at every length."""
    df = generator_overflow([25, 150], chunk_size=16)
    assert len(df) == 8 and set(df.columns) == {"T", "dtype", "method", "rel_err"}
    assert first_failure(df, "float32") == 150
    assert first_failure(df, "float64") is None
    log_space = df[df.method != "generators"]
    assert (log_space.rel_err < 1e-6).all()
    assert math.isnan(df[(df["T"] == 150) & (df.dtype == "float32") & (df.method == "generators")]
                      .rel_err.item())  # fmt: skip


def test_method_agreement_reports_chunked_and_recurrent_against_quadratic() -> None:
    df = method_agreement([1, 9, 40], chunk_size=8)
    assert list(df.L) == [1, 9, 40]
    assert (df[["chunked vs quadratic", "recurrent vs quadratic"]] < 1e-12).all().all()


def test_float32_error_is_measured_against_an_independent_float64_reference() -> None:
    inputs = make_inputs(100, heads=3, head_dim=4, state=5, decay="strong", dtype=torch.float64)
    x, log_a, B, C = inputs
    ref = ssd(x, log_a, B, C, method="recurrent")  # float64, all heads at once, by recurrence
    y32 = ssd(x.float(), log_a.float(), B.float(), C.float(), chunk_size=16)
    err = float32_error(inputs, chunk_size=16)
    assert err["rel_fro"] == pytest.approx(
        float((y32.double() - ref).norm() / ref.norm()), rel=1e-6
    )
    assert err["rel_max"] == pytest.approx(rel_err(y32.double(), ref), rel=1e-6)
    assert 1e-9 < err["rel_fro"] < 1e-5  # float32 rounding: present, and small


def test_accuracy_tables_name_each_decay_and_stay_within_1e4() -> None:
    rows = accuracy_check(
        64, decays=("strong", "weak"), chunk_size=16, heads=1, head_dim=4, state=4
    )
    assert [r["decay"] for r in rows] == ["strong", "weak"]
    assert rows[0]["log_a_min"] >= -4.0 and rows[1]["log_a_min"] >= -1e-3
    df = float32_accuracy(64, chunk_size=16)
    assert list(df.decay) == ["strong", "weak"] and (df["|y32 - y64| / |y64|"] < 1e-4).all()

"""One way for the tests to compare numbers against a bound, so that NaN always fails.

    max_abs = assert_close(got, want, atol=1e-5, rtol=1e-5, what="rms_norm f32")
    assert_within(figure, 3.0, "bf16 max |Δ|")
    worst([0.1, float("nan"), 0.2])   # nan: the worst of figures, NaN first

`delta > bound` is False for NaN, so a check written as "fail when past the bound" passes
NaN through; Python's `max()` and `min()` drop a NaN that is not first. Everything here
compares as "pass when within the bound" and looks for NaN explicitly.
"""

from __future__ import annotations

import math

import numpy as np


def as_float64(x) -> np.ndarray:
    """A torch tensor (any dtype, bf16 too), numpy or JAX array, or number as float64 numpy."""
    if hasattr(x, "detach"):  # torch: numpy has no bf16
        return x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def dtype_name(x) -> str:
    return str(getattr(x, "dtype", type(x).__name__)).removeprefix("torch.")


def assert_close(
    actual, expected, *, atol: float, rtol: float = 0.0, what: str = "values", dtype=False
) -> float:
    """Same shape (no broadcasting), no NaN on either side, infinities only where both have
    the same one, and |actual - expected| <= atol + rtol * |expected| elementwise. With
    `dtype`, the two dtypes must be the same too. Returns max |Δ| over the finite elements."""
    a, e = as_float64(actual), as_float64(expected)
    assert a.shape == e.shape, f"{what}: shape {a.shape}, expected {e.shape}"
    if dtype:
        got, want = dtype_name(actual), dtype_name(expected)
        assert got == want, f"{what}: dtype {got}, expected {want}"
    nans = int(np.isnan(a).sum()), int(np.isnan(e).sum())
    assert nans == (0, 0), f"{what}: NaN in {nans[0]} actual and {nans[1]} expected elements"
    infinite = np.isinf(a) | np.isinf(e)
    wrong_inf = infinite & (a != e)
    assert not wrong_inf.any(), f"{what}: {int(wrong_inf.sum())} infinities do not match"
    a, e = np.where(infinite, 0.0, a), np.where(infinite, 0.0, e)  # equal: compared above
    delta = np.abs(a - e)
    max_abs = float(delta.max()) if delta.size else 0.0
    within = delta <= atol + rtol * np.abs(e)
    assert within.all(), (
        f"{what}: max |Δ| = {max_abs:.3e}, {int((~within).sum())} of {within.size} elements "
        f"past atol={atol:g} rtol={rtol:g}"
    )
    return max_abs


def assert_within(value: float, bound: float, what: str = "value") -> float:
    """A figure at most `bound`; NaN fails."""
    value = float(value)
    assert not math.isnan(value), f"{what}: NaN"
    assert value <= bound, f"{what}: {value:.3g} > {bound:g}"
    return value


def worst(values) -> float:
    """The largest of some figures, NaN first (Python's max keeps a NaN only when it leads)."""
    values = [float(v) for v in values]
    assert values, "no figures to take the worst of"
    return next((v for v in values if math.isnan(v)), max(values))


def least(values) -> float:
    """The smallest of some figures (a cosine, an overlap), NaN first."""
    values = [float(v) for v in values]
    assert values, "no figures to take the least of"
    return next((v for v in values if math.isnan(v)), min(values))

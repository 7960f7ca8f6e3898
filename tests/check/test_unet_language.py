"""Language features the UNet (zoo/unet.linnet, issue 15) brought, on a toy source run by
the PyTorch interpreter, generated code and JAX against numpy:

- a param that may be absent (declared `if ...`) passed to an optional argument (`T?`) of
  a user function, which tests it with `if`;
- `unsqueeze(x, axis)`: a new axis of size 1;
- an input axis `k * D` (the UNet's latent, `4 * H`): D is bound to the size / k, and a
  size k does not divide is refused with the input's expected type."""

from __future__ import annotations

import numpy as np
import pytest

from linnet.check.elaborate import check_source
from linnet.errors import LinnetError
from linnet.syntax.parser import parse
from tests.numeric import assert_close

torch = pytest.importorskip("torch")

TOY = """model toy

config
  widths: int[3] = [4, 4, 8]

dim B, H, C, O

params
  blocks[2] as s
    w: f32[widths[s + 1], widths[s]]
    short: f32[widths[s + 1], widths[s]] if widths[s] != widths[s + 1]

fn step(p: group, x: f32[B, H, C], width: O, short: f32[O, C]?) -> f32[B, H, O]
  if short
    r = linear(x, short)
  else
    require O <= C
    r = x[:, :, : O]
  return linear(x, p.w) + r

entry forward(x: f32[B, 2 * H, widths[0]]) -> f32[B, H, 1, widths[2]]
  h = x[:, : H]
  for s, p in blocks
    h = step(p, h, widths[s + 1], p.short)
  return unsqueeze(h, 2)
"""


def reference(x: np.ndarray, w: dict) -> np.ndarray:
    h = x[:, : x.shape[1] // 2]
    for s in range(2):
        r = h @ w[f"blocks.{s}.short"].T if f"blocks.{s}.short" in w else h
        h = h @ w[f"blocks.{s}.w"].T + r
    return h[:, :, None]


@pytest.fixture
def toy(tmp_path):
    path = tmp_path / "toy.linnet"
    path.write_text(TOY)
    rng = np.random.default_rng(0)
    weights = {
        "blocks.0.w": rng.standard_normal((4, 4)),
        "blocks.1.w": rng.standard_normal((8, 4)),
        "blocks.1.short": rng.standard_normal((8, 4)),
    }
    return path, {k: v.astype(np.float32) for k, v in weights.items()}


def test_the_toy_checks_clean():
    assert [d.message for d in check_source(parse(TOY, "toy.linnet"))] == []


def test_a_maybe_absent_param_still_needs_an_optional_argument():
    bad = TOY.replace("short: f32[O, C]?)", "short: f32[O, C])")
    messages = [d.message for d in check_source(parse(bad, "toy.linnet"))]
    assert any("may be absent" in m for m in messages), messages


@pytest.mark.parametrize("mode", ["interpret", "generated"])
def test_torch_runs_the_toy(toy, mode):
    import linnet.torch as lt

    path, weights = toy
    model = lt.load_source(
        path, {}, {k: torch.from_numpy(v) for k, v in weights.items()}, mode=mode
    )
    x = np.random.default_rng(1).standard_normal((2, 6, 4)).astype(np.float32)
    got = model.run("forward", torch.from_numpy(x))
    assert tuple(got.shape) == (2, 3, 1, 8)  # H = 6 / 2
    assert_close(got, torch.from_numpy(reference(x, weights)), atol=1e-5, what=mode)


def test_jax_runs_the_toy(toy):
    import linnet.jax as lj

    path, weights = toy
    model = lj.load_source(path, {}, weights)
    x = np.random.default_rng(1).standard_normal((2, 6, 4)).astype(np.float32)
    got = torch.from_numpy(np.array(model.run("forward", x)))
    assert_close(got, torch.from_numpy(reference(x, weights)), atol=1e-5, what="jax")


def test_an_axis_k_does_not_divide_is_refused(toy):
    import linnet.torch as lt

    path, weights = toy
    model = lt.load_source(path, {}, {k: torch.from_numpy(v) for k, v in weights.items()})
    with pytest.raises(LinnetError, match=r"`x` must be f32\[B, 2 \* H"):
        model.run("forward", torch.zeros(2, 5, 4))


def test_the_absent_shortcut_takes_the_else_branch(toy):
    """widths [4, 8, 8]: the first block has the shortcut, the second none."""
    import linnet.torch as lt

    path, _ = toy
    rng = np.random.default_rng(2)
    weights = {
        "blocks.0.w": rng.standard_normal((8, 4)).astype(np.float32),
        "blocks.0.short": rng.standard_normal((8, 4)).astype(np.float32),
        "blocks.1.w": rng.standard_normal((8, 8)).astype(np.float32),
    }
    model = lt.load_source(
        path, {"widths": [4, 8, 8]}, {k: torch.from_numpy(v) for k, v in weights.items()}
    )
    x = rng.standard_normal((1, 4, 4)).astype(np.float32)
    got = model.run("forward", torch.from_numpy(x))
    assert_close(got, torch.from_numpy(reference(x, weights)), atol=1e-5, what="widths 4, 8, 8")

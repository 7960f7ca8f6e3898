"""Per-stage widths and counts (ResNet's shape): `int[N]` config lists, indexed and
nested param blocks, loops over constant-count blocks unrolled by the checker, and
`group` functions checked at each call. STAGES is a two-stage toy of zoo/resnet.linnet."""

from __future__ import annotations

import pytest

from linnet.check.elaborate import check_source
from linnet.errors import ConfigError
from linnet.source import Source
from linnet.syntax.parser import parse

STAGES = """model staged

config
  widths: int[3] = [4, 8, 16]
  depths: int[2] = [2, 3]
  require depths[0] >= 1 and depths[1] >= 1

dim B, C, O, T

params
  stages[2] as s
    first[1]
      w: f32[widths[s + 1], widths[s]]
    rest[depths[s] - 1]
      w: f32[widths[s + 1], widths[s + 1]]
  bias: f32[widths[2]] if widths[1] != widths[2]

fn layer(p: group, x: f32[B, T, C], width: O) -> f32[B, T, O]
  return linear(x, p.w)

entry forward(x: f32[B, T, widths[0]]) -> f32[B, T, widths[2]]
  for s, st in stages
    x = layer(st.first[0], x, widths[s + 1])
    for q in st.rest
      x = x + layer(q, x, widths[s + 1])
  return x
"""


def messages(text: str) -> list[str]:
    return [d.message for d in check_source(parse(text, "staged.linnet"))]


def test_stages_check_and_lower():
    src = Source.parse_text(STAGES, "staged.linnet")
    assert messages(STAGES) == []
    config = src.config({"depths": [1, 2]})
    names = list(src.params(config).shapes)
    assert names == ["stages.0.first.0.w", "stages.1.first.0.w", "stages.1.rest.0.w", "bias"]
    assert src.params(config).shapes["stages.1.rest.0.w"].shape[0].value == 16
    src.lower(config, "forward")


def test_a_condition_on_list_items_is_resolved_per_config():
    src = Source.parse_text(STAGES, "staged.linnet")
    assert "bias" not in src.params(src.config({"widths": [4, 8, 8]})).shapes


@pytest.mark.parametrize(
    "old, new, message",
    [
        # the loop over a constant-count block unrolls: stage 1's width is known
        (
            "x = layer(st.first[0], x, widths[s + 1])",
            "x = layer(st.first[0], x, widths[s])",
            "returns the wrong type",
        ),
        # a list item needs a known index: a symbolic loop index is not one
        (
            "x = x + layer(q, x, widths[s + 1])",
            "x = x + layer(q, x, widths[depths[0]])",
            "`widths` is indexed by a known int",
        ),
        ("widths: int[3] = [4, 8, 16]", "widths: int[3] = [4, 8]", "default of `widths`"),
        ("  stages[2] as s", "  stages[2]", "a block nested in `stages` needs its index"),
    ],
)
def test_mistakes(old, new, message):
    assert old in STAGES
    found = messages(STAGES.replace(old, new))
    assert any(message in m for m in found), found


def test_a_list_override_of_the_wrong_length_is_a_config_error():
    src = Source.parse_text(STAGES, "staged.linnet")
    with pytest.raises(ConfigError, match=r"`depths` must be a list of 2 ints"):
        src.config({"depths": [1, 2, 3]})

"""The checker's diagnostics, one source mistake at a time.

Every case is a targeted edit of BASE, a small valid decoder shaped like
zoo/llama.linnet. Each asserts the SourceError, the exact line and column of
the first diagnostic (and the token the caret starts on), a piece of its
message and, where it matters, the expected/received text and the hint.

The FIXED_BUGS cases were checker bugs this suite found; each states the right
behaviour and guards against the bug coming back.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from linnet.cli import main
from linnet.core.diagnostics import Diagnostic
from linnet.errors import ConfigError, LinnetError, SourceError
from linnet.source import Source
from linnet.syntax.parser import parse

ROOT = Path(__file__).resolve().parents[2]
PATH = "tiny.linnet"

# Line numbers below refer to this text: `model tiny` is line 1.
BASE = """model tiny

config
  vocab: int = 64
  dim: int = 32
  n_layers: int = 2
  n_heads: int = 4
  n_kv: int = n_heads
  head_dim: int = dim / n_heads
  ffn: int = 64
  eps: float = 1e-5
  max_positions: int = 128
  qk_norm: bool = false
  tied: bool = false
  act: dtype = f32
  require n_heads % n_kv == 0

dim B, S, P
dim H
dim N = max_positions

params
  embed: act[vocab, dim]
  layers[n_layers]
    attn_norm: act[dim]
    wq: act[n_heads * head_dim, dim]
    wk, wv: act[n_kv * head_dim, dim]
    q_norm, k_norm: act[head_dim] if qk_norm
    wo: act[dim, n_heads * head_dim]
    mlp_norm: act[dim]
    gate, up: act[ffn, dim]
    down: act[dim, ffn]
  final_norm: act[dim]
  lm_head: act[vocab, dim] = embed if tied

state kv: act[n_layers, 2, B, n_kv, N, head_dim]

fn rotate(x: act[B, H, S, head_dim], at: P) -> act[B, H, S, head_dim]
  return rope(x, at, theta=10000.0, positions=N)

fn attend(p: layers, x: act[B, S, dim], at: P,
          cache: act[2, B, n_kv, N, head_dim]? = none) -> act[B, S, dim]
  h = rms_norm(x, p.attn_norm, eps)
  q = split_heads(linear(h, p.wq), n_heads)
  k = split_heads(linear(h, p.wk), n_kv)
  v = split_heads(linear(h, p.wv), n_kv)
  if qk_norm
    q = rms_norm(q, p.q_norm, eps)
    k = rms_norm(k, p.k_norm, eps)
  q = rotate(q, at)
  k = rotate(k, at)
  if cache
    require at + S <= N
    cache[0, :, :, at : at + S] = k
    cache[1, :, :, at : at + S] = v
    keys = cache[0, :, :, 0 : at + S]
    values = cache[1, :, :, 0 : at + S]
    o = attention(q, keys, values, causal=true, q_offset=at)
  else
    o = attention(q, k, v, causal=true, q_offset=at)
  return linear(merge_heads(o), p.wo)

fn mlp(p: layers, x: act[B, S, dim]) -> act[B, S, dim]
  h = rms_norm(x, p.mlp_norm, eps)
  return linear(silu(linear(h, p.gate)) * linear(h, p.up), p.down)

fn logits(x: act[B, S, dim]) -> f32[B, S, vocab]
  return f32(linear(rms_norm(x, final_norm, eps), lm_head))

entry forward(tokens: i64[B, S]) -> f32[B, S, vocab]
  x = embed[tokens]
  for p in layers
    x = x + attend(p, x, 0)
    x = x + mlp(p, x)
  return logits(x)

entry decode(tokens: i64[B, S], at: P) updates kv -> f32[B, vocab]
  x = embed[tokens]
  for i, p in layers
    x = x + attend(p, x, at, kv[i])
    x = x + mlp(p, x)
  return logits(x[:, S - 1 : S])[:, 0]
"""

MLP_H = "  h = rms_norm(x, p.mlp_norm, eps)\n"  # line 64
FWD_MLP = "    x = x + mlp(p, x)\n  return logits(x)\n"  # lines 74-75 (forward)


def edit(old: str, new: str, text: str = BASE) -> str:
    """BASE with `old` (which must occur exactly once) replaced by `new`."""
    assert text.count(old) == 1, f"ambiguous or missing edit target: {old!r}"
    return text.replace(old, new)


def diagnostics_of(text: str) -> list[Diagnostic]:
    with pytest.raises(SourceError) as info:
        Source.parse_text(text, PATH)
    diags = info.value.diagnostics
    assert diags, "a SourceError must carry at least one diagnostic"
    return diags


@dataclass
class Case:
    old: str
    new: str
    line: int
    col: int
    token: str  # the source text the caret starts on
    message: str
    expected: str | None = None
    received: str | None = None
    hint: str | None = None


# fmt: off
CASES: dict[str, Case] = {
    # -- names and functions ------------------------------------------------------
    "unknown_name_did_you_mean": Case(MLP_H, "  h = rms_norm(x, p.mlp_norm, epz)\n", 64, 31, "epz",
        "unknown name `epz`", hint="did you mean eps"),
    "unknown_function": Case("silu(linear(h, p.gate))", "silo(linear(h, p.gate))", 65, 17, "silo(",
        "unknown function `silo`", hint="did you mean silu"),
    "missing_param_in_block": Case(MLP_H, "  h = rms_norm(x, p.nonexistent, eps)\n", 64, 19,
        "p.nonexistent", "block `layers` has no param `nonexistent`", hint="mlp_norm"),
    "optional_param_outside_if": Case("  q = rotate(q, at)\n",
        "  q = rms_norm(q, p.q_norm, eps)\n  q = rotate(q, at)\n", 50, 19, "p.q_norm",
        "may be absent (it is declared with `if`)", received="(may be none)",
        hint="inside an `if` on the same condition"),
    "assign_to_config_field": Case(MLP_H, "  dim = rms_norm(x, p.mlp_norm, eps)\n", 64, 3, "dim =",
        "cannot assign to `dim`", hint="another local name"),
    "call_entry_from_fn": Case("return f32(linear(rms_norm(x, final_norm, eps), lm_head))",
        "return forward(x)", 68, 10, "forward(x)",
        "`forward` is an entry point and cannot be called"),
    "recursion": Case(MLP_H, "  h = rms_norm(x, p.mlp_norm, eps) + mlp(p, x)\n", 63, 1, "fn mlp",
        "`mlp` calls itself; recursion is not supported"),
    "attribute_of_a_tensor": Case(MLP_H, "  h = rms_norm(x, x.mlp_norm, eps)\n", 64, 19,
        "x.mlp_norm", "only a param block has attributes", received="tensor act[B, S, dim]"),
    # -- shapes and dtypes ------------------------------------------------------------
    "linear_features_differ": Case("    down: act[dim, ffn]\n", "    down: act[dim, dim]\n", 65,
        10, "linear(silu", "shape mismatch in linear: input features differ",
        expected="x[..., dim] with w[out, in]", received="x act[B, S, ffn] and w act[dim, dim]"),
    "linear_wrong_weight": Case("return linear(merge_heads(o), p.wo)",
        "return linear(merge_heads(o), p.wq)", 61, 10, "linear(merge_heads",
        "shape mismatch in linear: input features differ",
        received="x act[B, S, head_dim * n_heads] and w act[head_dim * n_heads, dim]"),
    "matmul_inner_dims": Case(MLP_H, "  h = rms_norm(x @ x, p.mlp_norm, eps)\n", 64, 16, "x @ x",
        "shape mismatch in matmul: inner dims differ", received="act[B, S, dim] @ act[B, S, dim]"),
    "mixed_dtypes_without_cast": Case(FWD_MLP, "    x = x + f32(mlp(p, x))\n  return logits(x)\n",
        74, 9, "x + f32", "dtype mismatch", expected="operands of one dtype",
        received="act[B, S, dim] and f32[B, S, dim]", hint="no implicit promotion"),
    "float_literal_with_int_tensor": Case("  x = embed[tokens]\n  for p",
        "  x = embed[tokens * 0.5]\n  for p", 71, 22, "0.5",
        "a float number cannot join an integer tensor", hint="no implicit promotion"),
    "int_tensor_to_float_argument": Case("x = x + attend(p, x, 0)", "x = x + attend(p, tokens, 0)",
        73, 23, "tokens", "argument `x` of `attend` has the wrong type", expected="act[B, S, dim]",
        received="i64[B, S]"),
    "split_heads_not_a_multiple": Case("q = split_heads(linear(h, p.wq), n_heads)",
        "q = split_heads(linear(h, p.wq), 3)", 44, 7, "split_heads(",
        "features are not a multiple of the heads", expected="a multiple of 3",
        received="head_dim * n_heads"),
    "return_wrong_type": Case("  return logits(x)\n", "  return x\n", 75, 10, "x",
        "`forward` returns the wrong type", expected="f32[B, S, vocab]",
        received="act[B, S, dim]"),
    "return_wrong_shape": Case("fn mlp(p: layers, x: act[B, S, dim]) -> act[B, S, dim]",
        "fn mlp(p: layers, x: act[B, S, dim]) -> act[B, S, ffn]", 65, 10, "linear(silu",
        "`mlp` returns the wrong type", expected="act[B, S, ffn]", received="act[B, S, dim]"),
    "unknown_dtype": Case("fn logits(x: act[B, S, dim]) -> f32[B, S, vocab]",
        "fn logits(x: act[B, S, dim]) -> f23[B, S, vocab]", 67, 33, "f23[", "unknown dtype `f23`",
        expected="f32, f16, bf16", received="f23"),
    "alias_of_wrong_shape": Case("lm_head: act[vocab, dim] = embed if tied",
        "lm_head: act[dim, vocab] = embed if tied", 34, 30, "embed if",
        "`lm_head` aliases `embed` of another type", expected="act[dim, vocab]",
        received="act[vocab, dim]"),
    "loop_changes_type": Case(FWD_MLP, "    x = f32(x)\n  return logits(x)\n", 72, 3, "for p",
        "the loop changes the type of `x`", expected="act[B, S, dim]", received="f32[B, S, dim]"),
    "too_many_indices": Case("return logits(x[:, S - 1 : S])[:, 0]",
        "return logits(x[:, S - 1 : S, 0, 0])[:, 0]", 82, 36, "0])", "too many indices",
        expected="at most 3", received="4"),
    # -- calls ------------------------------------------------------------------------
    "too_many_arguments": Case(FWD_MLP, "    x = x + mlp(p, x, 0)\n  return logits(x)\n", 74, 13,
        "mlp(p, x, 0)", "`mlp` takes 2 arguments", expected="2", received="3"),
    "missing_argument": Case("  q = rotate(q, at)\n", "  q = rotate(q)\n", 50, 7, "rotate(q)",
        "`rotate` needs argument `at`"),
    "argument_given_twice": Case("o = attention(q, k, v, causal=true, q_offset=at)",
        "o = attention(q, k, v, causal=true, causal=false)", 60, 41, "causal=false",
        "keyword argument `causal` given twice"),
    "positional_after_keyword": Case("o = attention(q, k, v, causal=true, q_offset=at)",
        "o = attention(q, k, causal=true, v)", 60, 38, "v)",
        "positional argument after a keyword argument"),
    "block_argument_not_a_block": Case(FWD_MLP, "    x = x + mlp(x, x)\n  return logits(x)\n", 74,
        17, "x, x)", "argument `p` must be one `layers` block", received="tensor act[B, S, dim]"),
    "int_argument_given_a_tensor": Case("x = x + attend(p, x, 0)", "x = x + attend(p, x, x)", 73,
        26, "x)", "argument `at` must be an int", expected="int",
        received="tensor act[B, S, dim]"),
    # -- bounds and state -------------------------------------------------------------
    "slice_bound_cannot_be_proven": Case("    require at + S <= N\n", "", 53, 20, "at : at + S",
        "cannot prove the index is in bounds: P + S <= max_positions",
        hint="require P + S <= max_positions"),
    "state_index_cannot_be_proven": Case("attend(p, x, at, kv[i])", "attend(p, x, at, kv[i + 1])",
        80, 33, "i + 1", "cannot prove the index is in bounds"),
    "state_written_without_updates": Case("at: P) updates kv -> f32[B, vocab]",
        "at: P) -> f32[B, vocab]", 77, 1, "entry decode",
        "`decode` writes state `kv` without declaring it", hint="add `updates kv` before `->`"),
    "updates_declared_never_written": Case("attend(p, x, at, kv[i])", "attend(p, x, at)", 77, 1,
        "entry decode", "`decode` declares `updates kv` but never writes it"),
    "updates_unknown_state": Case("updates kv ->", "updates kv, cache2 ->", 77, 1, "entry decode",
        "`decode` updates `cache2`, which is not declared state"),
    "write_into_a_tensor": Case("    cache[0, :, :, at : at + S] = k",
        "    h[0, :, :, at : at + S] = k", 54, 5, "h[", "only state can be written in place",
        received="tensor act[B, S, dim]"),
    "state_write_wrong_shape": Case("    cache[0, :, :, at : at + S] = k",
        "    cache[0, :, :, at : at + S] = q", 54, 35, "q",
        "the value does not fit the state slice", expected="act[B, n_kv, S, head_dim]",
        received="act[B, n_heads, S, head_dim]"),
    # -- statements -------------------------------------------------------------------
    "for_over_a_tensor": Case("  for p in layers\n    x = x + attend(p, x, 0)",
        "  for p in embed\n    x = x + attend(p, x, 0)", 72, 12, "embed",
        "`for` runs over a param block", expected="a block such as `layers`",
        received="tensor act[vocab, dim]"),
    "for_over_an_int": Case("  for p in layers\n    x = x + attend(p, x, 0)",
        "  for p in n_layers\n    x = x + attend(p, x, 0)", 72, 12, "n_layers",
        "`for` runs over a param block", received="int n_layers"),
    "if_on_an_int": Case("  if qk_norm\n    q = rms", "  if ffn\n    q = rms", 47, 6, "ffn",
        "a condition must be a bool or an optional value", expected="bool", received="int ffn"),
    "unreachable_after_return": Case("  return logits(x)\n", "  return logits(x)\n  x = x\n", 76,
        3, "x = x", "unreachable code after `return`"),
    "missing_return": Case("  return logits(x)\n", "", 70, 1, "entry forward",
        "`forward` does not end with `return`"),
    "unpack_count": Case(MLP_H, "  h, g = rms_norm(x, p.mlp_norm, eps)\n", 64, 3, "h, g",
        "wrong number of values to unpack", expected="2", received="1"),
    "expression_statement": Case(MLP_H, "  rms_norm(x, p.mlp_norm, eps)\n", 64, 31, "",
        "expected `=`", received="end of line", hint="no effect"),
    "assign_to_attribute": Case(MLP_H, "  p.h = rms_norm(x, p.mlp_norm, eps)\n", 64, 3, "p.h",
        "can only assign to a name or to a slice of state"),
    # -- declarations -----------------------------------------------------------------
    "duplicate_config_field": Case("  ffn: int = 64\n", "  ffn: int = 64\n  ffn: int = 32\n", 11,
        3, "ffn: int = 32", "config field `ffn` is declared twice"),
    "config_default_wrong_type": Case("ffn: int = 64", "ffn: int = 6.4", 10, 14, "6.4",
        "default of `ffn` has the wrong type", expected="int", received="float"),
    "config_field_unsupported_type": Case("ffn: int = 64", "ffn: act = 64", 10, 8, "act",
        "config field `ffn` has an unsupported type", received="act"),
    "inexact_constant_division": Case("ffn: int = 64", "ffn: int = 64 / 3", 10, 14, "64 / 3",
        "division of integers is not exact", hint="use //"),
    "duplicate_param": Case("    mlp_norm: act[dim]\n",
        "    mlp_norm: act[dim]\n    mlp_norm: act[dim]\n", 31, 5, "mlp_norm",
        "`mlp_norm` is already declared"),
    "duplicate_dim": Case("dim H\n", "dim H, B\n", 19, 8, "B", "`B` is already declared"),
    "two_dims_one_value": Case("dim N = max_positions", "dim N, M = max_positions", 20, 8, "M",
        "only one dim can be given a value per line"),
    "alias_without_condition": Case("lm_head: act[vocab, dim] = embed if tied",
        "lm_head: act[vocab, dim] = embed", 34, 35, "", "an aliased param needs a condition"),
    "alias_of_a_non_param": Case("lm_head: act[vocab, dim] = embed if tied",
        "lm_head: act[vocab, dim] = dim if tied", 34, 30, "dim if",
        "a param can only alias another param"),
    "block_count_not_an_int": Case("  layers[n_layers]\n", "  layers[eps]\n", 24, 10, "eps",
        "a block count must be an integer expression", expected="int", received="float"),
    "unknown_argument_type": Case("fn mlp(p: layers,", "fn mlp(p: layerz,", 63, 11, "layerz",
        "unknown type `layerz`"),
    # -- syntax -----------------------------------------------------------------------
    "unindent_mismatch": Case("    k = rms_norm(k, p.k_norm, eps)",
        "   k = rms_norm(k, p.k_norm, eps)", 49, 4, "k =",
        "unindent does not match any outer indentation level"),
    "tab_indentation": Case(MLP_H, "\th = rms_norm(x, p.mlp_norm, eps)\n", 64, 1, "\th",
        "tab in indentation", hint="spaces only"),
    "tab_after_spaces": Case(MLP_H, "  \th = rms_norm(x, p.mlp_norm, eps)\n", 64, 3, "\th",
        "tab in indentation"),
    "missing_arrow": Case("x: act[B, S, dim]) -> act[B, S, dim]",
        "x: act[B, S, dim]) act[B, S, dim]", 63, 38, "act[",
        "expected `->` before the return type", received="`act`"),
    "missing_paren_in_header": Case("x: act[B, S, dim]) -> act[B, S, dim]",
        "x: act[B, S, dim] -> act[B, S, dim]", 63, 37, "->", "expected `,` between arguments",
        received="`->`"),
    "missing_bracket_in_type": Case("x: act[B, S, dim]) -> act[B, S, dim]",
        "x: act[B, S, dim) -> act[B, S, dim]", 63, 35, ")", "expected `]` to close the shape",
        received="`)`"),
    "stray_closing_paren": Case(MLP_H, "  h = rms_norm(x, p.mlp_norm, eps))\n", 64, 35, ")",
        "expected end of line", received="`)`"),
    "unexpected_character": Case(MLP_H, "  h = rms_norm(x, p.mlp_norm, eps) $\n", 64, 36, "$",
        "unexpected character '$'"),
    "missing_model_line": Case("model tiny\n", "", 2, 1, "config",
        "expected `model` at the start of a source"),
    "call_of_a_non_name": Case(MLP_H, "  h = p.f(x)\n", 64, 10, "(x)",
        "only named functions can be called"),
    # -- encoders: padding masks and pooling --------------------------------------
    "attention_mask_of_the_wrong_shape": Case(
        "    o = attention(q, k, v, causal=true, q_offset=at)\n",
        "    o = attention(q, k, v, causal=true, q_offset=at, mask=x)\n", 60, 9, "attention(",
        "attention mask must be [batch, keys] of integers or bool",
        expected="i64, i32 or bool [B, S]", received="act[B, S, dim]",
        hint="1 attends, 0 is padding"),
    "mean_pool_mask_of_the_wrong_shape": Case(MLP_H, "  h = mean_pool(x, x)\n", 64, 7,
        "mean_pool(", "mean_pool needs x [B, S, D] and mask [B, S]",
        received="act[B, S, dim], act[B, S, dim]"),
}
# fmt: on


def check_case(case: Case) -> Diagnostic:
    text = edit(case.old, case.new)
    d = diagnostics_of(text)[0]
    lines = text.split("\n")
    assert (d.path, d.line, d.col) == (PATH, case.line, case.col), d.render()
    assert d.source_line == lines[case.line - 1]
    assert d.source_line[case.col - 1 :].startswith(case.token), d.render()
    assert d.end_col >= d.col
    assert case.message in d.message, d.render()
    for field in ("expected", "received", "hint"):
        want = getattr(case, field)
        if want is not None:
            assert getattr(d, field) is not None and want in getattr(d, field), d.render()
    rendered = d.render()
    assert rendered.startswith(f"{PATH}:{case.line}:{case.col}: error: ")
    caret = rendered.split("\n")[2]
    assert caret.index("^") - caret.index("|") - 2 == case.col - 1
    return d


def test_base_source_is_valid():
    src = Source.parse_text(BASE, PATH)
    assert src.entries == ["forward", "decode"]
    config = src.config()
    assert config["head_dim"] == 8
    for entry in src.entries:
        src.lower(config, entry)


@pytest.mark.parametrize("name", list(CASES))
def test_mistake(name):
    check_case(CASES[name])


def test_unknown_keyword_argument_message():
    """Message and hint only: the column is a known bug (see FIXED_BUGS)."""
    text = edit(
        "o = attention(q, k, v, causal=true, q_offset=at)",
        "o = attention(q, k, v, causal=true, offset=at)",
    )
    d = diagnostics_of(text)[0]
    assert d.line == 60
    assert "`attention` has no argument `offset`" in d.message
    assert "q_offset" in d.hint


def test_there_are_enough_cases():
    assert len(CASES) >= 20


# -- config resolution ------------------------------------------------------------------


def test_config_require_violated():
    src = Source.parse_text(BASE, PATH)
    with pytest.raises(ConfigError) as info:
        src.config({"n_heads": 8, "n_kv": 3})
    message = str(info.value)
    assert f"{PATH}:16:" in message
    assert "require n_heads % n_kv == 0" in message
    assert "n_heads = 8" in message and "n_kv = 3" in message


def test_config_default_inexact_division():
    src = Source.parse_text(BASE, PATH)
    with pytest.raises(ConfigError) as info:
        src.config({"dim": 10, "n_heads": 3})
    message = str(info.value)
    assert f"{PATH}:9:" in message
    assert "10 / 3 is not exact" in message
    assert "head_dim: int = dim / n_heads" in message


@pytest.mark.parametrize(
    "overrides, text",
    [
        ({"bogus": 1}, "unknown config field"),
        ({"dim": -1}, "must not be negative"),
        ({"dim": 2.0}, "`dim` must be int"),
        ({"tied": 1}, "`tied` must be bool"),
        ({"act": "f64"}, "`act` must be one of"),
    ],
)
def test_config_bad_override(overrides, text):
    src = Source.parse_text(BASE, PATH)
    with pytest.raises(ConfigError, match=text):
        src.config(overrides)


def test_zoo_config_require_violated():
    src = Source.load(ROOT / "zoo" / "llama.linnet")
    with pytest.raises(ConfigError, match="require n_heads % n_kv == 0"):
        src.config({"n_heads": 32, "n_kv": 5})


# -- regressions: checker bugs found by this suite, now fixed ---------------------------------
# Each states the right behaviour; the text says what used to happen.

# fmt: off
FIXED_BUGS = {
    "missing_close_paren": (
        Case(MLP_H, "  h = rms_norm(x, p.mlp_norm, eps\n", 64, 15, "(x, p.mlp_norm", "("),
        "an unclosed `(` is reported at the first token of the next line (65:3, 'expected `,` "
        "between arguments'), not at the `(` that is never closed",
    ),
    "missing_close_bracket": (
        Case("    keys = cache[0, :, :, 0 : at + S]\n", "    keys = cache[0, :, :, 0 : at + S\n",
             56, 17, "[0, :", "["),
        "an unclosed `[` is reported at `values` on the next line (57:5, 'expected `]` to "
        "close the index'), not at the `[` that is never closed",
    ),
    "missing_close_paren_at_end_of_file": (
        Case("  return logits(x[:, S - 1 : S])[:, 0]\n", "  return logits(x[:, S - 1 : S][:, 0]\n",
             82, 16, "(x[:", "("),
        "an unclosed `(` on the last line is reported at 83:1 (an empty line past the source, "
        "'received: end of block'), not at the `(` on line 82",
    ),
    "unknown_keyword_argument": (
        Case("o = attention(q, k, v, causal=true, q_offset=at)",
             "o = attention(q, k, v, causal=true, offset=at)", 60, 41, "offset=",
             "`attention` has no argument `offset`", hint="q_offset"),
        "the caret is on the value `at` (60:48), not on the unknown keyword `offset` (the "
        "parser keeps no span for keyword names)",
    ),
    "constant_require_false_in_body": (
        Case(MLP_H, "  require 1 <= 0\n" + MLP_H, 64, 11, "1 <= 0", "1 <= 0"),
        "reported at 55:5 (`cache[1, ...] = v` in `attend`, an unrelated line): require_le "
        "uses the stale self._span left by the last state write",
    ),
    "condition_kind_in_message": (
        Case("act[head_dim] if qk_norm", "act[head_dim] if ffn", 28, 38, "ffn", "must be bool",
             expected="bool"),
        "expect_kind spells the kind as `kind.__name__[:-3].lower()`, so BVal reads 'b': 'a "
        "condition must be b', expected: b",
    ),
    "block_member_used_without_block": (
        Case(MLP_H, "  h = rms_norm(x, mlp_norm, eps)\n", 64, 19, "mlp_norm",
             "unknown name `mlp_norm`"),
        "no error: members of `layers[...]` are declared as top-level names (the recursive "
        "_declare_params call passes prefix ''), so `mlp_norm` without `p.` checks, and "
        "lowering then makes a top-level param `mlp_norm` that Source.params() does not list",
    ),
    "duplicate_function": (
        Case("fn mlp(p: layers, x: act[B, S, dim])", "fn rotate(p: layers, x: act[B, S, dim])", 63,
             1, "fn rotate", "`rotate` is already declared"),
        "no duplicate check on fn names: the second `rotate` silently replaces the first, "
        "giving '50:14 argument `p` must be one `layers` block' and 'unknown function `mlp`' "
        "instead",
    ),
    "duplicate_entry": (
        Case("entry decode(tokens", "entry forward(tokens", 77, 1, "entry forward",
             "`forward` is already declared"),
        "no error at all: two entries named `forward` check clean, Source.entries lists it "
        "twice and lowering takes the second",
    ),
    "symbolic_dim_as_tensor_operand": (
        Case("silu(linear(h, p.gate)) * linear(h, p.up)", "silu(linear(h, p.gate)) * S", 65, 43,
             "S", ""),
        "`S * x` (a symbolic dim as a number next to a tensor) checks clean; lowering then "
        "raises a bare DiagnosticError 'a number here must be known' out of Source.lower",
    ),
    "return_inside_for": (
        Case("  return logits(x[:, S - 1 : S])[:, 0]\n",
             "    return logits(x[:, S - 1 : S])[:, 0]\n", 82, 5, "return", ""),
        "a `return` at the end of a `for` body checks clean (the loop body is checked once); "
        "lowering unrolls it and raises a bare DiagnosticError 'unreachable code after "
        "`return`' out of Source.lower",
    ),
    "softmax_axis_out_of_range": (
        Case(MLP_H, "  h = softmax(x, 5)\n" + MLP_H, 64, 7, "softmax(",
             "axis 5 out of range for rank 3"),
        "no error: the softmax op rule (_float_unary) never checks its axis, so softmax(x, 5) "
        "on a rank-3 x checks and lowers clean, and ir.passes.decompose then raises a bare "
        "OpTypeError (not a LinnetError)",
    ),
}
# fmt: on


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, id=n) for n in FIXED_BUGS],
)
def test_mistake_fixed_bug(name):
    check_case(FIXED_BUGS[name][0])


@pytest.mark.parametrize("name", ["symbolic_dim_as_tensor_operand", "return_inside_for"])
def test_lowering_raises_only_linnet_errors(name):
    case = FIXED_BUGS[name][0]
    src = Source(parse(edit(case.old, case.new), PATH))  # skips the checker on purpose
    with pytest.raises(LinnetError):
        for entry in src.entries:
            src.lower(src.config(), entry)


def test_unknown_return_dtype_reported_once():
    text = edit(
        "fn logits(x: act[B, S, dim]) -> f32[B, S, vocab]",
        "fn logits(x: act[B, S, dim]) -> f23[B, S, vocab]",
    )
    diags = diagnostics_of(text)
    assert [(d.line, d.col) for d in diags] == [(67, 33)]


def test_unknown_argument_type_reported_once():
    diags = diagnostics_of(edit("fn mlp(p: layers,", "fn mlp(p: layerz,"))
    assert [(d.line, d.col) for d in diags] == [(63, 11)]


CASCADE_EDITS = [
    ("q = split_heads(linear(h, p.wq), n_heads)", "q = split_heads(linear(h, p.wq), 3)"),
    ("  q = rotate(q, at)\n", "  q = rotate(q)\n"),
    ("  q = rotate(q, at)\n", "  q = rms_norm(q, p.q_norm, eps)\n  q = rotate(q, at)\n"),
]


@pytest.mark.parametrize("old, new", CASCADE_EDITS)
def test_no_cascade_into_updates_check(old, new):
    """A broken `attend` must not also make `decode` 'never write' kv."""
    diags = diagnostics_of(edit(old, new))
    assert len(diags) == 1, "\n\n".join(d.render() for d in diags)


DECODE_CALL = "    x = x + attend(p, x, at, kv[i])\n"
DECODE_CALL_IN_IF = (
    "    if qk_norm\n"
    "      x = x + attend(p, x, at, kv[i])\n"
    "    else\n"
    "      x = x + attend(p, x, at, kv[i])\n"
)


def test_decode_calling_inside_if_is_valid():
    Source.parse_text(edit(DECODE_CALL, DECODE_CALL_IN_IF), PATH)


@pytest.mark.parametrize("old, new", CASCADE_EDITS)
def test_no_cascade_into_updates_check_through_if(old, new):
    diags = diagnostics_of(edit(DECODE_CALL, DECODE_CALL_IN_IF, edit(old, new)))
    assert len(diags) == 1, "\n\n".join(d.render() for d in diags)


def _source_error_or_clean(text: str) -> None:
    try:
        Source.parse_text(text, PATH)
    except SourceError as err:
        assert err.diagnostics


def test_dtype_comparison_does_not_crash():
    _source_error_or_clean(
        edit("  require n_heads % n_kv == 0", "  require n_heads % n_kv == 0\n  require act == f32")
    )


@pytest.mark.parametrize("cond", ["none == none", "layers == layers"])
def test_compare_of_non_values_is_a_diagnostic(cond):
    diags = diagnostics_of(
        edit("    require at + S <= N\n", f"    require at + S <= N\n    require {cond}\n")
    )
    assert (diags[0].line, diags[0].col) == (54, 13)


def test_softmax_default_axis():
    Source.parse_text(edit("silu(linear(h, p.gate))", "softmax(linear(h, p.gate))"), PATH)


def test_rope_of_low_rank_tensor():
    diags = diagnostics_of(
        edit(
            "fn rotate(x: act[B, H, S, head_dim], at: P) -> act[B, H, S, head_dim]",
            "fn rotate(x: act[B, H], at: P) -> act[B, H, S, head_dim]",
        )
    )
    assert (diags[0].line, diags[0].col) == (39, 10)
    assert "rope needs [B, H, S, D]" in diags[0].message


@pytest.mark.parametrize(
    "call",
    [
        "linear(x[0, 0, 0], p.gate)",
        "rms_norm(x[0, 0, 0], p.mlp_norm, eps)",
        "layer_norm(x[0, 0, 0], p.mlp_norm, p.mlp_norm, eps)",
    ],
)
def test_rank_0_input_to_a_norm_or_linear(call):
    diags = diagnostics_of(edit(MLP_H, f"  require dim >= 1\n  h = {call}\n" + MLP_H))
    assert (diags[0].line, diags[0].col) == (65, 7)


@pytest.mark.parametrize("source", ["base", "llama"])
def test_config_zero_divisor_override(source):
    src = (
        Source.parse_text(BASE, PATH)
        if source == "base"
        else Source.load(ROOT / "zoo" / "llama.linnet")
    )
    with pytest.raises(ConfigError):
        src.config({"n_kv": 0})


@pytest.mark.parametrize(
    "old, new",
    [
        ("eps: float = 1e-5", "eps: float = 1.0 / 0"),
        ("ffn: int = 64", "ffn: int = dim // 0"),
        ("ffn: int = 64", "ffn: int = dim % 0"),
    ],
)
def test_config_default_divides_by_zero(old, new):
    text = edit(old, new)
    try:
        src = Source.parse_text(text, PATH)
    except SourceError:
        return  # rejected at check time: fine
    with pytest.raises(ConfigError):
        src.config()


# -- the CLI ---------------------------------------------------------------------------------


def _run_check(*paths):
    return CliRunner().invoke(main, ["check", *map(str, paths)])


def test_cli_check_zoo_is_clean():
    result = _run_check(ROOT / "zoo")
    assert result.exit_code == 0, result.output
    assert "no errors" in result.stdout


def test_cli_check_folder_with_a_broken_file(tmp_path):
    (tmp_path / "good.linnet").write_text(BASE)
    bad = tmp_path / "sub" / "bad.linnet"
    bad.parent.mkdir()
    bad.write_text(edit(MLP_H, "  h = rms_norm(x, p.mlp_norm, epz)\n"))
    result = _run_check(tmp_path)
    assert result.exit_code == 1
    err = result.stderr
    assert f"{bad}:64:31: error: unknown name `epz`" in err
    assert "   64 |   h = rms_norm(x, p.mlp_norm, epz)" in err
    assert "      |                               ^^^" in err
    assert "hint: did you mean eps?" in err
    assert "1 error in 2 sources" in err
    assert "Traceback" not in result.output


def test_cli_check_reports_every_broken_file(tmp_path):
    one, two = tmp_path / "one.linnet", tmp_path / "two.linnet"
    one.write_text(edit("  ffn: int = 64\n", "  ffn: int = 64\n  ffn: int = 32\n"))
    two.write_text(edit(MLP_H, "\th = rms_norm(x, p.mlp_norm, eps)\n"))
    result = _run_check(one, two)
    assert result.exit_code == 1
    assert f"{one}:11:3: error: config field `ffn` is declared twice" in result.stderr
    assert f"{two}:64:1: error: tab in indentation" in result.stderr
    assert "2 errors in 2 sources" in result.stderr


def test_cli_check_missing_path_exits_2(tmp_path):
    result = _run_check(tmp_path / "nope.linnet")
    assert result.exit_code == 2
    assert "no such file or folder" in result.stderr


def test_cli_check_empty_folder_exits_2(tmp_path):
    result = _run_check(tmp_path)
    assert result.exit_code == 2
    assert "no .linnet sources" in result.stderr


def test_cli_check_subprocess(tmp_path):
    """The installed entry point, end to end: exit codes and the caret line on stderr."""
    bad = tmp_path / "bad.linnet"
    bad.write_text(edit("    down: act[dim, ffn]\n", "    down: act[dim, dim]\n"))
    cmd = [sys.executable, "-m", "linnet.cli", "check"]
    ok = subprocess.run(cmd + [str(ROOT / "zoo")], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    res = subprocess.run(cmd + [str(tmp_path)], capture_output=True, text=True)
    assert res.returncode == 1
    assert f"{bad}:65:10: error: shape mismatch in linear" in res.stderr
    assert "   65 |   return linear(" in res.stderr
    assert "Traceback" not in res.stderr
    missing = subprocess.run(cmd + [str(tmp_path / "nope")], capture_output=True, text=True)
    assert missing.returncode == 2


# -- per-repetition params (`layers[n] as i`) and conditions on the loop index ---------------
# ModernBERT's first layer has no attention norm, and layers alternate global and local
# attention by index (`i % every == 0`). Line numbers refer to this text.
INDEXED = """model indexed

config
  dim: int = 8
  n_layers: int = 3
  every: int = 2
  norm_bias: bool = false
  act: dtype = f32

dim B, S

params
  layers[n_layers] as i
    norm_w: act[dim] if i > 0
    norm_b: act[dim] if norm_bias and i > 0
    w: act[dim, dim]

entry forward(x: act[B, S, dim]) -> f32[B, S, dim]
  for i, p in layers
    h = x
    if i > 0
      h = layer_norm(x, p.norm_w, p.norm_b, 1e-5)
    if i % every == 0
      x = x + linear(h, p.w)
    else
      x = x - linear(h, p.w)
  return f32(x)
"""


def test_block_index_conditions_select_params_per_repetition():
    src = Source.parse_text(INDEXED, PATH)
    assert sorted(src.params(src.config()).shapes) == [
        "layers.0.w", "layers.1.norm_w", "layers.1.w", "layers.2.norm_w", "layers.2.w",
    ]  # fmt: skip
    with_bias = src.params(src.config({"norm_bias": True})).shapes
    assert "layers.0.norm_b" not in with_bias and "layers.2.norm_b" in with_bias


def test_loop_index_conditions_resolve_per_layer():
    """Layer 0 (i % 2 == 0) adds, layer 1 subtracts, layer 2 adds: the ops in order."""
    src = Source.parse_text(INDEXED, PATH)
    graph = src.lower(src.config(), "forward")
    combine = [n.op for n in graph.nodes if n.op in ("add", "sub")]
    assert combine == ["add", "sub", "add"]
    assert [n.op for n in graph.nodes].count("layer_norm") == 2  # not on layer 0


@pytest.mark.parametrize(
    "old, new, line, col, message",
    [
        ("    if i > 0\n      h = layer_norm", "    if true\n      h = layer_norm", 22, 25,
         "this param may be absent"),
        ("  for i, p in layers\n", "  for j, p in layers\n    i = 1\n", 23, 25,
         "this param may be absent"),  # `if i > 0` on another `i`: no narrowing
        ("  for i, p in layers\n", "  for j, p in layers\n    i = j + 1\n", 23, 25,
         "this param may be absent"),  # the same text, an unknown `i` other than the index
        ("  layers[n_layers] as i\n", "  layers[n_layers] as\n", 13, 22,
         "the block's index name"),
    ],
)  # fmt: skip
def test_block_index_mistakes(old, new, line, col, message):
    diags = diagnostics_of(edit(old, new, INDEXED))
    d = diags[0]
    assert message in d.render(), d.render()
    assert d.render().startswith(f"{PATH}:{line}:{col}: error: "), d.render()


def test_block_index_conditions_narrow_in_group_functions_per_call():
    """A `group` function is checked per call: `if i > 0` there narrows `q.norm_w` when
    the caller passes its loop index as `i`, and not when it passes another value."""
    pre = (
        "fn pre(q: group, i: int, x: act[B, S, dim]) -> act[B, S, dim]\n"
        "  h = x\n"
        "  if i > 0\n"
        "    h = layer_norm(x, q.norm_w, q.norm_b, 1e-5)\n"
        "  return h\n\n"
    )
    body = "    h = x\n    if i > 0\n      h = layer_norm(x, p.norm_w, p.norm_b, 1e-5)\n"
    text = edit("entry forward", pre + "entry forward", INDEXED)
    src = Source.parse_text(edit(body, "    h = pre(p, i, x)\n", text), PATH)
    graph = src.lower(src.config(), "forward")
    assert [n.op for n in graph.nodes].count("layer_norm") == 2  # not on layer 0
    diags = diagnostics_of(edit(body, "    h = pre(p, i + 1, x)\n", text))
    assert "this param may be absent" in diags[0].render(), diags[0].render()


def test_layer_norm_without_bias_is_f_layer_norm():
    import torch

    from linnet.backends.torch.interp import Interpreter

    src = Source.parse_text(edit("norm_bias and i > 0", "norm_bias", INDEXED), PATH)
    graph = src.lower(src.config(), "forward")
    weights = {k: torch.randn(t.shape[0].value, *[d.value for d in t.shape[1:]])
               for k, t in src.params(src.config()).shapes.items()}  # fmt: skip
    x = torch.randn(2, 5, 8)
    got = Interpreter(graph, weights).run([x])[0]
    want = x
    for i in range(3):
        p = {k.split(".")[-1]: w for k, w in weights.items() if k.startswith(f"layers.{i}.")}
        h = torch.nn.functional.layer_norm(want, (8,), p["norm_w"], None, 1e-5) if i else want
        want = want + h @ p["w"].T if i % 2 == 0 else want - h @ p["w"].T
    assert (got - want).abs().max().item() <= 1e-5

"""Whole-model Core-IR graphs of the zoo sources at tiny configs.

Every entry of every config variant lowers, verifies before and after
`decompose`, and decomposes to primitives only. `print_graph` of the lowered
(not decomposed) graphs of one llama and one gpt2 config are snapshot-tested
against `tests/golden/*.txt`; regenerate them with `python scripts/update_golden.py`
when a change to the lowering is intended. The verifier must catch corrupted
graphs, and the runtime guards must stop positions past `max_positions`.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import pytest
from linnet.zoo import source_path

from linnet.errors import LinnetError, RuntimeGuardError
from linnet.ir.graph import Value
from linnet.ir.ops import OPS
from linnet.ir.passes import VerifyError, decompose, dedupe_guards, print_graph, verify
from linnet.ir.types import OpTypeError
from linnet.source import Source
from tests.numeric import assert_close

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "golden"

LLAMA_TINY = dict(
    vocab=64, dim=32, n_layers=2, n_heads=4, n_kv=2, ffn=48, max_positions=32, act="f32"
)
GPT2_TINY = dict(vocab=64, dim=32, n_layers=2, n_heads=4, n_positions=32)

VARIANTS = {
    # name: (zoo source, config overrides)
    "llama": ("llama", LLAMA_TINY),  # llama3 rope scaling is the source's default
    "llama-default-rope": ("llama", dict(LLAMA_TINY, rope_scaling="default", rope_theta=10000.0)),
    "llama-mha": ("llama", dict(LLAMA_TINY, n_kv=4)),
    "llama-gqa4": ("llama", dict(LLAMA_TINY, n_kv=1)),
    "llama-qk-norm": ("llama", dict(LLAMA_TINY, qk_norm=True)),
    "llama-qkv-bias": ("llama", dict(LLAMA_TINY, qkv_bias=True)),
    "llama-attn-mlp-bias": ("llama", dict(LLAMA_TINY, attn_bias=True, mlp_bias=True)),
    "llama-tied": ("llama", dict(LLAMA_TINY, tied=True)),
    "llama-window": ("llama", dict(LLAMA_TINY, window=8)),
    "llama-bf16": ("llama", dict(LLAMA_TINY, act="bf16")),
    "gpt2": ("gpt2", GPT2_TINY),
    "gpt2-erf-gelu": ("gpt2", dict(GPT2_TINY, gelu_approx="none")),
    "gpt2-short-cache": ("gpt2", dict(GPT2_TINY, max_positions=16)),
}
ENTRIES = ("forward", "decode")

# the snapshot-tested graphs: tests/golden/<variant>_<entry>.txt
GOLDEN = [(variant, entry) for variant in ("llama", "gpt2") for entry in ENTRIES]

_SOURCES: dict[str, Source] = {}


def load(name: str) -> Source:
    if name not in _SOURCES:
        _SOURCES[name] = Source.load(source_path(name))
    return _SOURCES[name]


def lower(variant: str, entry: str):
    name, overrides = VARIANTS[variant]
    src = load(name)
    return src.lower(src.config(overrides), entry)


def golden_path(variant: str, entry: str) -> Path:
    return GOLDEN_DIR / f"{variant}_{entry}.txt"


def golden_text(variant: str, entry: str) -> str:
    return print_graph(lower(variant, entry)) + "\n"


# -- lowering, verify, decompose ---------------------------------------------------------------
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_lower_verify_decompose(variant, entry):
    graph = lower(variant, entry)
    verify(graph)
    assert {n.op for n in graph.nodes} & {n for n, d in OPS.items() if d.kind == "library"}, (
        "the lowered graph should keep library ops (attention, norms…) by name"
    )
    deduped = dedupe_guards(graph)
    verify(deduped)
    for g in (graph, deduped):
        flat = decompose(g)
        verify(flat)
        library = sorted({n.op for n in flat.nodes if OPS[n.op].kind != "primitive"})
        assert not library, f"{variant}/{entry}: decomposed graph still has {library}"
        assert [v.type for v in flat.outputs] == [v.type for v in graph.outputs]
        assert set(flat.state_outputs) == set(graph.state_outputs)


def test_entries_have_the_declared_signatures():
    for variant in ("llama", "gpt2"):
        fwd, dec = lower(variant, "forward"), lower(variant, "decode")
        assert str(fwd.outputs[0].type) == "f32[B, S, 64]"
        assert str(dec.outputs[0].type) == "f32[B, 64]"
        assert not fwd.states and not fwd.state_outputs
        assert set(dec.states) == {"kv"} and set(dec.state_outputs) == {"kv"}
        assert dec.state_outputs["kv"].type == dec.states["kv"].type
        assert dec.dim_inputs == {"at": "P"}


def test_variants_change_the_graph():
    """Each switch shows up in the lowered graph (no variant silently ignored)."""

    def ops(variant):
        return [n.op for n in lower(variant, "forward").nodes]

    base = ops("llama")
    assert ops("llama-qk-norm").count("rms_norm") == base.count("rms_norm") + 2 * 2
    assert (
        len(lower("llama-qkv-bias", "forward").params)
        == len(lower("llama", "forward").params) + 2 * 3
    )
    assert "lm_head" not in lower("llama-tied", "forward").params
    window = [
        n.attrs["window"] for n in lower("llama-window", "decode").nodes if n.op == "attention"
    ]
    assert window == [8, 8]
    scaling = {
        n.attrs["scaling"] for n in lower("llama-default-rope", "forward").nodes if n.op == "rope"
    }
    assert scaling == {"default"}
    gelu = {n.attrs["approx"] for n in lower("gpt2-erf-gelu", "forward").nodes if n.op == "gelu"}
    assert gelu == {"none"}


# -- golden snapshots --------------------------------------------------------------------------
@pytest.mark.parametrize("variant, entry", GOLDEN)
def test_golden_print_graph(variant, entry):
    path = golden_path(variant, entry)
    assert path.exists(), f"missing snapshot {path.name}: run `python scripts/update_golden.py`"
    want = path.read_text(encoding="utf-8")
    got = golden_text(variant, entry)
    if got != want:
        diff = "".join(
            list(
                difflib.unified_diff(
                    want.splitlines(True), got.splitlines(True), f"golden/{path.name}", "lowered"
                )
            )[:60]
        )
        pytest.fail(
            f"print_graph of {variant}/{entry} differs from tests/golden/{path.name}.\n"
            f"If the change is intended, run `python scripts/update_golden.py` and "
            f"commit the snapshot.\n{diff}",
            pytrace=False,
        )


def test_print_graph_is_deterministic():
    assert golden_text("llama", "decode") == golden_text("llama", "decode")


# -- the verifier catches corrupted graphs -------------------------------------------------------
def test_verify_catches_use_before_definition():
    graph = lower("llama", "forward")
    nodes = graph.nodes
    i = next(
        i
        for i in range(1, len(nodes))
        if nodes[i - 1].output is not None and nodes[i - 1].output in nodes[i].inputs
    )
    nodes[i - 1], nodes[i] = nodes[i], nodes[i - 1]
    with pytest.raises(VerifyError, match="used before definition"):
        verify(graph)


def test_verify_catches_a_wrong_recorded_type():
    graph = lower("llama", "forward")
    node = next(n for n in graph.nodes if n.op == "linear")
    node.output.type = node.output.type.with_shape(node.output.type.shape[:-1] + (7,))
    with pytest.raises(VerifyError, match=r"\(linear\): type .* rule says"):
        verify(graph)


def test_verify_catches_a_wrong_recorded_dtype():
    graph = lower("gpt2", "decode")
    node = next(n for n in graph.nodes if n.op == "attention")
    node.output.type = node.output.type.with_dtype("bf16")
    with pytest.raises(VerifyError, match=r"\(attention\): type bf16.* rule says f32"):
        verify(graph)


def test_verify_catches_an_unknown_op():
    graph = lower("gpt2", "forward")
    graph.nodes[3].op = "frobnicate"
    with pytest.raises(VerifyError, match="unknown op frobnicate"):
        verify(graph)


def test_verify_catches_an_undefined_output_and_a_double_definition():
    graph = lower("llama", "decode")
    graph.outputs = [Value(graph.outputs[0].type, "", 10_000)]
    with pytest.raises(VerifyError, match="never defined"):
        verify(graph)
    graph = lower("llama", "decode")
    # the k and v projections: two linear nodes with the same output type
    wk, wv = (
        n
        for n in graph.nodes
        if n.op == "linear" and n.inputs[1].name in ("layers.0.wk", "layers.0.wv")
    )
    assert wk.output.type == wv.output.type
    wv.output = wk.output
    with pytest.raises(VerifyError, match="defined twice"):
        verify(graph)


def test_verify_catches_corruption_after_decompose():
    flat = decompose(lower("llama", "decode"))
    node = next(n for n in flat.nodes if n.op == "matmul")
    node.inputs = node.inputs[::-1]
    # the rule itself fails on the swapped operands: verify lets its OpTypeError through
    with pytest.raises((VerifyError, OpTypeError)):
        verify(flat)


# -- runtime guards --------------------------------------------------------------------------------
def random_model(name: str, overrides: dict, seed: int = 0):
    torch = pytest.importorskip("torch")
    import linnet.torch

    src = load(name)
    config = src.config(overrides)
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for pname, t in src.params(config).shapes.items():
        shape = tuple(d.value for d in t.shape)
        weights[pname] = torch.randn(shape, generator=gen) * 0.2
    return linnet.torch.load_source(source_path(name), overrides, weights)


def position_of(err: Exception, name: str) -> tuple[int, int]:
    m = re.search(rf"{name}\.linnet:(\d+):(\d+)", str(err))
    assert m, f"the guard error names no source position in {name}.linnet: {err}"
    line = int(m.group(1))
    lines = source_path(name).read_text(encoding="utf-8").splitlines()
    assert 1 <= line <= len(lines), f"line {line} is not in {name}.linnet"
    return line, int(m.group(2))


@pytest.mark.parametrize("variant", ["llama", "gpt2"])
def test_decode_past_max_positions_raises_a_guard_error(variant):
    torch = pytest.importorskip("torch")
    name, overrides = VARIANTS[variant]
    model = random_model(name, overrides)
    n = model.max_positions
    assert n == 32
    model.decode(torch.arange(4)[None], 0)
    logits = model.decode(torch.tensor([[5]]), n - 1)  # the last slot still fits
    assert logits.shape == (1, 64) and torch.isfinite(logits).all()
    cache = {k: v.clone() for k, v in model.state.items()}
    with pytest.raises(RuntimeGuardError) as info:
        model.decode(torch.tensor([[6]]), n)
    msg = str(info.value)
    line, _ = position_of(info.value, name)
    assert f"= {n + 1} > {n}" in msg, msg
    text = source_path(name).read_text(encoding="utf-8").splitlines()[line - 1]
    assert "require" in text or "rope(" in text, (line, text)
    for k, v in model.state.items():  # the guard runs before the cache is written
        assert torch.equal(v, cache[k]), f"a failed decode wrote the cache `{k}`"
    with pytest.raises(RuntimeGuardError):  # straddling the end fails too
        model.decode(torch.tensor([[6, 7]]), n - 1)


@pytest.mark.parametrize("variant", ["llama", "gpt2"])
def test_forward_longer_than_max_positions_raises_a_guard_error(variant):
    torch = pytest.importorskip("torch")
    name, overrides = VARIANTS[variant]
    model = random_model(name, overrides, seed=1)
    n = model.max_positions
    assert model.forward(torch.zeros(1, n, dtype=torch.long)).shape == (1, n, 64)
    with pytest.raises(RuntimeGuardError) as info:
        model.forward(torch.zeros(1, n + 1, dtype=torch.long))
    position_of(info.value, name)
    assert f"= {n + 1} > {n}" in str(info.value)


def test_require_guard_points_at_the_requirement():
    graph = lower("gpt2", "forward")
    guard = next(n for n in graph.nodes if n.op == "guard")
    line, col = map(int, guard.where.rsplit(":", 2)[1:])
    text = source_path("gpt2").read_text(encoding="utf-8").splitlines()[line - 1]
    assert text.strip().startswith("require")
    assert col in (text.index("require") + 1, text.index("at + S") + 1), (guard.where, text)


def test_token_id_past_the_vocab_is_a_linnet_error():
    torch = pytest.importorskip("torch")
    model = random_model(*VARIANTS["llama"])
    with pytest.raises(LinnetError):
        model.forward(torch.tensor([[1, 64]]))


def test_negative_token_id_is_a_linnet_error():
    torch = pytest.importorskip("torch")
    model = random_model(*VARIANTS["gpt2"])
    with pytest.raises(LinnetError):
        model.forward(torch.tensor([[1, -1]]))


STATE_READ_BEFORE_WRITE = """\
model rw

config
  n: int = 4

dim B

state s: f32[B, n]

entry step(x: f32[B, n]) updates s -> f32[B, n]
  old = s[:, 0 : n]
  s[:, 0 : n] = x
  return old
"""


def test_state_read_before_a_write_keeps_the_old_value():
    torch = pytest.importorskip("torch")
    from linnet.backends.torch.interp import Interpreter

    src = Source.parse_text(STATE_READ_BEFORE_WRITE, "rw.linnet")
    graph = decompose(src.lower(src.config({}), "step"))
    verify(graph)
    state = torch.zeros(2, 4)
    (old,) = Interpreter(graph, {}).run([torch.ones(2, 4)], {}, {"s": state})
    assert torch.equal(old, torch.zeros(2, 4)), f"`old` reads the written values: {old}"


# -- decode agrees with forward ------------------------------------------------------------
@pytest.mark.parametrize("variant", ["llama", "llama-window", "llama-qk-norm", "gpt2"])
def test_decode_token_by_token_matches_forward(variant):
    """Prefill + one-token decodes through the KV cache give the forward logits."""
    torch = pytest.importorskip("torch")
    name, overrides = VARIANTS[variant]
    model = random_model(name, overrides, seed=2)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(3))
    full = model.forward(ids)
    model.reset()
    steps = [model.decode(ids[:, :5], 0)]
    for t in range(5, 12):
        steps.append(model.decode(ids[:, t : t + 1], t))
    got = torch.stack(steps, dim=1)
    want = full[:, 4:]
    delta = assert_close(got, want, atol=1e-4, what=f"{variant}: decode vs forward")
    print(f"{variant}: decode vs forward max |Δ| = {delta:.3e}")

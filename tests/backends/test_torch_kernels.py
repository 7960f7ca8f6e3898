"""What the PyTorch paths do for speed, checked for what it must not change.

- Temporaries are freed after their last use (`dying_values`): the generated code `del`s
  them and the interpreter drops them, so a forward holds about one layer's activations,
  not the whole model's.
- bf16/f16 linears over many rows run as f32 GEMM on CPUs without bf16/f16 dot products
  (`linear_lowp`): the same products and f32 sums as the native kernel, rounded once;
  one-query attention (a decode step) runs the f32 kernel.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from linnet.zoo import get, source_path

import linnet.torch as lt
from linnet.backends.torch import prelude as torch_prelude
from linnet.backends.torch.codegen import generate
from linnet.backends.torch.interp import Interpreter
from linnet.backends.torch.runners import reference_graph
from linnet.ir.passes import dying_values
from linnet.source import Source
from tests.checkpoints import build_tiny, probe_ids

LLAMA = dict(
    vocab=64,
    dim=32,
    n_heads=4,
    n_kv=2,
    ffn=48,
    max_positions=32,
    act="f32",
    rope_scaling="default",
    window=0,
)


def llama(n_layers: int):
    source = Source.load(source_path("llama"))
    return source, source.config(dict(LLAMA, n_layers=n_layers))


def program(source, config):
    return source.program(config)


def peak_live_temporaries(method_text: str) -> int:
    """Walk one generated method: `tN = ...` makes a temporary live, `del tN, ...` ends it."""
    live, peak = set(), 0
    for line in method_text.splitlines():
        line = line.strip()
        if line.startswith("del "):
            for name in line[4:].split(","):
                live.remove(name.strip())  # deleting a name never made would be a bug
        elif m := re.match(r"(t\d+) = ", line):
            live.add(m.group(1))
        peak = max(peak, len(live))
    return peak


def method(text: str, name: str) -> str:
    start = text.index(f"    def {name}(")
    end = text.find("\n    def ", start + 1)
    return text[start : end if end > 0 else None]


@pytest.mark.parametrize("entry", ["forward", "decode"])
def test_generated_code_holds_a_layer_of_temporaries_not_the_model(entry):
    """Eight layers keep no more temporaries alive at once than two do."""
    peaks = {
        n: peak_live_temporaries(method(generate(program(*llama(n)), "equivalent"), entry))
        for n in (2, 8)
    }
    assert 0 < peaks[8] == peaks[2], peaks


def test_interpreter_drops_temporaries_after_their_last_use():
    peaks = {}
    for n in (2, 8):
        source, cfg = llama(n)
        graph = reference_graph(source.program(cfg), "forward")
        shapes = source.params(cfg).shapes
        params = {k: torch.randn([d.value for d in t.shape]) for k, t in shapes.items()}
        interp = Interpreter(graph, params)
        live, peak = set(), 0
        for _fn, _ins, out, frees in interp.steps:
            live.add(out)
            live.difference_update(frees)
            peak = max(peak, len(live))
        peaks[n] = peak
        outputs = interp.run([torch.randint(0, 64, (2, 9))])  # and it still runs
        assert outputs[0].shape == (2, 9, 64)
    assert peaks[8] == peaks[2], peaks


def test_dying_values_never_lists_inputs_params_states_or_outputs():
    source, cfg = llama(2)
    graph = source.lower(cfg, "decode")
    dying = [v for vs in dying_values(graph).values() for v in vs]
    assert len(dying) == len(set(dying))
    kept = set(graph.inputs) | set(graph.params.values()) | set(graph.states.values())
    kept |= set(graph.outputs) | set(graph.state_outputs.values())
    assert not kept & set(dying)
    last_read = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            last_read[v] = i
    for i, values in dying_values(graph).items():
        assert all(last_read.get(v, i) <= i for v in values)


@pytest.mark.slow
def test_compiled_decode_writes_per_layer_cache_parts_in_place(tmp_path):
    """Under torch.compile the cache goes in as one view per layer and k/v: a slice write
    into the one cache tensor made Inductor copy the whole cache every step (SmolLM2's
    step 659 ms; the profiler does not see those allocations, so this checks the split).
    The step writes into the model's own cache and matches the interpreter."""
    path = build_tiny("LlamaForCausalLM", "base", tmp_path)
    model = lt.load(path, dtype="f32", mode="compile", numerics="fast")
    layers = model.config["n_layers"]
    parts = model.runner.parts["kv"]
    assert parts == {f"kv.{i}.{j}": (i, j) for i in range(layers) for j in range(2)}
    assert all(f"kv_{i}_{j}=None" in model.runner.text for i in range(layers) for j in (0, 1))
    n = model.max_positions
    ids = probe_ids(model.config["vocab"], (1, n - 1), seed=5)
    model.reset()
    model.decode(ids[:, :-2], 0)
    kv = model.state["kv"]
    ptr = kv.untyped_storage().data_ptr()
    assert not kv[..., n - 2, :].any()
    for pos in (n - 3, n - 2):
        last = model.decode(ids[:, pos : pos + 1], pos)
    assert model.state["kv"].untyped_storage().data_ptr() == ptr, "the cache moved"
    assert kv[..., n - 2, :].abs().sum(-1).gt(0).all()  # every layer's k and v written
    reference = lt.load(path, dtype="f32")
    assert (last - reference.forward(ids)[:, -1]).abs().max().item() <= 1e-3


# -- linear_lowp ---------------------------------------------------------------------------
def widened(x, w, b=None):
    """The reference: f32 products and sums, rounded once to x's dtype."""
    return F.linear(x.float(), w.float(), None if b is None else b.float()).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [24, 1])  # a prefill (chunked f32 GEMM), a decode (native)
def test_linear_lowp_is_f32_gemm_rounded_once(monkeypatch, dtype, bias, rows):
    monkeypatch.setitem(torch_prelude._LOWP_NATIVE, dtype, False)
    monkeypatch.setattr(torch_prelude, "_LOWP_CHUNK", 7 * 40)  # 7 rows of w per chunk
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2 if rows > 1 else 1, rows, 40, generator=g).to(dtype)
    w = torch.randn(53, 40, generator=g).to(dtype)  # 53 = 7 * 7 + 4: a ragged last chunk
    b = torch.randn(53, generator=g).to(dtype) if bias else None
    got = torch_prelude.linear_lowp(x, w, b)
    want = widened(x, w, b)
    assert got.shape == (*x.shape[:-1], 53) and got.dtype == dtype
    # f32 sums in another order may round the other way: at most one unit in the last place
    ulp = torch.finfo(dtype).eps * want.float().abs().clamp_min(1.0)
    assert ((got.float() - want.float()).abs() <= ulp).all()
    native = F.linear(x, w, b)  # and no further from the widened result than the native kernel
    worst = (native.float() - want.float()).abs().max() + ulp.max()
    assert (got.float() - want.float()).abs().max() <= worst


def test_linear_lowp_leaves_few_rows_and_native_cpus_to_the_native_kernel(monkeypatch):
    calls = []
    real_mm = torch.mm
    monkeypatch.setattr(torch_prelude.torch, "mm", lambda *a: calls.append(a) or real_mm(*a))
    w = torch.randn(8, 16).bfloat16()
    monkeypatch.setitem(torch_prelude._LOWP_NATIVE, torch.bfloat16, False)
    torch_prelude.linear_lowp(torch.randn(1, 1, 16).bfloat16(), w)  # a decode step: native
    assert not calls
    torch_prelude.linear_lowp(torch.randn(1, 16, 16).bfloat16(), w)
    assert calls
    calls.clear()
    monkeypatch.setitem(torch_prelude._LOWP_NATIVE, torch.bfloat16, True)
    torch_prelude.linear_lowp(torch.randn(1, 16, 16).bfloat16(), w)
    assert not calls


def test_generated_source_uses_linear_lowp_for_bf16_only():
    source = Source.load(source_path("llama"))
    f32 = generate(source.program(source.config(dict(LLAMA, n_layers=1))), "equivalent")
    bf16 = generate(
        source.program(source.config(dict(LLAMA, n_layers=1, act="bf16"))), "equivalent"
    )
    assert "= linear_lowp(" not in f32 and "= F.linear(" in f32
    assert "= linear_lowp(" in bf16 and "= F.linear(" not in bf16


@pytest.mark.parametrize("numerics", ["equivalent", "fast"])
def test_bf16_generated_mode_matches_transformers_on_real_weights(
    smollm2_checkpoint, chat_prompts, numerics
):
    """SmolLM2 in bf16 through the generated path (prefills take linear_lowp): the first
    greedy token of transformers' bf16 model, and logits within the entry's bf16 tolerance."""
    tol = get("smollm2-135m-instruct").tolerance("torch", "bf16")
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(
        smollm2_checkpoint,
        dtype=torch.bfloat16,
        attn_implementation="eager",
        trust_remote_code=False,
    ).eval()
    model = lt.load(smollm2_checkpoint, dtype="bf16", mode="generated", numerics=numerics)
    for ids in chat_prompts:
        ids = ids.reshape(1, -1)
        assert ids.shape[1] >= torch_prelude._LOWP_MIN_ROWS
        with torch.no_grad():
            want = reference(input_ids=ids).logits[:, -1].float()
        model.reset()
        got = model.decode(ids, 0).float()
        assert int(got.argmax()) == int(want.argmax())
        assert (got - want).abs().max().item() <= tol.max_abs
        # one decode step (a GEMV per linear, one-query attention) after the prompt
        ids = torch.cat([ids, want.argmax(-1, keepdim=True)], dim=1)
        with torch.no_grad():
            want = reference(input_ids=ids).logits[:, -1].float()
        got = model.decode(ids[:, -1:], ids.shape[1] - 1).float()
        assert (got - want).abs().max().item() <= tol.max_abs
        top = len(set(got.topk(5).indices[0].tolist()) & set(want.topk(5).indices[0].tolist()))
        assert top >= tol.top5  # bf16 can swap near-tied tokens: the gate's top-5 measure


def test_one_query_lowp_attention_runs_the_f32_kernel(monkeypatch):
    monkeypatch.setitem(torch_prelude._LOWP_NATIVE, torch.bfloat16, False)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, h, n, 16, generator=g) for h, n in ((6, 1), (2, 11), (2, 11)))
    lowp = [t.bfloat16() for t in (q, k, v)]
    got = torch_prelude.attention_fast(*lowp, True, 10, 0, 0.25)
    want = torch_prelude.attention_fast(*(t.float() for t in lowp), True, 10, 0, 0.25)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want.bfloat16())

"""`fuse_linears` (q/k/v and gate/up as one matmul) and the generated decode's memory.

On a tiny checkpoint of every architecture: the fused graphs verify, give the unfused
logits within 1e-5 (f32), forward and decode, and transformers' greedy tokens; the model's
params keep the source's names and values while sharing the stacked weights' memory. A
decode step allocates nothing the size of the cache, nor of the keys it reads.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import linnet.torch as lt
from linnet.backends.torch import runners as torch_runners
from linnet.backends.torch.codegen import lower_entries
from linnet.ir.fusion import fuse_linears
from linnet.ir.passes import dedupe_guards, verify
from tests.checkpoints import build_tiny, probe_ids, reference_greedy, tiny_variants
from tests.numeric import assert_close

FUSED_TOL = 1e-5  # f32 logits, fused against unfused
VARIANTS = tiny_variants()
IDS = [f"{a}-{v}" for a, v in VARIANTS]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cache: dict = {}

    def get(arch, variant):
        if (arch, variant) not in cache:
            out = tmp_path_factory.mktemp(f"{arch}-{variant}")
            cache[arch, variant] = build_tiny(arch, variant, out)
        return cache[arch, variant]

    return get


def _linears(graph) -> int:
    return sum(node.op == "linear" for node in graph.nodes)


@pytest.mark.parametrize(("arch", "variant"), VARIANTS, ids=IDS)
def test_fused_graphs_verify_and_stack_source_params(tiny, arch, variant):
    model = lt.load(tiny(arch, variant), dtype="f32")
    for entry in model.entries:
        graph = dedupe_guards(model.source.lower(model.config, entry))
        fused_graph, fused = fuse_linears(graph)
        verify(fused_graph)
        assert fused, f"{arch}-{variant} {entry}: nothing fused"
        names = {v: n for n, v in graph.params.items()}
        weights = {names.get(n.inputs[1]) for n in graph.nodes if n.op == "linear"}
        merged = sum(len(parts) - 1 for parts in fused.values() if parts[0] in weights)
        assert _linears(fused_graph) == _linears(graph) - merged
        for name, parts in fused.items():
            assert all(p in model.params for p in parts), f"{name}: {parts}"
            assert name.rpartition(".")[0] == parts[0].rpartition(".")[0]


@pytest.mark.parametrize(("arch", "variant"), VARIANTS, ids=IDS)
def test_fused_logits_match_unfused(tiny, arch, variant, monkeypatch):
    path = tiny(arch, variant)
    fused = lt.load(path, dtype="f32", mode="generated")
    monkeypatch.setattr(
        torch_runners, "lower_entries", lambda program, fuse: lower_entries(program)
    )
    plain = lt.load(path, dtype="f32", mode="generated")
    monkeypatch.undo()
    assert ".wq_wk_wv" in fused.runner.text and ".wq_wk_wv" not in plain.runner.text
    ids = probe_ids(fused.config["vocab"])
    assert_close(fused.forward(ids), plain.forward(ids), atol=FUSED_TOL, what="forward")
    for model in (fused, plain):
        model.reset()
        model.decode(ids[:, :-2], 0)
    for pos in range(ids.shape[1] - 2, ids.shape[1]):
        a = fused.decode(ids[:, pos : pos + 1], pos)
        b = plain.decode(ids[:, pos : pos + 1], pos)
        assert_close(a, b, atol=FUSED_TOL, what=f"decode at {pos}")
    prompt = probe_ids(fused.config["vocab"], (1, 12), seed=3)
    want = reference_greedy(path, prompt, 8)
    assert fused.generate(prompt, 8)[:, : want.shape[1]].tolist() == want.tolist()


def test_stacked_weights_are_held_once(tiny):
    """The source's params are views of the stacked rows: same values as the checkpoint,
    one storage, and the runner's module holds the stacked tensor itself."""
    path = tiny("LlamaForCausalLM", "base")
    reference = lt.load(path, dtype="f32")
    model = lt.load(path, dtype="f32", mode="generated")
    layer = model.runner.module.layers[0]
    stacked = layer.wq_wk_wv
    ptr = stacked.untyped_storage().data_ptr()
    for name in ("wq", "wk", "wv"):
        param = model.params[f"layers.0.{name}"]
        assert torch.equal(param, reference.params[f"layers.0.{name}"])
        assert param.untyped_storage().data_ptr() == ptr, f"{name} is a copy"
        assert param.is_contiguous()
    assert layer.gate_up.untyped_storage().data_ptr() == (
        model.params["layers.0.gate"].untyped_storage().data_ptr()
    )
    assert set(model.params) == set(reference.params)  # exports see the source's names


@pytest.mark.parametrize("numerics", ["equivalent", "fast"])
@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "GPT2LMHeadModel"])
def test_decode_step_allocates_no_cache_sized_tensor(tiny, arch, numerics):
    """Late in the cache, one decode step allocates nothing as large as the keys it reads
    (a repeat of k or v for GQA, or a copy of the cache, would be)."""
    model = lt.load(tiny(arch, "base"), dtype="f32", mode="generated", numerics=numerics)
    n = model.max_positions
    ids = probe_ids(model.config["vocab"], (1, n - 1), seed=5)
    model.reset()
    model.decode(ids[:, :-1], 0)
    kv = model.state["kv"]
    ptr = kv.untyped_storage().data_ptr()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model.decode(ids[:, -1:], n - 2)
    assert model.state["kv"].untyped_storage().data_ptr() == ptr, "the cache moved"
    layers, _, batch, kv_heads, _, head_dim = kv.shape
    keys_read = batch * kv_heads * (n - 1) * head_dim * kv.element_size()
    biggest = max(e.self_cpu_memory_usage for e in prof.events())
    assert biggest < keys_read, (
        f"a decode step allocated {biggest} bytes; the keys of one layer are {keys_read}"
    )


def test_hf_export_of_a_fused_model_is_bit_exact(tiny, tmp_path):
    """Exports read the source's params, now views of the stacked rows: unchanged."""
    from safetensors.torch import load_file

    import linnet.hf

    path = tiny("LlamaForCausalLM", "base")
    model = lt.load(path, dtype="f32", mode="generated")
    linnet.hf.export(model, tmp_path / "out", dtype="f32")
    want, got = {}, {}
    for folder, into in ((path, want), (tmp_path / "out", got)):
        for file in sorted(Path(folder).glob("*.safetensors")):
            into.update(load_file(file))
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name

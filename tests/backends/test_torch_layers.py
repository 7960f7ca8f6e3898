"""Compile once per layer shape (issue 21): `mode="compile"` writes one method per layer
kind and compiles it alone, so compile time does not grow with depth.

- `linnet.ir.outline` cuts every tiny decoder's entries into layers of one kind;
- the outlined module, run eagerly, gives bit-identical logits to the straight one;
- compiled, it gives transformers' greedy tokens (Llama, Qwen3, Mistral, GPT-2), and
  dynamo compiles as many graphs for five layers as for two;
- compiled artefacts go to Linnet's cache unless TORCHINDUCTOR_CACHE_DIR says otherwise.
No timing is asserted (docs/torch.md has the measured compile times).
"""

from __future__ import annotations

import pytest
import torch
from linnet.zoo import source_path

import linnet.torch as lt
from linnet.backends.torch import kernels
from linnet.backends.torch.codegen import lower_entries
from linnet.backends.torch.runners import GeneratedRunner, use_disk_cache
from linnet.ir.outline import outline
from linnet.ir.state_split import split_entry_states
from tests.backends.test_torch_backend import TINY, random_weights
from tests.checkpoints import build_tiny, probe_ids, reference_greedy, tiny_variants

VARIANTS = tiny_variants()
COMPILED = [
    ("LlamaForCausalLM", "base"),
    ("Qwen3ForCausalLM", "base"),
    ("MistralForCausalLM", "base"),
    ("GPT2LMHeadModel", "base"),
]
FAST_TOL = 1e-3  # f32 logits, as tests/backends/test_torch_backend.py states for `fast`


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cache: dict = {}

    def get(arch, variant):
        if (arch, variant) not in cache:
            folder = tmp_path_factory.mktemp(f"{arch}-{variant}")
            cache[arch, variant] = build_tiny(arch, variant, folder)
        return cache[arch, variant]

    return get


def split_graphs(model):
    graphs, _ = lower_entries(model.source.program(model.config), fuse=True)
    return split_entry_states(graphs)[0]


@pytest.mark.parametrize("n_layers", [2, 5])
@pytest.mark.parametrize("name", list(TINY))
def test_every_layer_is_one_kind(name, n_layers):
    source, cfg, weights = random_weights(name, dict(TINY[name], n_layers=n_layers))
    model = lt.load_source(source_path(name), cfg, weights)
    for entry, graph in split_graphs(model).items():
        cut = outline(graph)
        assert cut is not None, f"{name}.{entry}: no layers found"
        assert [r.layer for r in cut.regions] == list(range(n_layers))
        assert {r.kind for r in cut.regions} == {0}, f"{name}.{entry}: layers differ"
        covered = len(cut.before) + sum(len(r.nodes) for r in cut.regions) + len(cut.after)
        assert covered == len(graph.nodes)  # every node once: none lost, none repeated


def outlined_runner(model, numerics):
    program = model.source.program(model.config)
    return GeneratedRunner(program, dict(model.params), model.device, numerics, outlined=True)


@pytest.mark.parametrize("numerics", ["equivalent", "fast"])
@pytest.mark.parametrize(("arch", "variant"), VARIANTS, ids=[f"{a}-{v}" for a, v in VARIANTS])
def test_outlined_module_is_bit_identical(tiny, arch, variant, numerics):
    """The same ops in the same order: the outlined module, run eagerly, must give the
    straight module's logits exactly, in forward and over a prefill and decode steps."""
    straight = lt.load(tiny(arch, variant), dtype="f32", mode="generated", numerics=numerics)
    outlined = lt.load(tiny(arch, variant), dtype="f32", mode="generated", numerics=numerics)
    outlined.runner = outlined_runner(outlined, numerics)
    assert "_decode_layer0(" in outlined.runner.text
    assert "_decode_layer1(" not in outlined.runner.text  # one method for every layer
    ids = probe_ids(straight.config["vocab"])
    torch.testing.assert_close(outlined.forward(ids), straight.forward(ids), rtol=0, atol=0)
    for model in (straight, outlined):
        model.reset()
        model.decode(ids[:, :-3], 0)
    for pos in range(ids.shape[1] - 3, ids.shape[1]):
        want = straight.decode(ids[:, pos : pos + 1], pos)
        got = outlined.decode(ids[:, pos : pos + 1], pos)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    for name, cache in straight.state.items():
        torch.testing.assert_close(outlined.state[name], cache, rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "variant"), COMPILED, ids=[f"{a}-{v}" for a, v in COMPILED])
def test_compiled_layers_give_transformers_tokens(tiny, arch, variant):
    path = tiny(arch, variant)
    reference = lt.load(path, dtype="f32")
    model = lt.load(path, dtype="f32", mode="compile", numerics="fast")
    assert "_decode_layer0(" in model.runner.text
    ids = probe_ids(reference.config["vocab"])
    delta = (model.forward(ids) - reference.forward(ids)).abs().max().item()
    assert delta <= FAST_TOL, f"forward max |Δ| {delta:.3g} > {FAST_TOL}"
    prompt = probe_ids(reference.config["vocab"], (1, 12), seed=3)
    want = reference_greedy(path, prompt, 8)
    assert model.generate(prompt, 8)[:, : want.shape[1]].tolist() == want.tolist()


def compile_work(n_layers: int) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """What dynamo compiled for a forward, a prefill and 8 decode steps of an n-layer model (graphs,
    and the calls it captured into them), and the last logits of the compiled model and
    of the interpreter."""
    from torch._dynamo.utils import counters

    config = dict(TINY["llama"], n_layers=n_layers, max_positions=32, window=0)
    source, cfg, weights = random_weights("llama", config)
    reference = lt.load_source(source_path("llama"), cfg, weights)
    model = lt.load_source(source_path("llama"), cfg, weights, mode="compile")
    ids = torch.randint(0, 64, (1, 14), generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    counters.clear()
    model.forward(ids)
    model.reset()
    model.decode(ids[:, :6], 0)
    for pos in range(6, 14):
        last = model.decode(ids[:, pos : pos + 1], pos)
    work = {k: counters["stats"][k] for k in ("unique_graphs", "calls_captured")}
    return work, last, reference.forward(ids)[:, -1]


@pytest.mark.slow
def test_decode_compiles_one_layer_for_any_depth():
    """Five layers cost dynamo as much as two: one layer method per entry, compiled once
    (forward), or once for the prefill and once for one-token steps (decode); the unrolled
    entry captured every layer's calls, so its graphs grew with depth."""
    two, last, want = compile_work(2)
    five, last5, want5 = compile_work(5)
    assert five == two, f"compiled for 2 layers: {two}; for 5: {five}"
    # forward's layer, decode's for the prefill and for one-token steps
    assert 1 <= five["unique_graphs"] <= 3, f"{five} for a forward, a prefill and 8 steps"
    torch.testing.assert_close(last, want, rtol=0, atol=1e-4)
    torch.testing.assert_close(last5, want5, rtol=0, atol=1e-4)


def test_inductor_cache_is_under_linnet_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("LINNET_CACHE", str(tmp_path))
    first = use_disk_cache()
    assert first == tmp_path / "inductor" / kernels.build_dir().name
    # another build of the C++ kernels never replays graphs traced against this one's ops
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    monkeypatch.setattr(kernels, "build_dir", lambda: tmp_path / "kernels" / "another")
    assert use_disk_cache() == tmp_path / "inductor" / "another"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert use_disk_cache() == tmp_path / "mine"  # the user's choice wins
    # torch._dynamo's import writes torch's default there: not a choice, still keyed
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    assert use_disk_cache() == tmp_path / "inductor" / "another"

"""The PyTorch fast paths: generated source, numerics=fast, torch.compile, CUDA graphs.

Every mode and numerics must give transformers' greedy tokens on every tiny
architecture; `equivalent` stays within 1e-4 of the interpreter and `fast`
within its stated tolerance. Generated code is snapshot-tested and must run
with torch alone. CUDA graphs: refused on the CPU, plan-checked here, replayed
where a GPU exists.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from linnet.zoo import source_path

import linnet.torch as lt
from linnet.backends.torch.codegen import generate, generate_graphs
from linnet.backends.torch.cudagraphs import capture_plan
from linnet.backends.torch.interp import Interpreter
from linnet.backends.torch.runners import load_generated
from linnet.errors import LinnetError
from linnet.ir.passes import decompose
from linnet.source import Source
from tests.checkpoints import build_tiny, probe_ids, reference_greedy, tiny_variants

EQUIVALENT_TOL = 1e-4  # f32 logits, against the interpreter
FAST_TOL = 1e-3  # f32 logits: SDPA and fused norms reorder sums
VARIANTS = tiny_variants()
GOLDEN_DIR = Path(__file__).resolve().parents[1] / "golden"
TINY = {
    "llama": dict(
        vocab=64,
        dim=32,
        n_layers=2,
        n_heads=4,
        n_kv=2,
        ffn=48,
        max_positions=32,
        act="f32",
        rope_scaling="default",
        window=6,
    ),
    "gpt2": dict(vocab=64, dim=32, n_layers=2, n_heads=4, n_positions=32, act="f32"),
}


def random_weights(name: str, config: dict, seed: int = 0):
    source = Source.load(source_path(name))
    cfg = source.config(config)
    g = torch.Generator().manual_seed(seed)
    shapes = source.params(cfg).shapes
    weights = {
        k: torch.randn([d.value for d in t.shape], generator=g) * 0.5 for k, t in shapes.items()
    }
    return source, cfg, weights


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache: dict = {}

    def get(arch, variant, mode="interpret", numerics="equivalent"):
        key = (arch, variant)
        if key not in cache:
            cache[key] = build_tiny(arch, variant, tmp_path_factory.mktemp(f"{arch}-{variant}"))
        path = cache[key]
        if (key, mode, numerics) not in cache:
            cache[key, mode, numerics] = lt.load(path, dtype="f32", mode=mode, numerics=numerics)
        return path, cache[key, mode, numerics]

    return get


@pytest.mark.parametrize("numerics", ["equivalent", "fast"])
@pytest.mark.parametrize(("arch", "variant"), VARIANTS, ids=[f"{a}-{v}" for a, v in VARIANTS])
def test_generated_mode_matches(built, arch, variant, numerics):
    path, reference = built(arch, variant)
    _, model = built(arch, variant, "generated", numerics)
    ids = probe_ids(reference.config["vocab"])
    tol = EQUIVALENT_TOL if numerics == "equivalent" else FAST_TOL
    delta = (model.forward(ids) - reference.forward(ids)).abs().max().item()
    assert delta <= tol, f"forward max |Δ| {delta:.3g} > {tol}"
    model.reset()
    model.decode(ids[:, :-3], 0)
    for pos in range(ids.shape[1] - 3, ids.shape[1]):
        last = model.decode(ids[:, pos : pos + 1], pos)
    delta = (last - reference.forward(ids)[:, -1]).abs().max().item()
    assert delta <= tol, f"decode max |Δ| {delta:.3g} > {tol}"
    prompt = probe_ids(reference.config["vocab"], (1, 12), seed=3)
    want = reference_greedy(path, prompt, 8)
    assert model.generate(prompt, 8)[:, : want.shape[1]].tolist() == want.tolist()


def test_interpret_mode_has_only_equivalent_numerics(built):
    path, _ = built("LlamaForCausalLM", "base")
    with pytest.raises(LinnetError, match="numerics='equivalent'"):
        lt.load(path, numerics="fast")
    with pytest.raises(LinnetError, match="mode='warp'"):
        lt.load(path, mode="warp")


@pytest.mark.slow
def test_compile_mode_recompiles_at_most_once_over_64_decode_steps():
    from torch._dynamo.utils import counters

    config = dict(TINY["llama"], n_layers=1, max_positions=96, window=0)
    source, cfg, weights = random_weights("llama", config)
    reference = lt.load_source(source_path("llama"), cfg, weights)
    model = lt.load_source(source_path("llama"), cfg, weights, mode="compile")
    ids = torch.randint(0, 64, (1, 70), generator=torch.Generator().manual_seed(1))
    full = reference.forward(ids)
    model.reset()
    model.decode(ids[:, :6], 0)  # prefill compiles the first graph
    counters.clear()
    for pos in range(6, 70):
        last = model.decode(ids[:, pos : pos + 1], pos)
    graphs = counters["stats"]["unique_graphs"]
    print(f"graphs compiled over 64 decode steps: {graphs}")
    assert graphs <= 1, f"{graphs} recompilations over 64 decode steps"
    assert (last - full[:, -1]).abs().max().item() <= EQUIVALENT_TOL


def test_cudagraphs_refuses_on_cpu(built):
    path, _ = built("LlamaForCausalLM", "base")
    with pytest.raises(LinnetError, match="CUDA device; this model is on cpu"):
        lt.load(path, mode="cudagraphs")


@pytest.mark.parametrize("name", list(TINY))
def test_capture_plan_holds_no_host_position(name):
    """The decode a CUDA graph would capture: no attr, dim input or guard names the
    position, and it computes what forward computes, interpreted and generated."""
    source, cfg, weights = random_weights(name, TINY[name])
    plan = capture_plan(source.lower(cfg, "decode"))
    assert "P" not in plan.dim_inputs.values()
    assert all("P" not in str(node.attrs) for node in plan.nodes)
    assert any(node.op == "update_rows" for node in plan.nodes)
    reference = lt.load_source(source_path(name), cfg, weights)
    interp = Interpreter(decompose(plan), weights)
    text = generate_graphs(source.program(cfg), {"decode": plan}, "equivalent")
    module = load_generated(text, name)()
    module.load_state_dict({k: weights[k] for k in module.state_dict()}, assign=True)
    ids = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(2))
    full = reference.forward(ids)
    kv_type = reference.runner.state_types["kv"]
    shape = [2 if i == 2 else d.value for i, d in enumerate(kv_type.shape)]
    kv_a, kv_b = torch.zeros(shape), torch.zeros(shape)
    for pos in range(ids.shape[1]):
        token, at = ids[:, pos : pos + 1], torch.tensor([pos])
        a = interp.run([token, at], {}, {"kv": kv_a})[0]
        b = module.decode(token, at, kv=kv_b)
        for got in (a, b):
            delta = (got - full[:, pos]).abs().max().item()
            assert delta <= EQUIVALENT_TOL, f"position {pos}: max |Δ| {delta:.3g}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_cudagraphs_replay_matches_eager(tmp_path):
    path = build_tiny("LlamaForCausalLM", "base", tmp_path)
    eager = lt.load(path, dtype="f32", device="cuda", mode="generated")
    graphs = lt.load(path, dtype="f32", device="cuda", mode="cudagraphs")
    prompt = probe_ids(eager.config["vocab"], (1, 12), seed=3).cuda()
    assert graphs.generate(prompt, 16).tolist() == eager.generate(prompt, 16).tolist()


# -- generated source -------------------------------------------------------------------
def golden_path(name: str) -> Path:
    return GOLDEN_DIR / f"torch_{name}.py.txt"


def golden_text(name: str) -> str:
    source, cfg, _ = random_weights(name, TINY[name])
    return generate(source.program(cfg), "equivalent")


@pytest.mark.parametrize("name", list(TINY))
def test_generated_source_snapshot(name):
    path = golden_path(name)
    assert path.exists(), f"missing snapshot {path.name}: run `python scripts/update_golden.py`"
    if golden_text(name) != path.read_text(encoding="utf-8"):
        pytest.fail(
            f"generated source for {name} changed; if intended, run "
            "`python scripts/update_golden.py` and review the diff"
        )


@pytest.mark.parametrize("name", list(TINY))
def test_generated_source_runs_with_torch_only(tmp_path, name):
    """Import blocked for linnet: the module must load and run from its own text."""
    source, cfg, weights = random_weights(name, TINY[name])
    file = tmp_path / f"{name}.py"
    file.write_text(generate(source.program(cfg), "equivalent"), encoding="utf-8")
    torch.save(weights, tmp_path / "weights.pt")
    script = (
        "import sys; sys.modules['linnet'] = None\n"
        "import importlib.util, torch\n"
        f"spec = importlib.util.spec_from_file_location('gen', {str(file)!r})\n"
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        f"model = getattr(mod, {source.name.capitalize()!r})()\n"
        f"model.load_state_dict(torch.load({str(tmp_path / 'weights.pt')!r}, weights_only=True))\n"
        "ids = torch.randint(0, 64, (1, 9))\n"
        "full = model(ids)\n"
        "model.reset(1)\n"
        "last = model.decode(ids, 0)\n"
        "print(float((full[:, -1] - last).abs().max()))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout.strip()) <= EQUIVALENT_TOL


def test_linnet_torch_cli_writes_the_module(tmp_path):
    import json

    from click.testing import CliRunner

    from linnet.cli import main

    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(TINY["gpt2"]))
    out = tmp_path / "gpt2.py"
    result = CliRunner().invoke(
        main, ["torch", str(source_path("gpt2")), "--config", str(config), "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "class Gpt2(nn.Module)" in text and "def decode(self, tokens, at, kv=None)" in text
    # no dependency on linnet: its imports are the optional C++ kernels, their decode-step
    # calls and packed linear, in one guarded block (the module then keeps torch's linear;
    # test_generated_source_runs_with_torch_only runs it)
    imports = [
        ln.strip() for ln in text.splitlines() if "import linnet" in ln or "from linnet" in ln
    ]
    assert imports == [
        "from linnet.backends.torch import kernels as _kernels",
        "from linnet.backends.torch.quantized import PackedWeight as _Packed",
        "from linnet.backends.torch.quantized import decode_linear as _decode_linear",
        "from linnet.backends.torch.quantized import packed_linear as _packed_linear",
        "from linnet.backends.torch.step_kernels import attend_cached as _attend_cached",
        "from linnet.backends.torch.step_kernels import bf16_ops as _bf16_ops",
        "from linnet.backends.torch.step_kernels import decode_attention as _decode_attention",
        "from linnet.backends.torch.step_kernels import ops_for as _step_ops",
        "from linnet.backends.torch.step_kernels import rows_attention as _rows_attention",
    ]
    assert "except ImportError:" in text.split(imports[-1], 1)[1].split("\n\n", 1)[0]


@pytest.mark.slow
def test_torch_load_takes_a_gguf_file(tmp_path):
    """A .gguf path goes through the GGUF importer, in any mode."""
    import linnet.gguf
    from tests.checkpoints import smollm2_gguf_path

    path = str(smollm2_gguf_path())
    ids = torch.tensor([[1, 504, 19556, 1780]])
    want = linnet.gguf.load(path).forward(ids)
    got = lt.load(path, mode="generated").forward(ids)
    assert (got - want).abs().max().item() <= EQUIVALENT_TOL

"""The JAX backend: generated JAX under jit, StableHLO exports, numpy weight loading.

Every tiny architecture must give transformers' logits (f32, within 1e-4), its
greedy tokens, and prefill + decode steps equal to one forward, in both numerics
(`fast` within its stated tolerance). Decode compiles once for every position.
The library helpers are checked against the reference decompositions; exports
round-trip through serialize/deserialize and serve several shapes; generated
code is snapshot-tested and runs with jax and numpy alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from linnet.zoo import source_path  # noqa: E402

import linnet.jax as lj  # noqa: E402
from linnet import stablehlo  # noqa: E402
from linnet.backends.jax import prelude as jax_prelude  # noqa: E402
from linnet.backends.jax.codegen import generate  # noqa: E402
from linnet.backends.jax.runners import ExportRunner, JitRunner  # noqa: E402
from linnet.errors import LinnetError, RuntimeGuardError  # noqa: E402
from linnet.ir.library import rope_tables  # noqa: E402
from linnet.source import Source  # noqa: E402

# the snapshot configs the PyTorch snapshots use, so both backends print the same models
from tests.backends.test_torch_backend import GOLDEN_DIR, TINY  # noqa: E402
from tests.checkpoints import (  # noqa: E402
    probe_ids,
    reference_greedy,
    reference_logits,
    tiny_variants,
)

F32_TOL = 1e-4  # f32 logits against transformers
FAST_TOL = 1e-3  # numerics="fast": XLA's attention and fused norms reorder sums
NEW_TOKENS = 8
PREFILL = 12  # of the probe's 24 tokens; the rest are decoded one at a time
VARIANTS = tiny_variants()
# numerics="fast" on the variants whose numerics differ (GQA, window, q/k norm, gelu+layer norm)
FAST_VARIANTS = [
    ("LlamaForCausalLM", "base"),
    ("MistralForCausalLM", "base"),
    ("Qwen3ForCausalLM", "base"),
    ("GPT2LMHeadModel", "base"),
]
ROOT = Path(__file__).resolve().parents[2]


def _close(name: str, got, want, tol: float) -> float:
    """Assert shape, then dtype, then values; return max |Δ|."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype} != {want.dtype}"
    delta = float(np.abs(got - want).max())
    assert delta <= tol, f"{name}: max |Δ| {delta:.3g} > {tol}"
    return delta


def random_weights(name: str, config: dict, seed: int = 0):
    source = Source.load(source_path(name))
    cfg = source.config(config)
    rng = np.random.default_rng(seed)
    shapes = source.params(cfg).shapes
    weights = {
        k: (rng.standard_normal([d.value for d in t.shape]) * 0.5).astype(np.float32)
        for k, t in shapes.items()
    }
    return source, cfg, weights


@pytest.fixture(scope="module")
def built(tiny_checkpoint):
    cache: dict = {}

    def get(arch, variant, numerics="equivalent"):
        path = tiny_checkpoint(arch, variant)
        if (arch, variant, numerics) not in cache:
            cache[arch, variant, numerics] = lj.load(path, dtype="f32", numerics=numerics)
        return path, cache[arch, variant, numerics]

    return get


# -- parity with transformers, every architecture, both numerics --------------------------
@pytest.mark.parametrize(
    ("arch", "variant", "numerics"),
    [(a, v, "equivalent") for a, v in VARIANTS] + [(a, v, "fast") for a, v in FAST_VARIANTS],
    ids=[f"{a}-{v}" for a, v in VARIANTS] + [f"{a}-{v}-fast" for a, v in FAST_VARIANTS],
)
def test_matches_transformers(built, arch, variant, numerics):
    """Forward logits, prefill + decode steps against forward, and greedy tokens."""
    path, model = built(arch, variant, numerics)
    tol = F32_TOL if numerics == "equivalent" else FAST_TOL
    ids = probe_ids(model.config["vocab"]).numpy()
    want = reference_logits(path, ids).numpy()
    full = model.forward(ids)
    delta = _close("forward logits", full, want, tol)
    print(f"{arch}/{variant} {numerics}: forward max |Δ| vs transformers = {delta:.3g}")
    model.reset()
    steps = [model.decode(ids[:, :PREFILL], 0)]
    for pos in range(PREFILL, ids.shape[1] - 1):
        steps.append(model.decode(ids[:, pos : pos + 1], pos))
    for k, logits in enumerate(steps):  # step k: the logits of position PREFILL - 1 + k
        _close(f"decode step {k}", logits, full[:, PREFILL - 1 + k], tol)
    prompt = ids[:, :PREFILL]
    greedy = reference_greedy(path, prompt, NEW_TOKENS).numpy()
    got = np.asarray(model.generate(prompt, NEW_TOKENS))[:, : greedy.shape[1]]
    assert got.tolist() == greedy.tolist()


def test_decode_compiles_once_for_all_positions():
    config = dict(TINY["llama"], n_layers=1, max_positions=64, window=0)
    _, cfg, weights = random_weights("llama", config)
    model = lj.load_source(source_path("llama"), cfg, weights)
    ids = np.random.default_rng(1).integers(0, 64, (1, 38))
    full = model.forward(ids)
    model.decode(ids[:, :6], 0)  # prefill: its own shape, one compile
    before = model.compilations["decode"]
    for pos in range(6, 38):  # 32 one-token steps, each at a new position
        last = model.decode(ids[:, pos : pos + 1], pos)
    compiled = model.compilations["decode"] - before
    print(f"decode compilations over 32 steps: {compiled}")
    assert compiled == 1, f"{compiled} compilations over 32 decode steps"
    assert model.runner.jitted["decode"]._cache_size() == 2  # prefill shape + step shape
    _close("last step", last, full[:, -1], F32_TOL)


def test_guards_are_checked_on_the_host():
    _, cfg, weights = random_weights("gpt2", TINY["gpt2"])
    model = lj.load_source(source_path("gpt2"), cfg, weights)
    with pytest.raises(RuntimeGuardError, match="failed: P \\+ S = 33 > 32"):
        model.decode(np.zeros((1, 33), np.int64), 0)
    with pytest.raises(LinnetError, match="call reset"):
        model.reset() or model.decode(np.zeros((1, 1), np.int64), 5)
    with pytest.raises(LinnetError, match=r"must lie in \[0, 64\)"):
        model.forward(np.full((1, 3), 64))
    with pytest.raises(LinnetError, match="numerics='warp'"):
        lj.load_source(source_path("gpt2"), cfg, weights, numerics="warp")


# -- the library helpers against the reference decompositions -----------------------------
LIBRARY_CASES = {
    "llama": (
        "llama",
        dict(
            TINY["llama"],
            rope_scaling="llama3",
            rope_original_max=8,
            qk_norm=True,
            attn_bias=True,
            mlp_bias=True,
        ),
    ),
    "gpt2-erf": ("gpt2", dict(TINY["gpt2"], gelu_approx="none")),
}


@pytest.mark.parametrize("case", list(LIBRARY_CASES))
def test_library_helpers_match_decompositions(case):
    """The `ref` helpers (rms/layer norm, gelu, llama3 rope, windowed GQA attention, linear
    with bias) give what the primitives of their decompositions give, on forward and on a
    decode at a runtime position (dynamic slices, cache writes, offset masks)."""
    name, config = LIBRARY_CASES[case]
    source, cfg, weights = random_weights(name, config)
    params = jax_prelude.nest_params({k: jax.numpy.asarray(v) for k, v in weights.items()})
    reference = JitRunner(source.program(cfg), "equivalent", decomposed=True)
    helpers = JitRunner(source.program(cfg), "equivalent")
    assert "linear_ref" not in reference.text.split("# -- the model")[1]  # primitives only
    ids = jax.numpy.asarray(np.random.default_rng(2).integers(0, 64, (2, 9)), dtype="int32")
    results = []
    for runner in (reference, helpers):
        fwd = runner.run("forward", params, {}, [ids], {})[0][0]
        state = runner.module.init_state(2)
        dec = runner.run("decode", params, state, [ids[:, 3:]], {"at": 3})[0][0]
        results.append((fwd, dec))
    for i, what in enumerate(("forward", "decode")):
        delta = _close(what, results[1][i], results[0][i], 1e-5)
        print(f"{case} {what}: max |Δ| helpers vs decomposition = {delta:.3g}")


@pytest.mark.parametrize("scaling", ["default", "llama3"])
def test_rope_tables_equal_the_library(scaling):
    spec = dict(
        theta=500000.0, scaling=scaling, factor=8.0, low_freq=1.0, high_freq=4.0, original_max=16
    )
    want = rope_tables(16, 64, **spec)
    got = jax_prelude.rope_tables(16, 64, *spec.values())
    for w, g in zip(want, got):
        assert g.dtype == np.float32 and np.array_equal(w, g)


# -- StableHLO ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(TINY))
def test_stablehlo_round_trip_serves_many_shapes(tmp_path, name):
    """Export forward and decode once, serialize, deserialize and run: the same logits as
    the jitted code for batch 1 and 3 and two lengths; decode at several positions."""
    source, cfg, weights = random_weights(name, TINY[name])
    jitted = lj.load_source(source_path(name), cfg, weights)
    files = {}
    for entry in ("forward", "decode"):
        exported = stablehlo.export_entry(source, cfg, entry)
        files[entry], _ = stablehlo.save(
            exported, tmp_path / f"{entry}.mlir", source, cfg, "equivalent"
        )
    text = files["decode"].read_text()
    assert "stablehlo." in text and "tf.aliasing_output" in text and "?x?xi32" in text
    runner = ExportRunner(source.program(cfg), stablehlo.load_exports(tmp_path))
    model = lj.JaxModel(source, cfg, weights, runner)
    rng = np.random.default_rng(3)
    for batch, seq in ((1, 5), (3, 11)):
        ids = rng.integers(0, 64, (batch, seq))
        full = jitted.forward(ids)
        _close(f"forward B={batch} S={seq}", model.forward(ids), full, 1e-6)
        model.reset()
        model.decode(ids[:, : seq - 3], 0)
        for pos in range(seq - 3, seq):
            last = model.decode(ids[:, pos : pos + 1], pos)
        _close(f"decode B={batch} S={seq}", last, full[:, -1], F32_TOL)


def test_from_stablehlo_refuses_another_config(tmp_path, built):
    path, model = built("LlamaForCausalLM", "base")
    source, cfg = model.source, model.config
    exported = stablehlo.export_entry(source, dict(cfg, max_positions=64), "decode")
    stablehlo.save(exported, tmp_path / "decode.mlir", source, cfg, "equivalent")
    with pytest.raises(LinnetError, match="export again for this config"):
        lj.load(path, from_stablehlo=tmp_path / "decode.mlir")
    model = lj.load(path, max_positions=64, from_stablehlo=tmp_path / "decode.mlir")
    with pytest.raises(LinnetError, match="--entry forward"):
        model.forward(np.zeros((1, 3), np.int64))


def test_stablehlo_cli(tmp_path):
    from click.testing import CliRunner

    from linnet.cli import main

    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(TINY["gpt2"]))
    out = tmp_path / "decode.mlir"
    args = [
        "stablehlo",
        str(source_path("gpt2")),
        "--config",
        str(config),
        "--entry",
        "decode",
        "-o",
        str(out),
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert out.read_text().startswith("// Linnet: `decode` of the `gpt2` source")
    assert stablehlo.read(out).fun_name == "decode"
    result = CliRunner().invoke(main, args[:-3] + ["encode", "-o", str(out)])
    assert result.exit_code == 1 and "the gpt2 source has forward, decode" in result.output


# -- generated source --------------------------------------------------------------------
def golden_path(name: str) -> Path:
    return GOLDEN_DIR / f"jax_{name}.py.txt"


def golden_text(name: str) -> str:
    source, cfg, _ = random_weights(name, TINY[name])
    return generate(source.program(cfg), "equivalent").replace(str(ROOT) + "/", "")


@pytest.mark.parametrize("name", list(TINY))
def test_generated_source_snapshot(name):
    path = golden_path(name)
    assert path.exists(), f"missing snapshot {path.name}: run `python scripts/update_golden.py`"
    if golden_text(name) != path.read_text(encoding="utf-8"):
        pytest.fail(
            f"generated JAX for {name} changed; if intended, run "
            "`python scripts/update_golden.py` and review the diff"
        )


@pytest.mark.parametrize("name", list(TINY))
def test_generated_source_runs_with_jax_only(tmp_path, name):
    """linnet and torch blocked: the module loads and runs from its own text, the jitted
    decode (cache donated) equals forward, and the host check refuses a long prompt."""
    source, cfg, weights = random_weights(name, TINY[name])
    file = tmp_path / f"{name}.py"
    file.write_text(generate(source.program(cfg), "equivalent"), encoding="utf-8")
    np.savez(tmp_path / "weights.npz", **weights)
    script = (
        "import sys; sys.modules['linnet'] = None; sys.modules['torch'] = None\n"
        "import importlib.util, numpy as np\n"
        f"spec = importlib.util.spec_from_file_location('gen', {str(file)!r})\n"
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        f"params = mod.nest_params(dict(np.load({str(tmp_path / 'weights.npz')!r})))\n"
        "ids = np.random.default_rng(0).integers(0, 64, (2, 9)).astype(np.int32)\n"
        "full = mod.forward_jit(params, ids)\n"
        "mod.check_decode(ids, 0)\n"
        "last, kv = mod.decode_jit(params, mod.init_state(2)['kv'], ids, 0)\n"
        "try:\n"
        "    mod.check_decode(ids, 30)\n"
        "except mod.GuardError as err:\n"
        "    print('refused', err)\n"
        "print(float(np.abs(np.asarray(full)[:, -1] - np.asarray(last)).max()))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    refused, delta = proc.stdout.strip().splitlines()
    assert refused.startswith("refused") and "P + S = 39 > 32" in refused
    assert float(delta) <= F32_TOL


def test_linnet_jax_cli_writes_the_module(tmp_path):
    from click.testing import CliRunner

    from linnet.cli import main

    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(TINY["llama"]))
    out = tmp_path / "llama.py"
    result = CliRunner().invoke(
        main,
        [
            "jax",
            str(source_path("llama")),
            "--config",
            str(config),
            "-o",
            str(out),
            "--numerics",
            "fast",
        ],
    )
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "def decode(params, kv, tokens, at):" in text
    assert "kv = lax.dynamic_update_slice(kv, " in text
    assert 'decode_jit = jax.jit(decode, donate_argnames=("kv",))' in text
    assert "attention_fast(" in text and "import linnet" not in text and "torch" not in text


# -- weights without torch ---------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_load_numpy_equals_the_torch_path(built, dtype):
    import torch

    from linnet.weights.planning import plan_checkpoint

    path, _ = built("Phi3ForCausalLM", "base")  # fused qkv / gate_up: split on load
    plan = plan_checkpoint(path, dtype=dtype)[0]
    want = {
        k: v.float().numpy()
        for k, v in plan.load(getattr(torch, "float32" if dtype == "f32" else "bfloat16"))
    }
    got = dict(plan.load_numpy())
    assert sorted(got) == sorted(want)
    for name, array in got.items():
        assert array.dtype.name == {"f32": "float32", "bf16": "bfloat16"}[dtype]
        assert array.flags.c_contiguous and np.array_equal(array.astype(np.float32), want[name])


# -- real weights: SmolLM2-135M-Instruct (f32) -----------------------------------------------
def test_smollm2_matches_transformers(smollm2_checkpoint, chat_prompts):
    """Chat prompts: last-position logits within 1e-4 and the same first token; eight
    greedy tokens as transformers; prefill + decode steps equal forward."""
    import torch

    from tests.checkpoints import load_reference

    model = lj.load(smollm2_checkpoint, dtype="f32", max_positions=256)
    reference = load_reference(smollm2_checkpoint)
    for ids in chat_prompts:
        ids = ids.reshape(1, -1)
        with torch.no_grad():
            want = reference(input_ids=ids).logits[:, -1].float().numpy()
        model.reset()
        got = model.decode(ids.numpy(), 0)
        delta = _close("last-position logits", got, want, F32_TOL)
        print(
            f"SmolLM2 prompt of {ids.shape[1]} tokens: first token {int(np.argmax(got))}, "
            f"max |Δ| vs transformers {delta:.3g}"
        )
        assert int(np.argmax(got)) == int(want.argmax())
    ids = chat_prompts[0].reshape(1, -1)
    with torch.no_grad():
        greedy = reference.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=NEW_TOKENS,
            eos_token_id=None,
            pad_token_id=0,
        ).numpy()
    tokens = np.asarray(model.generate(ids.numpy(), NEW_TOKENS))
    assert tokens.tolist() == greedy.tolist()
    full = model.forward(greedy)
    model.reset()
    model.decode(greedy[:, : ids.shape[1]], 0)
    for pos in range(ids.shape[1], greedy.shape[1]):
        last = model.decode(greedy[:, pos : pos + 1], pos)
    _close("prefill + decode vs forward", last, full[:, -1], F32_TOL)

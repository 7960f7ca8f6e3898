"""Tensor parallel on JAX (issue 19): two host devices (XLA_FLAGS, set before jax starts, so
in a process of its own: tests/parallel/jax_worker.py), params and cache sharded by the plan
derived from the Core IR, collectives left to XLA; against the same checkpoint on one device.
GPT-OSS, the three-device split and SmolLM2: test_jax_tp_models.py.
"""

from __future__ import annotations

import pytest
import torch

from tests.numeric import assert_within
from tests.parallel.jax_launch import run_worker
from tests.parallel.jax_worker import IDS
from tests.tiny_decoders import build_tiny, reference_greedy

# every decoder family of zoo/llama.linnet and zoo/gpt2.linnet (the first: 8 heads over 2 KV
# heads, which the third device of the worker's process must refuse)
CHECKPOINTS = [
    ("llama", "base"), ("llama", "kv1"), ("llama", "attn_bias"), ("mistral", "base"),
    ("qwen2", "base"), ("qwen3", "base"), ("phi3", "base"), ("gpt2", "base"),
    ("llama", "kv3"),  # 9 heads / 3 KV heads, ffn 99: padded to 4 KV groups and 100 rows
]  # fmt: skip


@pytest.fixture(scope="module")
def jax_run(tmp_path_factory):
    """Three host devices: the meshes use two, the third makes a mesh heads cannot divide."""
    root = tmp_path_factory.mktemp("jax-tp")
    cks = [str(build_tiny(a, v, out_dir=root)) for a, v in CHECKPOINTS]
    return cks, run_worker(root / "report.json", 3, 2, cks, timeout=1800)


@pytest.mark.parametrize("index", range(len(CHECKPOINTS)), ids=[f"{a}-{v}" for a, v in CHECKPOINTS])
def test_two_devices_match_one(jax_run, index):
    cks, report = jax_run
    assert report["world"] == 2
    run = report["runs"][cks[index]]
    assert run["finite"]
    assert_within(run["max_abs_diff"], 1e-5 * run["max_abs_logit"])
    assert run["tokens_two"] == run["tokens_one"]
    ids = torch.tensor(IDS)
    assert run["tokens_one"] == reference_greedy(cks[index], ids, 6).tolist()
    assert run["all_reduce_in_hlo"]  # XLA partitioned the program: not two full copies


def test_serving_rows_over_the_mesh_match_one_device_and_keep_the_cache_split(jax_run):
    rows = jax_run[1]["rows"]  # tiny Llama, 3 rows: prefills then steps of all three
    assert_within(rows["max_abs_diff"], 1e-5 * rows["max_abs_logit"])
    kv_heads_split = "P(None, None, None, 'tp'"  # [layers, 2, B, n_kv, N, head_dim]
    assert rows["state_specs"]["kv"].startswith(kv_heads_split)
    # placed so from the start (jit would split it after the first step anyway, but the first
    # prefill would then hold the whole cache on every device)
    assert rows["state_specs_at_start"]["kv"].startswith(kv_heads_split)


def test_bad_meshes_are_refused_with_a_clear_error(jax_run):
    said = jax_run[1]["refused"]
    assert "axis named 'tp'" in said["no_tp_axis"]
    assert said["heads_not_divisible"].startswith("ShardingError: ")
    assert "2 heads do not split over 3 ranks" in said["heads_not_divisible"]  # the KV heads
    assert "needs 5 devices, found 3" in said["too_few_devices"]
    assert "xla_force_host_platform_device_count=5" in said["too_few_devices"]


def test_uneven_kv_groups_are_padded_to_even_blocks_on_a_mesh():
    """PyTorch splits 3 KV groups over 2 ranks 2 + 1; NamedSharding splits evenly, so the
    mesh pads a zero fourth group (and ffn 99 to 100) and shards that."""
    from types import SimpleNamespace

    import numpy as np

    from linnet.shard.jax_tp import mesh_plan, pad_uneven
    from linnet.source import Source
    from tests.tiny_decoders import tiny_fields

    src = Source.load("zoo/llama.linnet")
    program = src.program(src.config(dict(tiny_fields("llama", "kv3"), act="f32")))
    plan = mesh_plan(program, SimpleNamespace(shape={"tp": 2}))
    rng = np.random.default_rng(0)
    params = {
        n: rng.standard_normal([d.value for d in t.shape]).astype(np.float32)
        for n, t in program.params.items()
    }
    padded, got, even = pad_uneven(program, params, plan)
    want = {"wq": (96, 72), "wk": (32, 72), "wo": (72, 96), "gate": (100, 72), "down": (72, 100)}
    for name, shape in want.items():
        x, t = got[f"layers.0.{name}"], padded.params[f"layers.0.{name}"]
        assert x.shape == shape == tuple(d.value for d in t.shape), name
        lay = even.params[f"layers.0.{name}"]
        assert lay.parts % 2 == 0, name  # even blocks: one half per device
        n = params[f"layers.0.{name}"].shape[lay.axis]
        kept = np.take(x, range(n), axis=lay.axis)
        np.testing.assert_array_equal(kept, params[f"layers.0.{name}"])
        assert not np.take(x, range(n, x.shape[lay.axis]), axis=lay.axis).any()  # zeros
    kv = padded.graphs["decode"].states["kv"].type.shape[3]
    assert kv.value == 4 and even.states["kv"].parts == 4
    assert (
        pad_uneven(program, params, mesh_plan(program, SimpleNamespace(shape={"tp": 3})))[1]
        is params
    )  # 3 devices: even already, nothing padded


def test_params_and_cache_are_sharded_by_the_plan(jax_run):
    cks, report = jax_run
    base = report["runs"][cks[0]]  # tiny Llama: dim 64, 8 heads x 8, 2 KV heads, ffn 128
    assert base["shards"]["layers.0.wq"] == [[32, 64], [32, 64]]
    assert base["shards"]["layers.0.wo"] == [[64, 32], [64, 32]]
    assert base["shards"]["layers.0.down"] == [[64, 64], [64, 64]]
    assert base["shards"]["embed"] == [[128, 64], [128, 64]]  # vocab-parallel
    assert base["shards"]["lm_head"] == [[128, 64], [128, 64]]
    qwen2 = report["runs"][cks[4]]  # vocab 160, the head tied to the embedding
    assert qwen2["shards"]["embed"] == [[80, 64], [80, 64]] and "lm_head" not in qwen2["shards"]
    gpt2 = report["runs"][cks[7]]  # vocab 199 does not divide by 2: whole, tied head too
    assert gpt2["shards"]["wte"] == [[199, 64], [199, 64]]
    assert base["state_specs"]["kv"].endswith("None, None, None, 'tp')")  # KV heads
    kv3 = report["runs"][cks[-1]]  # padded: 4 KV groups of 3 query heads, ffn 100
    assert kv3["shards"]["layers.0.wq"] == [[48, 72], [48, 72]]
    assert kv3["shards"]["layers.0.wk"] == [[16, 72], [16, 72]]
    assert kv3["shards"]["layers.0.down"] == [[72, 50], [72, 50]]
    kv1 = report["runs"][cks[1]]  # one KV head: k/v and the cache replicated
    assert kv1["shards"]["layers.0.wk"] == [[16, 64], [16, 64]]  # head_dim 64 / 4
    assert "tp" not in kv1["state_specs"]["kv"]

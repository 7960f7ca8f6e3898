"""Tensor parallel on JAX (issue 19): two host devices (XLA_FLAGS, set before jax starts, so
in a process of its own: tests/parallel/jax_worker.py), params and cache sharded by the plan
derived from the Core IR, collectives left to XLA; against the same checkpoint on one device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.numeric import assert_within
from tests.tiny_decoders import build_tiny

CHECKPOINTS = [("llama", "base"), ("llama", "kv1"), ("qwen3", "base"), ("gpt2", "base")]
WORKER = Path(__file__).with_name("jax_worker.py")


@pytest.fixture(scope="module")
def jax_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("jax-tp")
    cks = [str(build_tiny(a, v, out_dir=root)) for a, v in CHECKPOINTS]
    out = root / "report.json"
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    done = subprocess.run(
        [sys.executable, str(WORKER), str(out), *cks], env=env, capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return cks, json.loads(out.read_text())


@pytest.mark.parametrize("index", range(len(CHECKPOINTS)), ids=[f"{a}-{v}" for a, v in CHECKPOINTS])
def test_two_devices_match_one(jax_run, index):
    cks, report = jax_run
    assert report["devices"] == 2
    run = report["runs"][cks[index]]
    assert run["finite"]
    assert_within(run["max_abs_diff"], 1e-5 * run["max_abs_logit"])
    assert run["tokens_two"] == run["tokens_one"]
    assert run["all_reduce_in_hlo"]  # XLA partitioned the program: not two full copies


def test_params_and_cache_are_sharded_by_the_plan(jax_run):
    cks, report = jax_run
    base = report["runs"][cks[0]]  # tiny Llama: dim 64, 8 heads x 8, 2 KV heads, ffn 128
    assert base["shards"]["layers.0.wq"] == [[32, 64], [32, 64]]
    assert base["shards"]["layers.0.wo"] == [[64, 32], [64, 32]]
    assert base["shards"]["layers.0.down"] == [[64, 64], [64, 64]]
    assert base["shards"]["embed"] == [[256, 64], [256, 64]]  # whole on each device
    assert base["state_specs"]["kv"].endswith("None, None, None, 'tp')")  # KV heads
    kv1 = report["runs"][cks[1]]  # one KV head: k/v and the cache replicated
    assert kv1["shards"]["layers.0.wk"] == [[16, 64], [16, 64]]  # head_dim 64 / 4
    assert "tp" not in kv1["state_specs"]["kv"]


def test_a_mesh_without_a_tp_axis_is_refused(jax_run):
    assert "axis named 'tp'" in jax_run[1]["no_tp_axis"]

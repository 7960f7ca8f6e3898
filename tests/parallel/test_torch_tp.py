"""Tensor parallel on PyTorch (issue 19): two CPU processes over gloo against one process.

The plan is derived from the Core IR (`linnet/shard/analysis.py`); these tests check what it
derives, then run tiny random checkpoints split over two ranks (processes started with
torchrun's environment, `tests/parallel/launch.py`) against the single-process model in the
same mode: forward logits within 1e-5 of the largest logit, the same greedy tokens (which are
also transformers'), each rank holding its share of the weights. Bad configurations and a
rank that dies end every rank with an error, not a hang. GPT-OSS and SmolLM2 over ranks:
test_torch_tp_models.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

import linnet.torch
from linnet.shard.analysis import derive_plan
from linnet.shard.layout import ShardingError
from linnet.shard.rewrite import local_program
from linnet.source import Source
from tests import tiny_decoders
from tests.numeric import assert_within
from tests.parallel.launch import run_ranks
from tests.tiny_decoders import build_tiny, probe_ids, reference_greedy

CHECKPOINTS = [
    ("llama", "base"),  # GQA 8 heads / 2 KV: both split
    ("llama", "kv1"),  # KV heads fewer than ranks: replicated per rank
    ("llama", "kv3"),  # 9 heads / 3 KV heads, ffn 99: uneven, 2 + 1 KV groups, 50 + 49 rows
    ("llama", "attn_bias"),  # biases on column (q, k, v) and row-parallel (o) linears
    ("mistral", "base"),  # sliding window
    ("qwen2", "base"),  # q/k/v biases without an o bias, tied head
    ("qwen3", "base"),  # per-head q/k norms
    ("phi3", "base"),  # fused qkv / gate_up in the checkpoint: read whole, then cut
    ("gpt2", "base"),  # another family: Conv1D weights, layer norm, learned positions, tied
]
MODES = ["interpret", "generated"]
NEW_TOKENS = 6


def _plan(arch: str, variant: str, world: int, **over):
    fields = dict(tiny_decoders.tiny_fields(arch, variant), **over)
    fields.setdefault("act", "f32")
    src = Source.load(f"zoo/{'gpt2' if arch == 'gpt2' else 'llama'}.linnet")
    return derive_plan(src.program(src.config(fields)), world)


def test_plan_is_derived_from_the_ir_column_then_row_parallel():
    plan = _plan("llama", "base", 2)
    for i in range(2):
        for name in ("wq", "wk", "wv", "gate", "up"):
            lay = plan.params[f"layers.{i}.{name}"]
            assert (lay.axis, lay.parts) == (0, 2), name
        for name in ("wo", "down"):
            lay = plan.params[f"layers.{i}.{name}"]
            assert (lay.axis, lay.parts) == (1, 2), name
        assert plan.params[f"layers.{i}.attn_norm"] is None
    embed = plan.params["embed"]  # vocab-parallel: each rank gathers its tokens' rows
    assert (embed.axis, embed.parts) == (0, 2)
    head = plan.params["lm_head"]  # vocab-parallel: its logits are gathered at the end
    assert (head.axis, head.parts) == (0, 2)
    kv = plan.states["kv"]
    assert (kv.axis, kv.parts) == (3, 2)  # [layers, 2, B, n_kv, N, head_dim]: the KV heads


def test_plan_gpt2_splits_its_fused_free_projections_and_biases():
    plan = _plan("gpt2", "base", 2)
    assert (plan.params["layers.0.bq"].axis, plan.params["layers.0.b_fc"].axis) == (0, 0)
    assert plan.params["layers.0.w_proj"].axis == 1
    assert plan.params["layers.0.b_proj"] is None  # added once, after the all_reduce
    assert plan.params["wte"] is None  # vocab 199 over 2: the embedding and tied head whole
    assert plan.params["wpe"] is None  # gathered by positions, not the token ids
    even = _plan("gpt2", "base", 2, vocab=200)
    assert (even.params["wte"].axis, even.params["wte"].parts) == (0, 2)


def test_vocab_parallel_embedding_tied_or_not_and_kept_whole_when_the_vocab_does_not_divide():
    """The embedding is split on its vocab rows where the world divides them; a head tied to
    it (Qwen2, SmolLM2) is then split alike; 255 rows over 2 (or 256 over 3) stay whole."""
    tied = _plan("qwen2", "base", 2)  # vocab 160, lm_head = embed
    assert "lm_head" not in tied.params
    assert (tied.params["embed"].axis, tied.params["embed"].parts) == (0, 2)
    assert "embed: vocab-parallel, axis 0 in 2" in tied.describe()
    graph = local_program(tied, rank=1).graphs["forward"]
    assert graph.nodes[-1].op == "all_gather"  # the tied head's logits: each rank its rows
    take = next(n for n in graph.nodes if n.op == "take")
    assert take.inputs[0].type.shape[0].value == 80  # rank 1's rows 80-159
    assert [n.op for n in graph.nodes].index("all_reduce") > graph.nodes.index(take)
    for plan in (_plan("llama", "base", 2, vocab=255), _plan("qwen2", "base", 2, vocab=161)):
        assert plan.params["embed"] is None
        assert plan.params.get("lm_head") is None  # an uneven vocab-parallel head: whole
    assert _plan("llama", "kv3", 3).params["embed"] is None  # 256 over 3


def test_local_program_inserts_one_all_reduce_per_row_parallel_linear():
    plan = _plan("llama", "base", 2)
    local = local_program(plan, rank=1)
    graph = local.graphs["decode"]
    reduces = [n for n in graph.nodes if n.op == "all_reduce"]
    assert len(reduces) == 1 + 2 * 2  # the embedding's gather, wo and down in 2 layers
    last = graph.nodes[-1]  # the vocab-parallel logits, gathered whole
    assert last.op == "all_gather" and last.output is graph.outputs[0]
    assert local.params["lm_head"].shape[0].value == 128  # 256 vocab rows / 2
    assert [d.value for d in local.params["layers.0.wq"].shape] == [32, 64]
    assert graph.states["kv"].type.shape[3].value == 1  # 2 KV heads / 2 ranks


def test_kv_heads_fewer_than_ranks_are_shared_by_neighbouring_ranks():
    plan = _plan("llama", "base", 4)  # 8 heads, 2 KV heads, 4 ranks
    assert (plan.params["layers.0.wq"].parts, plan.params["layers.0.wk"].parts) == (4, 2)
    assert plan.states["kv"].parts == 2


def test_one_kv_head_over_two_ranks_keeps_attention_split():
    plan = _plan("llama", "kv1", 2)  # 4 heads, 1 KV head
    assert plan.params["layers.0.wq"].parts == 2  # query heads split
    assert plan.params["layers.0.wk"].parts == 1  # the KV head: one block, on both ranks
    assert (plan.params["layers.0.wo"].axis, plan.params["layers.0.wo"].parts) == (1, 2)


def _local_rows(plan, name: str) -> list[int]:
    """Each rank's size of `name`'s split axis."""
    out = []
    for rank in range(plan.world):
        shape = local_program(plan, rank).params[name].shape
        out.append(shape[plan.params[name].axis].value)
    return out


def test_kv_groups_split_unevenly_when_the_ranks_do_not_divide_them():
    plan = _plan("llama", "kv3", 2)  # 9 heads of 8, 3 KV heads: groups of 3 query heads
    assert _local_rows(plan, "layers.0.wk") == [16, 8]  # KV heads 0-1 on rank 0, 2 on rank 1
    assert _local_rows(plan, "layers.0.wq") == [48, 24]  # their query heads: 0-5, 6-8
    assert _local_rows(plan, "layers.0.wo") == [48, 24]  # row-parallel over the same heads
    assert _local_rows(plan, "layers.0.gate") == [50, 49]  # ffn 99: a row a block
    assert _local_rows(plan, "layers.0.down") == [50, 49]
    kv = [local_program(plan, r).graphs["decode"].states["kv"].type.shape[3] for r in (0, 1)]
    assert [d.value for d in kv] == [2, 1]
    assert "axis 0 in 3, uneven: 2+1 blocks by rank" in plan.describe()
    plan = _plan("llama", "mha", 3)  # 4 heads, 4 KV heads over 3 ranks: 2 + 1 + 1
    assert _local_rows(plan, "layers.0.wk") == [32, 16, 16]
    assert _local_rows(plan, "layers.0.up") == [43, 43, 42]  # ffn 128 over 3


@pytest.mark.parametrize(
    "arch,variant,world,what",
    [
        ("llama", "base", 3, "2 heads"),  # 2 KV heads: 3 ranks neither share nor split them
        ("llama", "tied", 4, "6 heads"),  # KV heads shared, query heads uneven
        ("llama", "tied", 3, "2 heads"),
    ],
)
def test_heads_not_divisible_is_a_clear_error(arch, variant, world, what):
    with pytest.raises(ShardingError, match=f"{what} do not split over {world} ranks"):
        _plan(arch, variant, world)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tp-tiny")


@pytest.fixture(scope="module")
def tp_run(tiny_dir, tmp_path_factory):
    """One two-rank run over every checkpoint and mode (one process group)."""
    cks = [build_tiny(a, v, out_dir=tiny_dir) for a, v in CHECKPOINTS]
    out = tmp_path_factory.mktemp("tp-out")
    job = dict(checkpoints=[str(c) for c in cks], modes=MODES, new_tokens=NEW_TOKENS)
    job["ids"] = probe_ids(160).tolist()  # within every tiny vocab
    job["packed"] = [[str(cks[0]), "q8_0"]]  # tiny Llama: halves of 64 and 128 are whole blocks
    codes, reports, logs = run_ranks(2, out, job)
    assert codes == [0, 0], "\n".join(logs)
    return cks, out, reports, job


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("index", range(len(CHECKPOINTS)), ids=[f"{a}-{v}" for a, v in CHECKPOINTS])
def test_two_ranks_match_one(tp_run, index, mode):
    cks, out, reports, job = tp_run
    _matches_one_process(cks[index], mode, out, reports, job)


def _matches_one_process(ck, mode, out, reports, job) -> None:
    """Rank 0's logits within 1e-5 of the largest single-process logit; every rank's greedy
    tokens the single process's, which are transformers'."""
    ids = torch.tensor(job["ids"])
    single = linnet.torch.load(ck, dtype="f32", mode=mode)
    want = single.forward(ids)
    got = torch.load(out / f"{ck.name}-{mode}.pt")
    assert got.shape == want.shape
    bound = 1e-5 * float(want.abs().max())
    assert_within(float((got - want).abs().max()), bound)
    tokens = single.generate(ids, NEW_TOKENS).tolist()
    ref = reference_greedy(ck, ids, NEW_TOKENS).tolist()
    assert tokens == ref
    for rank in (0, 1):
        assert reports[rank]["runs"][f"{ck.name}:{mode}"]["tokens"] == tokens


def test_each_rank_holds_its_share_of_the_weights(tp_run):
    cks, out, reports, job = tp_run
    for ck, (arch, variant) in zip(cks, CHECKPOINTS, strict=True):
        full = linnet.torch.load(ck, dtype="f32")
        plan = derive_plan(full.source.program(full.config), 2)
        for rank in (0, 1):
            share = _share(full.params, plan, rank, lambda t: t.numel())
            assert reports[rank]["param_elements"][ck.name] == share, (arch, variant, rank)
            assert share < sum(t.numel() for t in full.params.values())


def _share(params, plan, rank: int, size) -> int:
    """What `rank` holds of `params`, counted by `size` (elements or bytes)."""
    from linnet.shard.layout import local_range

    total = 0
    for name, t in params.items():
        lay = plan.params.get(name)
        if lay is None:
            total += size(t)
            continue
        lo, hi = local_range(t.shape[lay.axis], lay, rank, plan.world)
        total += size(t) * (hi - lo) // t.shape[lay.axis]
    return total


def test_packed_q8_0_over_two_ranks_matches_one_device(tp_run):
    cks, out, reports, job = tp_run
    ck, ids = cks[0], torch.tensor(job["ids"])
    single = linnet.torch.load(ck, dtype="q8_0", mode="generated")
    assert any(type(p).__name__ == "PackedWeight" for p in single.params.values())
    want = single.forward(ids)
    got = torch.load(out / f"{ck.name}-generated-q8_0.pt")
    assert_within(float((got - want).abs().max()), 1e-5 * float(want.abs().max()))
    tokens = single.generate(ids, NEW_TOKENS).tolist()
    for rank in (0, 1):
        assert reports[rank]["runs"][f"{ck.name}:generated:q8_0"]["tokens"] == tokens


def test_a_packed_split_that_cuts_blocks_is_refused():
    from linnet.shard.packed import check_blocks

    plan = _plan("llama", "base", 4)  # wo's 64 input columns: 16 per rank, q8_0 packs 32
    with pytest.raises(ShardingError, match="layers.0.wo's 64 columns over 4 ranks"):
        check_blocks(plan.program, plan.params, "q8_0")
    check_blocks(plan.program, _plan("llama", "base", 2).params, "q8_0")  # 32 per rank: whole


@pytest.mark.parametrize("mode", ["compile", "cudagraphs"])
def test_compiled_modes_are_refused_before_any_group_is_joined(tiny_dir, mode):
    ck = build_tiny("llama", "base", out_dir=tiny_dir)
    with pytest.raises(ShardingError, match=f"not {mode}: compiling the rank's collectives"):
        linnet.torch.load(ck, dtype="f32", mode=mode, tensor_parallel=2)


def test_bad_config_fails_on_every_rank(tiny_dir, tmp_path):
    ck = build_tiny("llama", "base", out_dir=tiny_dir)  # 2 KV heads over 3 ranks
    job = dict(checkpoints=[str(ck)], modes=["interpret"], new_tokens=1, ids=[[1, 2]])
    codes, reports, logs = run_ranks(3, tmp_path, job, timeout_s=300)
    assert codes == [1, 1, 1], "\n".join(logs)
    for r in reports:
        assert "ShardingError" in r["error"] and "2 heads do not split over 3 ranks" in r["error"]


def test_a_rank_that_dies_ends_the_others_with_an_error(tiny_dir, tmp_path):
    ck = build_tiny("llama", "base", out_dir=tiny_dir)
    job = dict(checkpoints=[str(ck)], modes=["interpret"], new_tokens=1, ids=[[1, 2]])
    job["die_rank"] = 1
    codes, reports, logs = run_ranks(2, tmp_path, job, timeout_s=300, tp_timeout_s=20)
    assert codes[1] == 3 and reports[1] is None  # died without a word
    assert codes[0] == 1, "\n".join(logs)
    assert reports[0]["error"], reports[0]


def test_a_cuda_rank_runs_on_its_own_gpu(monkeypatch):
    """`device="cuda"` is cuda:LOCAL_RANK (NCCL refuses two ranks on one GPU), made current."""
    from linnet.shard import torch_tp

    current = []
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert torch_tp.rank_device("cuda") == "cuda:1" and current[-1] == torch.device("cuda", 1)
    assert torch_tp.rank_device("cuda:0") == "cuda:0" and current[-1] == torch.device("cuda", 0)
    assert torch_tp.rank_device("cpu") == "cpu" and len(current) == 2


NCCL_NEEDS = "tensor parallel over NCCL needs two CUDA devices"


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason=NCCL_NEEDS)
def test_two_ranks_over_nccl_match_one(tiny_dir, tmp_path):
    """Two GPU ranks (NCCL, each on its own device) against one CPU process."""
    ck = build_tiny("llama", "base", out_dir=tiny_dir)
    job = dict(checkpoints=[str(ck)], modes=["generated"], new_tokens=NEW_TOKENS, device="cuda")
    job["ids"] = probe_ids(160).tolist()
    codes, reports, logs = run_ranks(2, tmp_path, job)
    assert codes == [0, 0], "\n".join(logs)
    _matches_one_process(ck, "generated", tmp_path, reports, job)


def test_torchrun_linnet_run_tensor_parallel(tiny_dir, tmp_path):
    from tests.tiny_tokenizer import add_tiny_tokenizer

    ck = tmp_path / "llama"
    shutil.copytree(build_tiny("llama", "base", out_dir=tiny_dir), ck)
    add_tiny_tokenizer(ck)
    args = [
        "-m",
        "linnet",
        "run",
        str(ck),
        "--no-chat",
        "--prompt",
        "w5 w9 w11",
        "--max-new-tokens",
        "5",
        "--dtype",
        "f32",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", LINNET_TP_TIMEOUT="60")
    one = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=300
    )
    assert one.returncode == 0, one.stderr
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(_port()),
        *args,
        "--tensor-parallel",
        "2",
    ]
    two = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert two.returncode == 0, two.stderr
    assert two.stdout.strip() == one.stdout.strip() and one.stdout.strip()


def _port() -> int:
    from tests.parallel.launch import free_port

    return free_port()


def test_onnx_refuses_a_rank_program_clearly():
    from linnet.backends.onnx.graph import prepare, to_model
    from linnet.errors import UnsupportedArchitecture

    local = local_program(_plan("llama", "base", 2), rank=0)
    with pytest.raises(UnsupportedArchitecture, match="ONNX has no collectives"):
        to_model(prepare(local, "forward"), [], {})


@pytest.mark.parametrize("variant", ["base", "kv3"])
@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_reads_exactly_its_share_of_the_bytes(tiny_dir, rank, variant, monkeypatch):
    from linnet.shard import load
    from linnet.weights.planning import plan_checkpoint

    plan, source, config, _ = plan_checkpoint(build_tiny("llama", variant, out_dir=tiny_dir))
    shard = derive_plan(source.program(config), 2)
    whole = dict(plan.load(torch.float32))
    read = []
    sliced = load._read_slice
    monkeypatch.setattr(load, "_read_slice", lambda *a: read.append(sliced(*a)) or read[-1])
    full_read = plan.checkpoint.read
    plan.checkpoint.read = lambda name: read.append(full_read(name)) or read[-1]
    got = dict(load.rank_params(plan, shard.params, rank, 2, torch.float32))
    share = _share(whole, shard, rank, lambda t: t.nbytes)
    assert sum(x.nbytes for x in read) == share < sum(t.nbytes for t in whole.values())
    if variant == "kv3":  # rank 0: KV heads 0-1 and query heads 0-5; rank 1: the rest
        rows = {0: slice(0, 48), 1: slice(48, 72)}[rank]
        torch.testing.assert_close(got["layers.1.wq"], whole["layers.1.wq"][rows])
        torch.testing.assert_close(got["layers.1.wo"], whole["layers.1.wo"][:, rows])
        kv = {0: slice(0, 16), 1: slice(16, 24)}[rank]
        torch.testing.assert_close(got["layers.1.wk"], whole["layers.1.wk"][kv])


def test_a_rank_reads_split_tensors_as_slices_not_whole(tiny_dir):
    from linnet.shard.load import rank_params
    from linnet.weights.planning import plan_checkpoint

    plan, source, config, _ = plan_checkpoint(build_tiny("llama", "base", out_dir=tiny_dir))
    shard = derive_plan(source.program(config), 2)
    read_whole = []
    full_read = plan.checkpoint.read
    plan.checkpoint.read = lambda name: read_whole.append(name) or full_read(name)
    got = dict(rank_params(plan, shard.params, 1, 2, torch.float32))
    split = {r.hf for r in plan.rows if r.loads and shard.params.get(r.params[0]) is not None}
    assert split and not split & set(read_whole)  # every split tensor came from get_slice
    assert set(read_whole) == {r.hf for r in plan.rows if r.loads} - split
    whole = dict(plan.load(torch.float32))
    torch.testing.assert_close(got["layers.1.wq"], whole["layers.1.wq"][32:])  # rank 1's rows
    torch.testing.assert_close(got["layers.1.down"], whole["layers.1.down"][:, 64:])

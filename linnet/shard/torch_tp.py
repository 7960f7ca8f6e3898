"""Tensor parallel on PyTorch: one process per rank (torchrun), gloo on CPU, NCCL on GPUs.

    # torchrun --nproc-per-node 2 script.py
    model = linnet.torch.load(path, tensor_parallel=2)     # this process's rank

Every rank derives the same plan from the same source and config (`analysis.py`), builds
its local program (`rewrite.py`), reads its blocks of the checkpoint (`load.py`) and runs
the ordinary PyTorch runners; the generated code and the interpreter call
`torch.distributed.all_reduce` where the plan put one. Collectives time out after
`LINNET_TP_TIMEOUT` seconds (default 60), so a rank that dies ends the others with an error.
"""

from __future__ import annotations

import atexit
import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from linnet.backends.torch.quantized import allow_int8_activations
from linnet.quantize import packed_dtype, quantize_params
from linnet.runtime import TorchModel
from linnet.shard.analysis import derive_plan
from linnet.shard.layout import ShardingError
from linnet.shard.load import rank_params
from linnet.shard.packed import check_blocks
from linnet.shard.rewrite import local_program
from linnet.weights.checkpoint import is_gguf
from linnet.weights.planning import plan_checkpoint


def rank_device(device="cpu") -> str:
    """The device this rank runs on: `cuda` without an index is the rank's own GPU,
    cuda:LOCAL_RANK as torchrun numbers them (NCCL refuses two ranks on one GPU), made the
    current CUDA device before the group is joined."""
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    if d.type == "cuda":
        torch.cuda.set_device(d)
    return str(d)  # the device as callers name it ("cpu", "cuda:1")


def init_group(world: int, device="cpu") -> int:
    """Join (or check) the default process group; this process's rank."""
    if not dist.is_initialized():
        if "RANK" not in os.environ:
            raise ShardingError(
                f"tensor_parallel={world} needs one process per rank: launch with "
                f"`torchrun --nproc-per-node {world} ...`"
            )
        backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
        timeout = timedelta(seconds=float(os.environ.get("LINNET_TP_TIMEOUT", "60")))
        dist.init_process_group(backend, timeout=timeout)
        # gloo's threads must stop before the interpreter does, or the rank aborts at exit
        # ("terminate called without an active exception") and torchrun reports a failure
        atexit.register(_leave_group)
    if dist.get_world_size() != world:
        raise ShardingError(
            f"tensor_parallel={world} but the process group has {dist.get_world_size()} ranks"
        )
    return dist.get_rank()


def _check_mode(mode: str) -> None:
    if mode in ("compile", "cudagraphs"):
        raise ShardingError(
            f"tensor parallel runs modes interpret and generated, not {mode}: compiling the "
            "rank's collectives (torch.compile over torch.distributed.all_reduce, CUDA graphs "
            "over NCCL) is not built or tested; use mode='generated'"
        )


def _leave_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def load_tensor_parallel(
    path: str | Path, world: int, *, dtype=None, device="cpu", numerics="equivalent",
    max_positions=None, mode="interpret",
) -> TorchModel:  # fmt: skip
    """This rank's model of a local HF checkpoint folder split over `world` ranks."""
    _check_mode(mode)
    quant = packed_dtype(dtype)
    if quant is not None and is_gguf(path):
        raise ShardingError(
            "tensor parallel reads its slices from safetensors headers; a .gguf file's packed "
            f"tensors cannot be sliced: load the HF folder with dtype={quant!r}"
        )
    plan, source, config, hf_config = plan_checkpoint(
        path, dtype="f32" if quant else dtype, max_positions=max_positions
    )
    program = source.program(config)
    shard = derive_plan(program, world)  # before any collective: a bad config fails alike
    if quant is not None:
        check_blocks(program, shard.params, quant, world)
    device = rank_device(device)
    rank = init_group(world, device)
    torch_dtype = getattr(
        torch, {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}[config["act"]]
    )
    params = {n: t.to(device) for n, t in rank_params(plan, shard.params, rank, world, torch_dtype)}
    if quant is not None:  # this rank's dense blocks, packed as one device packs the whole
        params = quantize_params(params, quant)
        allow_int8_activations(params, numerics)
    model = TorchModel(
        source, config, params, device=device, numerics=numerics, mode=mode,
        hf_config=hf_config, program=local_program(shard, rank),
    )  # fmt: skip
    model.shard_plan, model.rank = shard, rank
    return model

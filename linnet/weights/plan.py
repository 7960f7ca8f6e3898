"""The load plan: match a checkpoint's tensors to a source's params, from headers only.

`make_plan` reads the safetensors headers (never tensor data) and checks, before
anything is loaded, that every param the source expects is covered exactly once,
that every HF tensor is mapped or declared ignorable, that each tensor's shape is
what the weights map's inverse transform of its params' shapes gives, and that its
dtype is a float dtype. Each problem names the tensor at fault. `Plan.load`
then streams params one HF tensor at a time.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from linnet.core.dtypes import DTYPES
from linnet.core.dtypes import FLOAT_DTYPES as ACT_DTYPES
from linnet.errors import CheckpointError, ConfigError
from linnet.weights.maps import WeightsMap
from linnet.weights.plan_checks import (
    HF_NAMES,
    ROW_CHECKS,
    NameFormat,
    PlanContext,
    Problem,
    missing_problems,
    shape_text,
)
from linnet.weights.safetensors_io import Checkpoint
from linnet.weights.tensor_group import TensorGroup

DTYPE_NAMES = {name: DTYPES[name].numpy for name in ACT_DTYPES}  # what a plan may cast to


def _natural(name: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


@dataclass
class Plan:
    checkpoint: Checkpoint
    weights_map: WeightsMap
    config: dict[str, Any] | None
    dtype: str
    rows: list[TensorGroup]
    problems: list[Problem]
    params: dict[str, tuple[int, ...]]
    tied: dict[str, str]

    @property
    def architecture(self) -> str:
        return self.weights_map.architecture

    @property
    def source(self) -> str:
        return self.weights_map.source

    def check(self) -> Plan:
        """Raise CheckpointError for the first problem (with a count of the rest)."""
        if self.problems:
            first = self.problems[0]
            more = len(self.problems) - 1
            msg = f"{self.checkpoint.folder}: {first}"
            if more:
                msg += f" (and {more} more problem{'s' if more > 1 else ''}; see the plan)"
            raise CheckpointError(msg, tensor=first.tensor, file=str(self.checkpoint.folder))
        return self

    def load(self, torch_dtype: Any = None, mxfp4: Any = None) -> Iterator[tuple[str, Any]]:
        """Stream (param name, torch.Tensor) pairs, one HF tensor at a time: read it,
        transform, cast to `torch_dtype` (default: the plan's dtype), yield its params.
        mxfp4: an MXFP4 pair that is one param as stored goes to `mxfp4(blocks, scales,
        torch_dtype)` undecoded (the PyTorch backend keeps it packed)."""
        import torch

        self.check()
        if torch_dtype is None:
            torch_dtype = self.dtype
        if isinstance(torch_dtype, str):
            torch_dtype = getattr(torch, DTYPE_NAMES.get(torch_dtype, torch_dtype))
        for row in self.rows:
            if not row.loads:
                continue
            pair = self.checkpoint.packed.get(row.hf)
            if mxfp4 is not None and pair and not row.transform and len(row.params) == 1:
                blocks, scales = (self.checkpoint.read(n) for n in pair)
                yield row.params[0], mxfp4(blocks, scales, torch_dtype)
                continue
            x = self.checkpoint.read(row.hf)
            parts = row.rule.forward(x, row.sizes)
            del x
            for name, part in zip(row.params, parts, strict=True):
                yield name, part.to(torch_dtype).contiguous()
            del parts

    def load_numpy(self, dtype: str | None = None) -> Iterator[tuple[str, Any]]:
        """Like `load`, without torch: stream (param name, numpy array) pairs cast to `dtype`
        ("f32", "bf16" or "f16"; default the plan's), bf16 as `ml_dtypes.bfloat16`."""
        import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
        import numpy as np

        self.check()
        target = np.dtype(DTYPE_NAMES[dtype or self.dtype])
        for row in self.rows:
            if not row.loads:
                continue
            x = self.checkpoint.read_numpy(row.hf)
            parts = row.rule.forward(x, row.sizes)
            del x
            for name, part in zip(row.params, parts, strict=True):
                yield name, np.ascontiguousarray(part, dtype=target)
            del parts

    def format(self) -> str:
        """A readable table: architecture, source, config, then one row per HF tensor."""
        lines = [
            f"architecture  {self.architecture}  (weights map {self.weights_map.path.name})",
            f"source        {self.source}",
        ]
        if self.config is not None:
            cfg = " ".join(f"{k}={v}" for k, v in self.config.items())
            lines.append(f"config        {cfg}")
        files = self.checkpoint.files
        lines.append(f"dtype         {self.dtype}")
        lines.append(
            f"files         {files[0].name}"
            + (f" (+{len(files) - 1} shards)" if len(files) > 1 else "")
        )
        lines.append("")
        table = [("HF tensor", "shape", "dtype", "transform", "params")]
        for r in self.rows:
            target = ", ".join(r.params) if r.params else ""
            if r.note:
                target = f"{target} ({r.note})" if target else f"({r.note})"
            table.append((r.hf, shape_text(r.shape), r.dtype, r.transform or "-", target))
        widths = [max(len(row[k]) for row in table) for k in range(4)]
        for row in table:
            lines.append(
                "  ".join(c.ljust(w) for c, w in zip(row[:4], widths, strict=True)) + "  " + row[4]
            )
        n_load = sum(r.loads for r in self.rows)
        n_params = sum(len(r.params) for r in self.rows if r.loads)
        n_ignored = sum(1 for r in self.rows if r.note and "ignored" in r.note)
        lines.append("")
        lines.append(f"{n_load} tensors -> {n_params} params; {n_ignored} ignored")
        if self.problems:
            lines.append(f"{len(self.problems)} problem(s):")
            lines.extend(f"  - {p}" for p in self.problems)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def make_plan(
    checkpoint: Checkpoint,
    weights_map: WeightsMap,
    params: Mapping[str, tuple[int, ...]],
    tied: Mapping[str, str] | None = None,
    dtype: str = "bf16",
    *,
    config: dict[str, Any] | None = None,
    names: NameFormat = HF_NAMES,
) -> Plan:
    """Match `checkpoint`'s tensors to the source's `params` (name -> shape) through
    `weights_map`, reading headers only. `tied` maps a param to the param it aliases (it
    needs no tensor). `config`: the translated source config, shown by `format()`
    (by default it is translated from the checkpoint's config.json). `names`: how the
    checkpoint names its tensors (HF's, or GGUF's for a GGUF file)."""
    if config is None:
        try:
            config = weights_map.translate_config(checkpoint.read_config(), checkpoint.headers())
        except ConfigError:
            config = None
    if dtype not in DTYPE_NAMES:
        raise ConfigError(f"dtype {dtype!r}: expected one of {', '.join(DTYPE_NAMES)}")
    headers = checkpoint.headers()
    ctx = PlanContext(
        weights_map,
        {k: tuple(int(d) for d in v) for k, v in params.items()},
        dict(tied or {}),
        names,
        headers,
    )
    rows, problems = [], []
    for name in sorted(headers, key=_natural):
        row = TensorGroup(name, tuple(headers[name].shape), headers[name].dtype)
        rows.append(row)
        for check in ROW_CHECKS:
            verdict = check(ctx, row)
            if verdict is not None:
                row.note, problem = verdict
                problems += [problem] if problem is not None else []
                break
    problems += missing_problems(ctx, _natural)
    return Plan(checkpoint, weights_map, config, dtype, rows, problems, ctx.params, ctx.tied)

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
from dataclasses import dataclass, field
from typing import Any

from linnet.core.dtypes import DTYPES
from linnet.core.dtypes import FLOAT_DTYPES as ACT_DTYPES
from linnet.errors import CheckpointError, ConfigError
from linnet.weights.maps import Rule, WeightsMap
from linnet.weights.safetensors_io import FLOAT_DTYPES, Checkpoint

DTYPE_NAMES = {name: DTYPES[name].numpy for name in ACT_DTYPES}  # what a plan may cast to


class Problem(str):
    """One plan problem: a message (it is a str) that names `tensor`."""

    tensor: str | None

    def __new__(cls, message: str, tensor: str | None = None) -> Problem:
        obj = super().__new__(cls, message)
        obj.tensor = tensor
        return obj


@dataclass
class PlanRow:
    """One HF tensor of the checkpoint and what becomes of it."""

    hf: str
    shape: tuple[int, ...]
    dtype: str
    transform: str
    params: tuple[str, ...]
    note: str = ""  # "ignored", "tied duplicate, ignored", or a problem
    rule: Rule | None = field(default=None, repr=False)
    sizes: list[int] | None = field(default=None, repr=False)

    @property
    def loads(self) -> bool:
        return self.rule is not None and not self.note


def _natural(name: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _shape_text(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


@dataclass
class Plan:
    checkpoint: Checkpoint
    weights_map: WeightsMap
    config: dict[str, Any] | None
    dtype: str
    rows: list[PlanRow]
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

    def load(self, torch_dtype: Any = None) -> Iterator[tuple[str, Any]]:
        """Stream (param name, torch.Tensor) pairs, one HF tensor at a time: read it,
        transform, cast to `torch_dtype` (default: the plan's dtype), yield its params."""
        import torch

        self.check()
        if torch_dtype is None:
            torch_dtype = self.dtype
        if isinstance(torch_dtype, str):
            torch_dtype = getattr(torch, DTYPE_NAMES.get(torch_dtype, torch_dtype))
        for row in self.rows:
            if not row.loads:
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
            table.append((r.hf, _shape_text(r.shape), r.dtype, r.transform or "-", target))
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
) -> Plan:
    """Match `checkpoint`'s tensors to the source's `params` (name -> shape) through
    `weights_map`, reading headers only. `tied` maps a param to the param it aliases (it
    needs no tensor). `config`: the translated source config, shown by `format()`
    (by default it is translated from the checkpoint's config.json)."""
    tied = dict(tied or {})
    params = {k: tuple(int(d) for d in v) for k, v in params.items()}
    if config is None:
        try:
            config = weights_map.translate_config(checkpoint.read_config())
        except ConfigError:
            config = None
    if dtype not in DTYPE_NAMES:
        raise ConfigError(f"dtype {dtype!r}: expected one of {', '.join(DTYPE_NAMES)}")

    def shape_of(p: str) -> tuple[int, ...] | None:
        if p in params:
            return params[p]
        if p in tied and tied[p] in params:
            return params[tied[p]]
        return None

    expected = {p: s for p, s in params.items() if p not in tied}
    covered: dict[str, str] = {}
    rows: list[PlanRow] = []
    problems: list[Problem] = []
    src = f"the {weights_map.source} source"

    headers = checkpoint.headers()
    for name in sorted(headers, key=_natural):
        info = headers[name]
        row = PlanRow(name, info.shape, info.dtype, "", ())
        rows.append(row)
        desc = f"{info.dtype}{_shape_text(info.shape)}"
        found = weights_map.match(name, params)
        if found is None:
            if weights_map.is_ignored(name):
                row.note = "ignored"
            else:
                row.note = "unexpected"
                problems.append(
                    Problem(
                        f"unexpected tensor {name} {desc}: {weights_map.path.name} maps no "
                        "param to it and does not list it as ignorable",
                        name,
                    )
                )
            continue
        rule, bindings = found
        targets = rule.targets(bindings)
        row.rule, row.params, row.transform = rule, targets, rule.text

        # A tensor for a tied param (lm_head.weight with tied embeddings).
        if all(t in tied for t in targets):
            shapes = [shape_of(t) for t in targets]
            aliases = ", ".join(f"{t} = {tied[t]}" for t in targets)
            try:
                want = rule.hf_shape(shapes) if None not in shapes else None
            except ValueError:
                want = None
            if want == info.shape:
                row.note = "tied duplicate, ignored"
            else:
                row.note = "wrong shape"
                problems.append(
                    Problem(
                        f"tensor {name} duplicates the tied param {aliases} but has shape "
                        f"{_shape_text(info.shape)}, expected "
                        f"{_shape_text(want) if want else 'the aliased shape'}",
                        name,
                    )
                )
            continue

        unknown = [t for t in targets if t not in expected]
        if unknown:
            row.note = "unexpected"
            problems.append(
                Problem(
                    f"unexpected tensor {name} {desc}: it maps to {', '.join(unknown)}, which "
                    f"{src} does not have for this config",
                    name,
                )
            )
            continue
        dup = [t for t in targets if t in covered]
        if dup:
            row.note = "duplicate"
            problems.append(
                Problem(
                    f"tensor {name} maps to {dup[0]}, already loaded from {covered[dup[0]]}",
                    name,
                )
            )
            continue
        for t in targets:
            covered[t] = name

        shapes = [expected[t] for t in targets]
        try:
            want = rule.hf_shape(shapes)
        except ValueError as e:
            row.note = "bad rule"
            problems.append(Problem(f"tensor {name}: {e}", name))
            continue
        if want != info.shape:
            row.note = "wrong shape"
            got = " + ".join(f"{t} {_shape_text(s)}" for t, s in zip(targets, shapes, strict=True))
            problems.append(
                Problem(
                    f"tensor {name} has shape {_shape_text(info.shape)}, expected "
                    f"{_shape_text(want)} (for {got})",
                    name,
                )
            )
            continue
        if info.dtype not in FLOAT_DTYPES:
            row.note = "bad dtype"
            problems.append(
                Problem(
                    f"tensor {name} has dtype {info.dtype}; expected a float dtype "
                    f"({', '.join(FLOAT_DTYPES)})",
                    name,
                )
            )
            continue
        if rule.split_axis is not None:
            row.sizes = [s[rule.split_axis] for s in shapes]

    for p in sorted(expected, key=_natural):
        if p in covered:
            continue
        shape = _shape_text(expected[p])
        found = weights_map.rule_for_param(p)
        if found is None:
            problems.append(
                Problem(f"param {p} {shape}: no rule of {weights_map.path.name} produces it", None)
            )
            continue
        rule, bindings = found
        hf = rule.hf_name(bindings)
        if hf in headers or (
            weights_map.hf_prefix
            and hf.startswith(weights_map.hf_prefix)
            and hf[len(weights_map.hf_prefix) :] in headers
        ):
            continue  # present but rejected above; that problem names it already
        problems.append(Problem(f"missing tensor {hf} (for param {p} {shape})", hf))

    return Plan(
        checkpoint=checkpoint,
        weights_map=weights_map,
        config=config,
        dtype=dtype,
        rows=rows,
        problems=problems,
        params=params,
        tied=tied,
    )

"""The checks a load plan runs on each checkpoint tensor, and the two name formats it
plans (HF safetensors names, GGUF names).

    ctx = PlanContext(weights_map, params, tied, HF_NAMES, headers)
    for check in ROW_CHECKS:
        verdict = check(ctx, row)     # None: the next check; else (note, problem or None)

Each check is small and named for what it refuses; the first that returns a verdict
settles the row. `missing_problems` then names every param no tensor covered.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from linnet.weights.maps import Rule, WeightsMap
from linnet.weights.maps.rules import concat_shape
from linnet.weights.safetensors_io import FLOAT_DTYPES
from linnet.weights.tensor_group import TensorGroup


class Problem(str):
    """One plan problem: a message (it is a str) that names `tensor`."""

    tensor: str | None

    def __new__(cls, message: str, tensor: str | None = None) -> Problem:
        obj = super().__new__(cls, message)
        obj.tensor = tensor
        return obj


def shape_text(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


@dataclass(frozen=True)
class NameFormat:
    """How a checkpoint format names tensors and stores a rule's params."""

    label: str  # "tensor", "GGUF tensor"
    match: Callable[[WeightsMap, str, Mapping], tuple[Rule, dict] | None]
    ignorable: Callable[[WeightsMap, str], bool]
    # (map, rule, bindings, the params' shapes) -> the stored shape; ValueError if none fits
    stored_shape: Callable[[WeightsMap, Rule, dict, list], tuple[int, ...]]
    name_of: Callable[[Rule, dict], str | None]
    float_only: bool  # GGUF stores quantized blocks too


def _hf_stored_shape(weights_map: WeightsMap, rule: Rule, values: dict, shapes: list):
    return rule.hf_shape(shapes)


def _gguf_stored_shape(weights_map: WeightsMap, rule: Rule, values: dict, shapes: list):
    # the params joined in the source's layout, then [gguf.transforms] (a transpose moves
    # axes; the rope permutation keeps the shape)
    joined = shapes[0] if rule.split_axis is None else concat_shape(shapes, rule.split_axis)
    return weights_map.gguf.shape_for(rule.gguf_name(values), joined)


HF_NAMES = NameFormat(
    "tensor",
    match=lambda m, name, params: m.match(name, params),
    ignorable=lambda m, name: m.is_ignored(name),
    stored_shape=_hf_stored_shape,
    name_of=lambda rule, b: rule.hf_name(b),
    float_only=True,
)
GGUF_NAMES = NameFormat(
    "GGUF tensor",
    match=lambda m, name, params: m.match_gguf(name),
    ignorable=lambda m, name: name in m.gguf.extra,  # computed from the config
    stored_shape=_gguf_stored_shape,
    name_of=lambda rule, b: rule.gguf_name(b),
    float_only=False,
)


@dataclass
class PlanContext:
    weights_map: WeightsMap
    params: dict[str, tuple[int, ...]]  # what the source expects (tied ones included)
    tied: dict[str, str]
    names: NameFormat
    headers: Mapping[str, Any]
    covered: dict[str, str] = field(default_factory=dict)  # param -> the tensor that loads it
    expected: dict[str, tuple[int, ...]] = field(init=False)  # the params a tensor must give

    def __post_init__(self) -> None:
        self.expected = {p: s for p, s in self.params.items() if p not in self.tied}

    def shape_of(self, p: str) -> tuple[int, ...] | None:
        if p in self.params:
            return self.params[p]
        return self.params.get(self.tied.get(p, ""))


Verdict = tuple[str, Problem | None] | None


def _desc(row: TensorGroup) -> str:
    return f"{row.dtype}{shape_text(row.shape)}"


def unmapped(ctx: PlanContext, row: TensorGroup) -> Verdict:
    """A tensor no rule maps: ignorable, or unexpected."""
    found = ctx.names.match(ctx.weights_map, row.hf, ctx.params)
    if found is None:
        if ctx.names.ignorable(ctx.weights_map, row.hf):
            return "ignored", None
        return "unexpected", Problem(
            f"unexpected {ctx.names.label} {row.hf} {_desc(row)}: "
            f"{ctx.weights_map.path.name} maps no param to it and does not list it as "
            "ignorable",
            row.hf,
        )
    row.rule, row.bindings = found
    row.params, row.transform = row.rule.targets(row.bindings), row.rule.text
    return None


def tied_duplicate(ctx: PlanContext, row: TensorGroup) -> Verdict:
    """A tensor for a tied param (lm_head.weight with tied embeddings): ignored if its
    shape is the aliased param's."""
    if not all(t in ctx.tied for t in row.params):
        return None
    shapes = [ctx.shape_of(t) for t in row.params]
    try:
        want = None
        if None not in shapes:
            want = ctx.names.stored_shape(ctx.weights_map, row.rule, row.bindings, shapes)
    except ValueError:
        want = None
    if want == row.shape:
        return "tied duplicate, ignored", None
    aliases = ", ".join(f"{t} = {ctx.tied[t]}" for t in row.params)
    return "wrong shape", Problem(
        f"{ctx.names.label} {row.hf} duplicates the tied param {aliases} but has shape "
        f"{shape_text(row.shape)}, expected {shape_text(want) if want else 'the aliased shape'}",
        row.hf,
    )


def unknown_params(ctx: PlanContext, row: TensorGroup) -> Verdict:
    """A tensor for params this config of the source does not have."""
    unknown = [t for t in row.params if t not in ctx.expected]
    if not unknown:
        return None
    return "unexpected", Problem(
        f"unexpected {ctx.names.label} {row.hf} {_desc(row)}: it maps to "
        f"{', '.join(unknown)}, which the {ctx.weights_map.source} source does not have for "
        "this config",
        row.hf,
    )


def already_loaded(ctx: PlanContext, row: TensorGroup) -> Verdict:
    """Two tensors for one param; else the row's params count as covered."""
    dup = [t for t in row.params if t in ctx.covered]
    if dup:
        return "duplicate", Problem(
            f"{ctx.names.label} {row.hf} maps to {dup[0]}, already loaded from "
            f"{ctx.covered[dup[0]]}",
            row.hf,
        )
    for t in row.params:
        ctx.covered[t] = row.hf
    row.shapes = tuple(ctx.expected[t] for t in row.params)
    return None


def wrong_shape(ctx: PlanContext, row: TensorGroup) -> Verdict:
    """A stored shape that the params' shapes do not give."""
    try:
        want = ctx.names.stored_shape(ctx.weights_map, row.rule, row.bindings, list(row.shapes))
    except ValueError as e:
        return "bad rule", Problem(f"{ctx.names.label} {row.hf}: {e}", row.hf)
    if want == row.shape:
        return None
    got = " + ".join(f"{t} {shape_text(s)}" for t, s in zip(row.params, row.shapes, strict=True))
    return "wrong shape", Problem(
        f"{ctx.names.label} {row.hf} has shape {shape_text(row.shape)}, expected "
        f"{shape_text(want)} (for {got})",
        row.hf,
    )


def not_float(ctx: PlanContext, row: TensorGroup) -> Verdict:
    """A safetensors tensor that is not F32, F16 or BF16."""
    if not ctx.names.float_only or row.dtype in FLOAT_DTYPES:
        return None
    return "bad dtype", Problem(
        f"{ctx.names.label} {row.hf} has dtype {row.dtype}; expected a float dtype "
        f"({', '.join(FLOAT_DTYPES)})",
        row.hf,
    )


ROW_CHECKS: tuple[Callable[[PlanContext, TensorGroup], Verdict], ...] = (
    unmapped,
    tied_duplicate,
    unknown_params,
    already_loaded,
    wrong_shape,
    not_float,
)


def _present(ctx: PlanContext, name: str) -> bool:
    prefix = ctx.weights_map.hf_prefix
    if name in ctx.headers:
        return True
    return bool(prefix) and name.startswith(prefix) and name[len(prefix) :] in ctx.headers


def missing_problems(ctx: PlanContext, order: Callable) -> list[Problem]:
    """A problem for each expected param that no tensor covered."""
    out = []
    for p in sorted(ctx.expected, key=order):
        if p in ctx.covered:
            continue
        shape = shape_text(ctx.expected[p])
        found = ctx.weights_map.rule_for_param(p)
        if found is None:
            out.append(
                Problem(f"param {p} {shape}: no rule of {ctx.weights_map.path.name} produces it")
            )
            continue
        name = ctx.names.name_of(*found)
        if name is not None and _present(ctx, name):
            continue  # present but rejected above; that problem names it already
        out.append(Problem(f"missing {ctx.names.label} {name} (for param {p} {shape})", name))
    return out

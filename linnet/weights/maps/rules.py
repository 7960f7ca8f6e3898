"""Name patterns: one HF tensor pattern -> one param or several (format: docs/weights-maps.md).

    rule = Rule("model.layers.{i}.mlp.up_proj.weight", ("layers.{i}.w3",))
    bindings(rule.hf_regex.fullmatch("model.layers.3.mlp.up_proj.weight"))   # {"i": "3"}
    rule.targets({"i": "3"})                                                 # ("layers.3.w3",)

`{i}` (any `{name}`) stands for a non-negative integer; `{i+1}` for i + 1.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from linnet.weights.maps.transforms import Transform, concat, contiguous

PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?:\+([0-9]+))?\}")


def compile_pattern(pattern: str) -> tuple[re.Pattern, tuple[str, ...]]:
    """A name pattern with `{i}` placeholders -> (full-match regex, placeholder names).
    `{i+1}` stands for the number i + 1 (its group is named `i__1`: see `bindings`)."""
    out, names, pos = [], [], 0
    for m in PLACEHOLDER.finditer(pattern):
        out.append(re.escape(pattern[pos : m.start()]))
        name, offset = m.group(1), m.group(2)
        group = f"{name}__{offset}" if offset else name
        out.append(f"(?P={group})" if name in names else rf"(?P<{group}>0|[1-9][0-9]*)")
        if name not in names:
            names.append(name)
        pos = m.end()
    out.append(re.escape(pattern[pos:]))
    return re.compile("".join(out)), tuple(names)


def bindings(m: re.Match | None) -> dict[str, str] | None:
    """Placeholder values of a match, offsets removed (`{i+1}` matching 3 binds i = 2);
    None when there is no match or a number is below its offset."""
    if m is None:
        return None
    out = {}
    for group, value in m.groupdict().items():
        name, _, offset = group.partition("__")
        n = int(value) - int(offset or 0)
        if n < 0:
            return None
        out[name] = str(n)
    return out


def fill(pattern: str, values: Mapping[str, str]) -> str:
    return PLACEHOLDER.sub(lambda m: str(int(values[m.group(1)]) + int(m.group(2) or 0)), pattern)


def concat_shape(shapes: list[tuple[int, ...]], axis: int) -> tuple[int, ...]:
    """The shape of `shapes` concatenated along `axis` (ValueError when they do not fit)."""
    first = shapes[0]
    for s in shapes:
        if (
            len(s) != len(first)
            or axis >= len(s)
            or any(a != b for k, (a, b) in enumerate(zip(s, first, strict=True)) if k != axis)
        ):
            raise ValueError(
                f"params of shapes {', '.join(map(str, map(list, shapes)))} "
                f"cannot be concatenated along axis {axis}"
            )
    return tuple(sum(s[axis] for s in shapes) if k == axis else d for k, d in enumerate(first))


@dataclass
class Rule:
    """One HF tensor pattern -> one param, or several (split along `split_axis`)."""

    hf: str
    params: tuple[str, ...]
    transforms: tuple[Transform, ...] = ()
    split_axis: int | None = None
    gguf: str | None = None  # the GGUF tensor name pattern
    hf_regex: re.Pattern = field(init=False, repr=False)
    param_regexes: tuple[re.Pattern, ...] = field(init=False, repr=False)
    placeholders: tuple[str, ...] = field(init=False, repr=False)
    gguf_regex: re.Pattern | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.hf_regex, self.placeholders = compile_pattern(self.hf)
        self.param_regexes = tuple(compile_pattern(p)[0] for p in self.params)
        self.gguf_regex = compile_pattern(self.gguf)[0] if self.gguf else None

    @property
    def text(self) -> str:
        """The transform chain, e.g. "transpose → split[0]" ("" for a plain copy)."""
        steps = [t.text for t in self.transforms]
        if self.split_axis is not None:
            steps.append(f"split[{self.split_axis}]")
        return " → ".join(steps)

    def hf_name(self, values: Mapping[str, str]) -> str:
        return fill(self.hf, values)

    def gguf_name(self, values: Mapping[str, str]) -> str | None:
        return fill(self.gguf, values) if self.gguf else None

    def targets(self, values: Mapping[str, str]) -> tuple[str, ...]:
        return tuple(fill(p, values) for p in self.params)

    def param_bindings(self, param: str) -> dict[str, str] | None:
        """The placeholder values that make `param` one of this rule's targets, or None."""
        for regex in self.param_regexes:
            m = regex.fullmatch(param)
            if m:
                return m.groupdict()
        return None

    def hf_shape(self, param_shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
        """The HF tensor shape that gives these param shapes (raises ValueError if none can)."""
        if self.split_axis is None:
            (shape,) = param_shapes
        else:
            shape = concat_shape(param_shapes, self.split_axis)
        for t in reversed(self.transforms):
            shape = t.inverse_shape(shape)
        return tuple(shape)

    def forward(self, x, sizes: list[int] | None = None) -> list:
        """HF tensor -> param tensors (views where possible). `sizes`: split sizes; by
        default equal parts."""
        for t in self.transforms:
            x = t.apply(x)
        return self.split(x, sizes)

    def inverse(self, parts: list):
        """Param tensors -> the HF tensor (contiguous)."""
        x = self.joined(parts)
        for t in reversed(self.transforms):
            x = t.invert(x)
        return contiguous(x)

    def joined(self, parts: list):
        """Param tensors concatenated along the split axis, in the source's layout (the
        GGUF tensor before [gguf.transforms])."""
        return parts[0] if self.split_axis is None else concat(list(parts), self.split_axis)

    def split(self, x, sizes: list[int] | None = None) -> list:
        """The inverse of `joined`: split along the split axis (equal parts by default)."""
        if self.split_axis is None:
            return [x]
        ax, n = self.split_axis, len(self.params)
        if sizes is None:
            if x.shape[ax] % n:
                raise ValueError(f"cannot split axis {ax} of size {x.shape[ax]} into {n} parts")
            sizes = [x.shape[ax] // n] * n
        if sum(sizes) != x.shape[ax]:
            raise ValueError(f"split sizes {sizes} do not add up to {x.shape[ax]}")
        out, start = [], 0
        for s in sizes:
            out.append(x[(slice(None),) * ax + (slice(start, start + s),)])
            start += s
        return out

"""What a name or expression evaluates to while a source is checked or lowered.

The same front end walks a source in two modes. Checking: config ints are
symbolic atoms and tensors are bare types. Lowering: the config is concrete
and tensors are IR values. These classes are shared by both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from linnet.core.dims import Poly
from linnet.ir.types import TensorType
from linnet.syntax import ast as A


@dataclass
class TVal:
    """A tensor: `v` is a TensorType (checking) or an IR Value (lowering)."""

    v: object
    type: TensorType
    optional: bool = False  # may be none: an optional param not yet narrowed


@dataclass
class DVal:
    """An integer known up to a polynomial: a config int, a dim, a literal."""

    poly: Poly


@dataclass
class SVal:
    value: str | None  # None: not known while checking


@dataclass
class FVal:
    value: float | None


@dataclass
class BVal:
    value: bool | None


@dataclass
class DtypeVal:
    name: str


@dataclass
class NoneVal:
    pass


@dataclass
class ListVal:
    """An `int[N]` config field: each item an int (a symbolic atom `widths[0]` while
    checking)."""

    name: str
    items: list[DVal]


@dataclass
class BlockInfo:
    """A repeated param block such as `layers[n_layers]`."""

    name: str  # dotted prefix, e.g. "layers", "stages.0.rest"
    decl: A.ParamBlock
    count: Poly
    members: dict = field(default_factory=dict)  # name -> ParamDecl or BlockInfo
    # `stages[4] as s`: members resolved per index (their shapes may use it), memoized
    resolve: Callable | None = None
    _at: dict = field(default_factory=dict, repr=False)

    def members_at(self, index: Poly) -> dict:
        if self.resolve is None:
            return self.members
        key = str(index)
        if key not in self._at:
            self._at[key] = self.resolve(index)
        return self._at[key]


@dataclass
class BlockVal:
    block: BlockInfo


@dataclass
class GroupVal:
    """One repetition of a block: `p` in `for p in layers`."""

    block: BlockInfo
    index: Poly


@dataclass
class StateVal:
    name: str
    type: TensorType


@dataclass
class StateView:
    """`kv[i]`: a window of state that can be read or written in place."""

    state: str
    prefix: list[Poly]
    type: TensorType


def describe(value) -> str:
    """How a value reads in a diagnostic."""
    if isinstance(value, TVal):
        return f"tensor {value.type}" + (" (may be none)" if value.optional else "")
    if isinstance(value, StateView):
        return f"state slice {value.type}"
    return {
        DVal: lambda v: f"int {v.poly}",
        SVal: lambda v: "str" + (f" {v.value!r}" if v.value is not None else ""),
        FVal: lambda v: "float",
        BVal: lambda v: "bool",
        DtypeVal: lambda v: f"dtype {v.name}",
        NoneVal: lambda v: "none",
        ListVal: lambda v: f"int[{len(v.items)}] {v.name}",
        BlockVal: lambda v: f"param block {v.block.name}",
        GroupVal: lambda v: f"one {v.block.name} block",
        StateVal: lambda v: f"state {v.name}",
    }.get(type(value), lambda v: type(v).__name__)(value)


@dataclass
class Frame:
    """One function activation (or one entry) and what is known inside it."""

    fn: A.FnDef | None
    vars: dict = field(default_factory=dict)
    dims: dict[str, Poly] = field(default_factory=dict)  # fn dims bound by the call
    facts: list[Poly] = field(default_factory=list)  # each known >= 0 (from `require`)
    true_conds: set[str] = field(default_factory=set)  # config conditions known true
    writes: set[str] = field(default_factory=set)  # fn args written into (checking)
    state_writes: set[str] = field(default_factory=set)  # state written (checking)
    calls_broken: bool = False  # a callee had errors: its writes are unknown
    split_vars: dict = field(default_factory=dict)  # name -> (if line, type a, type b)
    returned: object = None

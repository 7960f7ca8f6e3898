"""Evaluating expressions: names, arithmetic, indexing and slicing.

A mixin of the Elaborator (`linnet/check/elaborate.py`); `self.add` emits an
op through the builder and turns an op-rule failure into a diagnostic.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from linnet.check.values import (
    BlockInfo,
    BlockVal,
    BVal,
    DtypeVal,
    DVal,
    FVal,
    GroupVal,
    ListVal,
    NoneVal,
    StateVal,
    StateView,
    SVal,
    TVal,
    describe,
)
from linnet.core.dims import Poly
from linnet.ir.types import DTYPES, OpTypeError, TensorType, is_float
from linnet.syntax import ast as A

ARITH = {"+": "add", "-": "sub", "*": "mul", "/": "div"}
COMPARE = {"==": "eq", "!=": "ne", "<": "lt", "<=": "le", ">": "gt", ">=": "ge"}


class Expressions:
    # -- emitting ops ------------------------------------------------------------------
    def tval(self, v) -> TVal:
        return TVal(v, self.builder.type_of(v))

    def add(self, op: str, inputs: list[TVal], **attrs) -> TVal:
        try:
            out = self.builder.add(op, [t.v for t in inputs], where=self._where, **attrs)
        except OpTypeError as err:
            self.error(
                self._span, err.message, err.expected, err.received, err.hint, frame=self._frame
            )
        return None if out is None else self.tval(out)

    def scalar(self, value: float, dtype: str) -> TVal:
        if self.lowering:
            return self.add("const", [], value=np.array(value, dtype=np.float64), dtype=dtype)
        return TVal(TensorType(dtype, ()), TensorType(dtype, ()))

    # -- names ---------------------------------------------------------------------------
    def lookup(self, e: A.Name, frame):
        if e.id in frame.vars:
            return frame.vars[e.id]
        if e.id in frame.dims:
            return DVal(frame.dims[e.id])
        value = self.globals.get(e.id)
        if value is None and e.id in DTYPES:
            return DtypeVal(e.id)
        if value is None and e.id in frame.split_vars:
            line, a, b = frame.split_vars[e.id]
            self.error(
                e.span,
                f"`{e.id}` has a different type in each branch of the `if` on line {line}",
                a,
                b,
                "compute what needs it inside each branch",
                frame=frame,
            )
        if value is None:
            known = sorted(set(frame.vars) | set(self.globals))
            close = [k for k in known if k.lower().startswith(e.id[:2].lower())][:4]
            self.error(
                e.span,
                f"unknown name `{e.id}`",
                hint=f"did you mean {', '.join(close)}?" if close else None,
                frame=frame,
            )
        if isinstance(value, tuple) and value[0] == "param":
            return self.param_value(value[1], value[1].name, frame)
        if isinstance(value, StateVal):
            return value
        return value

    def param_value(self, decl: A.ParamDecl, dotted: str, frame):
        """A param as a tensor: none when its condition is false (lowering)."""
        optional = decl.cond is not None and decl.alias is None
        own = getattr(decl, "frame", None)  # a member of `NAME[...] as i`: i is bound there
        if self.lowering:
            if decl.cond is not None:
                cond = self.expr(decl.cond, own or frame).value
                if decl.alias is not None and cond:
                    prefix = dotted[: len(dotted) - len(decl.name)]
                    return self.lookup_param_path(prefix + decl.alias.id, frame)
                if decl.alias is None and not cond:
                    return NoneVal()
            if dotted not in self.graph.params:
                self.graph.param(dotted, decl.resolved)
            return self.tval(self.graph.params[dotted])
        if optional and own is not None:  # `if i > 0` on a block index may be known
            known = self.expr(decl.cond, own).value
            if known is not None:
                return TVal(decl.resolved, decl.resolved) if known else NoneVal()
        narrowed = optional and _unparse(decl.cond) in frame.true_conds
        if narrowed and own is not None:
            # an `if` with the condition's text narrows only where the block indices it
            # names mean this repetition's: `for j, p in layers` ... `if i > 0` does not
            narrowed = all(
                frame.vars.get(name) == own.vars[name]
                for name in _names(decl.cond) & own.vars.keys()
            )
        return TVal(decl.resolved, decl.resolved, optional and not narrowed)

    def lookup_param_path(self, dotted: str, frame):
        node, block = self.param_tree, None
        parts = dotted.split(".")
        for part in parts[:-1]:
            if part.isdigit():
                node = block.members_at(Poly.const(int(part)))
            else:
                block = node[part]
        return self.param_value(node[parts[-1]], dotted, frame)

    # -- expressions -----------------------------------------------------------------------
    def expr(self, e: A.Expr, frame):
        saved = (
            getattr(self, "_span", None),
            getattr(self, "_frame", None),
            getattr(self, "_where", ""),
        )
        self._span, self._frame = e.span, frame
        self._where = f"{self.module.path}:{e.span.line}:{e.span.col}"
        try:
            return self._expr(e, frame)
        finally:
            self._span, self._frame, self._where = saved

    def _expr(self, e: A.Expr, frame):
        if isinstance(e, A.Name):
            return self.lookup(e, frame)
        if isinstance(e, A.Num):
            return DVal(Poly.const(e.value)) if isinstance(e.value, int) else FVal(e.value)
        if isinstance(e, A.Str):
            return SVal(e.value)
        if isinstance(e, A.Const):
            return NoneVal() if e.value is None else BVal(e.value)
        if isinstance(e, A.Unary):
            return self.unary(e, frame)
        if isinstance(e, A.BinOp):
            return self.binop(e, frame)
        if isinstance(e, A.Attr):
            return self.attribute(e, frame)
        if isinstance(e, A.Index):
            return self.index(e, frame)
        if isinstance(e, A.Call):
            return self.call(e, frame)
        if isinstance(e, A.Tuple):
            return [self.expr(item, frame) for item in e.items]
        if isinstance(e, A.ListLit):
            return ListVal("", [self.expr(item, frame) for item in e.items])
        self.error(e.span, "slices are only allowed inside `[...]`", frame=frame)

    def unary(self, e: A.Unary, frame):
        v = self.expr(e.operand, frame)
        if e.op == "not":
            self.expect_kind(v, BVal, e.operand, "the operand of `not`", frame)
            return BVal(None if v.value is None else not v.value)
        if isinstance(v, DVal):
            return DVal(-v.poly)
        if isinstance(v, FVal):
            return FVal(None if v.value is None else -v.value)
        return self.add("neg", [self.tensor(v, e.operand, frame)])

    def binop(self, e: A.BinOp, frame):
        left, right = self.expr(e.left, frame), self.expr(e.right, frame)
        if e.op in ("and", "or"):
            for side, v in ((e.left, left), (e.right, right)):
                self.expect_kind(v, BVal, side, f"an operand of `{e.op}`", frame)
            return BVal(_logic(e.op, left.value, right.value))
        if isinstance(left, (TVal, StateView)) or isinstance(right, (TVal, StateView)):
            return self.tensor_binop(e, left, right, frame)
        if e.op in COMPARE:
            return self.compare(e, left, right, frame)
        if isinstance(left, DVal) and isinstance(right, DVal):
            return self.dim_arith(e, left.poly, right.poly, frame)
        if isinstance(left, (DVal, FVal)) and isinstance(right, (DVal, FVal)) and e.op in ARITH:
            a, b = _float(left), _float(right)
            known = a is not None and b is not None
            return FVal(_apply(e.op, a, b) if known else None)
        self.error(
            e.span,
            f"`{e.op}` does not apply to these operands",
            None,
            f"{describe(left)} {e.op} {describe(right)}",
            frame=frame,
        )

    def dim_arith(self, e: A.BinOp, a: Poly, b: Poly, frame) -> DVal:
        if e.op == "/":
            q = a.exact_div(b)
            if q is None and a.is_const and b.is_const:
                self.error(
                    e.span,
                    "division of integers is not exact",
                    f"{b} divides {a}",
                    f"{a} / {b}",
                    "use // to round down",
                    frame=frame,
                )
            return DVal(q if q is not None else a.floordiv(b))
        ops = {
            "+": lambda: a + b,
            "-": lambda: a - b,
            "*": lambda: a * b,
            "//": lambda: a.floordiv(b),
            "%": lambda: a.mod(b),
        }
        if e.op not in ops:
            self.error(e.span, f"`{e.op}` does not apply to integers", frame=frame)
        return DVal(ops[e.op]())

    def compare(self, e: A.BinOp, left, right, frame) -> BVal:
        comparable = (DVal, FVal, SVal, BVal)
        if not (isinstance(left, comparable) and isinstance(right, comparable)) or (
            type(left) is not type(right)
            and not (isinstance(left, (DVal, FVal)) and isinstance(right, (DVal, FVal)))
        ):
            self.error(
                e.span, f"cannot compare {describe(left)} with {describe(right)}", frame=frame
            )
        if isinstance(left, DVal) and isinstance(right, DVal):
            diff = left.poly - right.poly
            if not diff.is_const:
                return BVal(None)
            a, b = diff.value, 0
        else:
            a = left.value if not isinstance(left, DVal) else _float(left)
            b = right.value if not isinstance(right, DVal) else _float(right)
            if a is None or b is None:
                return BVal(None)
        return BVal(
            {"==": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[e.op]
        )

    def tensor_binop(self, e: A.BinOp, left, right, frame) -> TVal:
        if e.op == "@":
            return self.add(
                "matmul", [self.tensor(left, e.left, frame), self.tensor(right, e.right, frame)]
            )
        op = ARITH.get(e.op) or COMPARE.get(e.op)
        if op is None:
            self.error(e.span, f"`{e.op}` does not apply to tensors", frame=frame)
        t = left if isinstance(left, (TVal, StateView)) else right
        dtype = self.tensor(t, e, frame).type.dtype
        a = self.operand(left, dtype, e.left, frame)
        b = self.operand(right, dtype, e.right, frame)
        return self.add(op, [a, b])

    def operand(self, v, dtype: str, e: A.Expr, frame) -> TVal:
        """A tensor operand; a number literal takes the other side's dtype."""
        if isinstance(v, DVal) and v.poly.atoms() & set(self.symbolic_dims()):
            self.error(
                e.span,
                f"the dim `{v.poly}` is only known at run time: it cannot be "
                "a number in tensor arithmetic",
                frame=frame,
            )
        if isinstance(v, (DVal, FVal)):
            number = _float(v)
            if number is None and self.lowering:
                self.error(e.span, "a number here must be known", frame=frame)
            if not is_float(dtype) and isinstance(v, FVal):
                self.error(
                    e.span,
                    "a float number cannot join an integer tensor",
                    hint="no implicit promotion",
                    frame=frame,
                )
            return self.scalar(number or 0.0, dtype)
        return self.tensor(v, e, frame)

    def tensor(self, v, e: A.Expr, frame, optional_ok: bool = False) -> TVal:
        if isinstance(v, StateView):
            return self.read_view(v, [], e, frame)
        if not isinstance(v, TVal):
            self.error(e.span, "expected a tensor", "tensor", describe(v), frame=frame)
        if v.optional and not optional_ok:
            self.error(
                e.span,
                "this param may be absent (it is declared with `if`)",
                "a tensor",
                describe(v),
                "use it inside an `if` on the same condition",
                frame=frame,
            )
        return v

    def attribute(self, e: A.Attr, frame):
        base = self.expr(e.value, frame)
        if not isinstance(base, GroupVal):
            self.error(
                e.span,
                "only a param block has attributes",
                "one block, e.g. `p` in `for p in layers`",
                describe(base),
                frame=frame,
            )
        members = base.block.members_at(base.index)
        decl = members.get(e.name)
        if decl is None:
            self.error(
                e.span,
                f"block `{base.block.name}` has no param `{e.name}`",
                hint="params: " + ", ".join(members),
                frame=frame,
            )
        if isinstance(decl, BlockInfo):  # `st.rest`: a block nested in an indexed block
            return BlockVal(decl)
        index = base.index.value if base.index.is_const else "{i}"
        return self.param_value(decl, f"{base.block.name}.{index}.{e.name}", frame)

    # -- indexing ---------------------------------------------------------------------------
    def index(self, e: A.Index, frame):
        base = self.expr(e.value, frame)
        if isinstance(base, BlockVal):
            return self.block_item(base, e, frame)
        if isinstance(base, ListVal):
            return self.list_item(base, e, frame)
        if isinstance(base, (StateVal, StateView)):
            return self.state_index(base, e, frame)
        x = self.tensor(base, e.value, frame)
        if len(e.items) == 1 and not isinstance(e.items[0], A.Slice):
            item = self.expr(e.items[0], frame)
            if isinstance(item, (TVal, StateView)):
                return self.add("take", [x, self.tensor(item, e.items[0], frame)])
        return self.slice_tensor(x, self.index_items(e.items, x.type, frame), frame)

    def block_item(self, base: BlockVal, e: A.Index, frame) -> GroupVal:
        i = self.dim_expr(e.items[0], frame, "a block index")
        self.check_bounds(i, base.block.count - 1, e.items[0].span, frame)
        return GroupVal(base.block, i)

    def list_item(self, base: ListVal, e: A.Index, frame) -> DVal:
        """`widths[s + 1]`: the index must be known (a number, or the index of a block
        whose count is a number: such loops unroll when checking too)."""
        k = self.dim_expr(e.items[0], frame, "a list index") if len(e.items) == 1 else None
        if k is None or not k.is_const or not 0 <= k.value < len(base.items):
            self.error(
                e.span,
                f"`{base.name}` is indexed by a known int in 0 .. {len(base.items) - 1}",
                received=str(k) if k is not None else f"{len(e.items)} indices",
                hint="loop over a block of a constant count (`stages[4] as s`) to index by `s`",
                frame=frame,
            )
        return base.items[k.value]

    def index_items(self, items: list[A.Expr], t: TensorType, frame) -> list:
        """Each item as (start, stop, keep): a slice keeps its axis, an int drops it."""
        if len(items) > t.rank:
            self.error(
                items[-1].span, "too many indices", f"at most {t.rank}", len(items), frame=frame
            )
        out = []
        for item, size in zip(items, t.shape):
            if isinstance(item, A.Slice):
                lo = (
                    Poly.const(0)
                    if item.start is None
                    else self.dim_expr(item.start, frame, "a slice bound")
                )
                hi = size if item.stop is None else self.dim_expr(item.stop, frame, "a slice bound")
                self.check_bounds(lo, hi, item.span, frame)
                self.check_bounds(hi, size, item.span, frame)
                out.append((lo, hi, True))
            else:
                i = self.dim_expr(item, frame, "an index")
                self.check_bounds(i, size - 1, item.span, frame)
                out.append((i, i + 1, False))
        return out + [(Poly.const(0), d, True) for d in t.shape[len(items) :]]

    def check_bounds(self, lo: Poly, hi: Poly, span, frame) -> None:
        """Prove 0 <= lo <= hi, from minimums and the `require` facts in scope."""
        for needed, text in ((lo, f"0 <= {lo}"), (hi - lo, f"{lo} <= {hi}")):
            if not self.provable(needed, frame):
                self.error(
                    span,
                    f"cannot prove the index is in bounds: {text}",
                    hint=f"add `require {text}` before this line",
                    frame=frame,
                )

    def provable(self, p: Poly, frame) -> bool:
        mins = dict(self.minimums)
        return p.provably_nonneg(mins) or any(
            (p - fact).provably_nonneg(mins) for fact in frame.facts
        )

    def slice_tensor(self, x: TVal, items: list, frame) -> TVal:
        full = all(
            lo == Poly.const(0) and hi == d and keep
            for (lo, hi, keep), d in zip(items, x.type.shape)
        )
        if full:
            return x
        y = self.add(
            "slice", [x], starts=tuple(i[0] for i in items), stops=tuple(i[1] for i in items)
        )
        if all(keep for _, _, keep in items):
            return y
        shape = tuple(d for d, (_, _, keep) in zip(y.type.shape, items) if keep)
        return self.add("reshape", [y], shape=shape)

    def state_index(self, base, e: A.Index, frame):
        view = base if isinstance(base, StateView) else StateView(base.name, [], base.type)
        items = self.index_items(e.items, view.type, frame)
        if all(not keep for _, _, keep in items[: len(e.items)]):
            prefix = view.prefix + [lo for lo, _, _ in items[: len(e.items)]]
            rest = view.type.with_shape(view.type.shape[len(e.items) :])
            return StateView(view.state, prefix, rest)
        return self.read_view(view, e.items, e, frame)

    def read_view(self, view: StateView, items, e, frame) -> TVal:
        """Read a window of state: the view's fixed prefix, then the given items."""
        whole = self.state_value(view.state)
        full = [(p, p + 1, False) for p in view.prefix]
        full += self.index_items(items, view.type, frame)
        return self.slice_tensor(whole, full, frame)

    def state_value(self, name: str) -> TVal:
        if not self.lowering:
            t = self.globals[name].type
            return TVal(t, t)
        if name not in self.state_values:
            self.state_values[name] = self.graph.state(name, self.globals[name].type)
        return self.tval(self.state_values[name])


def _float(v) -> float | None:
    if isinstance(v, FVal):
        return v.value
    return float(v.poly.value) if v.poly.is_const else None


def _apply(op: str, a: float, b: float) -> float:
    return {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else float("nan")}[op]


def _logic(op: str, a, b):
    if op == "and":
        return False if (a is False or b is False) else (None if None in (a, b) else True)
    return True if (a is True or b is True) else (None if None in (a, b) else False)


def _names(e) -> set[str]:
    """The names an expression reads."""
    if isinstance(e, A.Name):
        return {e.id}
    out: set[str] = set()
    for f in dataclasses.fields(e) if dataclasses.is_dataclass(e) else ():
        value = getattr(e, f.name)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, A.Expr):
                out |= _names(item)
    return out


def _unparse(e: A.Expr) -> str:
    if isinstance(e, A.Name):
        return e.id
    if isinstance(e, A.Unary):
        return f"{e.op} {_unparse(e.operand)}"
    if isinstance(e, A.BinOp):
        return f"({_unparse(e.left)} {e.op} {_unparse(e.right)})"
    if isinstance(e, (A.Num, A.Str, A.Const)):
        return repr(e.value)
    if isinstance(e, A.Index):
        return f"{_unparse(e.value)}[{', '.join(map(_unparse, e.items))}]"
    return repr(e)


__all__ = ["Expressions", "DtypeVal", "SVal", "_unparse"]

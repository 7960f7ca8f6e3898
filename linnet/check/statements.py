"""Statements and function bodies: a mixin of the Elaborator (calls: `calls.py`)."""

from __future__ import annotations

import copy

from linnet.check.builtins import row_positions
from linnet.check.calls import Calls
from linnet.check.expressions import _unparse
from linnet.check.values import (
    BlockInfo,
    BlockVal,
    BVal,
    DVal,
    GroupVal,
    NoneVal,
    StateVal,
    StateView,
    TVal,
    describe,
)
from linnet.core.dims import Poly
from linnet.ir.types import TensorType
from linnet.syntax import ast as A


class Statements(Calls):
    # -- bodies ------------------------------------------------------------------------
    def run_body(self, body: list[A.Stmt], frame) -> None:
        for stmt in body:
            if frame.returned is not None:
                self.error(stmt.span, "unreachable code after `return`", frame=frame)
            self.statement(stmt, frame)

    def statement(self, s: A.Stmt, frame) -> None:
        if isinstance(s, A.Assign):
            self.assign(s, frame)
        elif isinstance(s, A.IndexAssign):
            self.write_state(s, frame)
        elif isinstance(s, A.Return):
            self.do_return(s, frame)
        elif isinstance(s, A.If):
            self.do_if(s, frame)
        elif isinstance(s, A.For):
            self.do_for(s, frame)
        elif isinstance(s, A.Require):
            self._span, self._frame = s.cond.span, frame
            self._where = f"{self.module.path}:{s.cond.span.line}:{s.cond.span.col}"
            self.require(s.cond, s.span, frame)

    def assign(self, s: A.Assign, frame) -> None:
        value = self.expr(s.value, frame)
        values = value if isinstance(value, list) else [value]
        if len(s.targets) != len(values):
            self.error(
                s.span, "wrong number of values to unpack", len(s.targets), len(values), frame=frame
            )
        for target, v in zip(s.targets, values):
            if target.id not in frame.vars and target.id in self.globals:
                self.error(
                    target.span,
                    f"cannot assign to `{target.id}`: it is declared at the top of the source",
                    hint="choose another local name",
                    frame=frame,
                )
            if isinstance(v, TVal) and v.optional:
                self.tensor(v, s.value, frame)
            frame.vars[target.id] = v

    def do_return(self, s: A.Return, frame) -> None:
        value = self.tensor(self.expr(s.value, frame), s.value, frame)
        declared = self.tensor_type(frame.fn.ret, frame)
        if value.type != declared:
            self.error(
                s.value.span,
                f"`{frame.fn.name}` returns the wrong type",
                declared,
                value.type,
                frame=frame,
            )
        frame.returned = value

    def do_if(self, s: A.If, frame) -> None:
        cond = self.expr(s.cond, frame)
        known = self.truth(cond, s.cond, frame)
        if known is not None:
            self.run_body(s.then if known else s.orelse, frame)
            return
        then, orelse = copy.copy(frame), copy.copy(frame)
        then.vars, orelse.vars = dict(frame.vars), dict(frame.vars)
        then.true_conds = frame.true_conds | {_unparse(s.cond)}
        orelse.true_conds = frame.true_conds | {f"not {_unparse(s.cond)}"}
        then.facts, orelse.facts = list(frame.facts), list(frame.facts)
        if isinstance(s.cond, A.Name) and isinstance(cond, TVal):
            then.vars[s.cond.id] = TVal(cond.v, cond.type, False)
        self.run_body(s.then, then)
        self.run_body(s.orelse, orelse)
        for name in set(then.vars) | set(orelse.vars):
            a, b = then.vars.get(name), orelse.vars.get(name)
            if a is None or b is None:
                continue
            if isinstance(a, TVal) and isinstance(b, TVal) and a.type != b.type:
                frame.vars.pop(name, None)  # differs per branch: unusable after the `if`
                frame.split_vars[name] = (s.span.line, a.type, b.type)
            else:
                frame.vars[name] = a
        frame.calls_broken |= then.calls_broken or orelse.calls_broken
        frame.writes |= then.writes | orelse.writes
        frame.state_writes |= then.state_writes | orelse.state_writes

    def truth(self, cond, e: A.Expr, frame) -> bool | None:
        """A condition's value when known: config bools, and none-or-not for tensors."""
        if isinstance(cond, BVal):
            return cond.value
        if isinstance(cond, NoneVal):
            return False
        if isinstance(cond, StateView):
            return True
        if isinstance(cond, TVal):
            return True if (self.lowering or not cond.optional) else None
        self.error(
            e.span,
            "a condition must be a bool or an optional value",
            "bool",
            describe(cond),
            frame=frame,
        )

    def do_for(self, s: A.For, frame) -> None:
        blocks = self.expr(s.iter, frame)
        if not isinstance(blocks, BlockVal):
            self.error(
                s.iter.span,
                "`for` runs over a param block",
                "a block such as `layers`",
                describe(blocks),
                frame=frame,
            )
        count = blocks.block.count
        for stmt in s.body:
            if isinstance(stmt, A.Return):
                self.error(
                    stmt.span,
                    "`return` inside a `for` loop",
                    hint="assign in the loop and return after it",
                    frame=frame,
                )
        if self.lowering or count.is_const:  # a constant count unrolls when checking too,
            for i in range(count.value):  # so each repetition may change types (stages)
                self.bind_loop(s, frame, blocks.block, Poly.const(i))
                self.run_body(s.body, frame)
            return
        before = dict(frame.vars)
        index = Poly.atom(s.index or "_i")
        frame.facts.append(count - 1 - index)
        self.bind_loop(s, frame, blocks.block, index)
        self.run_body(s.body, frame)
        for name, old in before.items():
            new = frame.vars.get(name)
            if isinstance(old, TVal) and isinstance(new, TVal) and old.type != new.type:
                self.error(
                    s.span,
                    f"the loop changes the type of `{name}`",
                    old.type,
                    new.type,
                    frame=frame,
                )

    def bind_loop(self, s: A.For, frame, block: BlockInfo, index: Poly) -> None:
        frame.vars[s.item] = GroupVal(block, index)
        if s.index:
            frame.vars[s.index] = DVal(index)

    # -- require --------------------------------------------------------------------------
    def require(self, cond: A.Expr, span: A.Span, frame) -> None:
        if isinstance(cond, A.BinOp) and cond.op == "and":
            self.require(cond.left, span, frame)
            self.require(cond.right, span, frame)
            return
        facts = self.facts_of(cond, frame)
        if facts is None:
            value = self.expect_kind(self.expr(cond, frame), BVal, cond, "a requirement")
            if value.value is False:
                self.error(cond.span, "requirement is false for this config", frame=frame)
            return
        line = self.module.lines[cond.span.line - 1]
        text = line[cond.span.col - 1 : cond.span.end_col - 1]
        for lhs, rhs in facts:
            self.require_le(lhs, rhs, f"require {text}", frame)

    def facts_of(self, cond: A.Expr, frame):
        """`a <= b` style requirements on ints as (lhs, rhs) pairs with lhs <= rhs."""
        if not (isinstance(cond, A.BinOp) and cond.op in ("<=", "<", ">=", ">", "==")):
            return None
        a, b = self.expr(cond.left, frame), self.expr(cond.right, frame)
        if not (isinstance(a, DVal) and isinstance(b, DVal)):
            return None
        a, b = a.poly, b.poly
        return {
            "<=": [(a, b)],
            "<": [(a + 1, b)],
            ">=": [(b, a)],
            ">": [(b + 1, a)],
            "==": [(a, b), (b, a)],
        }[cond.op]

    def require_le(self, lhs: Poly, rhs: Poly, message: str, frame=None) -> None:
        """Known from then on; a runtime guard where it cannot be proven."""
        frame = frame or self._frame
        if self.provable(rhs - lhs, frame):
            return
        if (rhs - lhs).is_const:
            self.error(self._span, f"requirement fails: {lhs} <= {rhs}", frame=frame)
        frame.facts.append(rhs - lhs)
        if self.lowering:
            self.builder.add("guard", [], where=self._where, lhs=lhs, rhs=rhs, message=message)

    # -- state ------------------------------------------------------------------------------
    def write_state(self, s: A.IndexAssign, frame) -> None:
        target = self.lookup(s.target, frame)
        self._span, self._frame = s.span, frame
        self._where = f"{self.module.path}:{s.span.line}:{s.span.col}"
        if isinstance(target, StateVal):
            target = StateView(target.name, [], target.type)
        if isinstance(target, StateView):
            frame.state_writes.add(target.state)
        elif (
            isinstance(target, TVal)
            and frame.fn
            and any(a.name == s.target.id for a in frame.fn.args)
            and not self.lowering
        ):
            frame.writes.add(s.target.id)
            target = StateView("", [], target.type)
        else:
            self.error(
                s.target.span,
                "only state can be written in place",
                "state, or an argument that receives a slice of state",
                describe(target),
                frame=frame,
            )
        rows, index_ast = self.per_row_start(s.items, frame)
        items = self.index_items(index_ast, target.type, frame)
        value = self.tensor(self.expr(s.value, frame), s.value, frame)
        region = tuple(hi - lo for lo, hi, keep in items if keep)
        if value.type.shape != region or value.type.dtype != target.type.dtype:
            self.error(
                s.value.span,
                "the value does not fit the state slice",
                TensorType(target.type.dtype, region),
                value.type,
                frame=frame,
            )
        if rows is not None and rows[0].type != TensorType("i64", region[:1]):
            self.error(
                s.items[rows[1]].span,
                "per-row positions need one i64 start per row of the value",
                TensorType("i64", region[:1]),
                rows[0].type,
                frame=frame,
            )
        if self.lowering:
            self.emit_state_write(target, items, value, rows)

    def per_row_start(self, items: list, frame) -> tuple:
        """`x[..., at : at + n, ...] = v` with `at` an i64[R] vector writes row r of v's
        first axis at at[r] .. at[r] + n: ((at, item index), the items with that slice
        as `: n`), or (None, items) when no slice starts at a vector."""
        for k, item in enumerate(items):
            if not (isinstance(item, A.Slice) and item.start is not None):
                continue
            at = self.expr(item.start, frame)
            if not isinstance(at, TVal):
                continue
            stop = item.stop
            if not (
                isinstance(item.start, A.Name)
                and isinstance(stop, A.BinOp)
                and stop.op == "+"
                and isinstance(stop.left, A.Name)
                and stop.left.id == item.start.id
            ):
                self.error(
                    item.span,
                    "a slice that starts at a vector of positions spans `at : at + n`",
                    "at : at + n",
                    _unparse(item),
                    frame=frame,
                )
            at = self.tensor(at, item.start, frame)
            rest = list(items)
            rest[k] = A.Slice(item.span, None, stop.right)
            return (at, k), rest
        return None, items

    def emit_state_write(self, view: StateView, items: list, value: TVal, rows=None) -> None:
        whole = self.state_value(view.state)
        starts = tuple(view.prefix) + tuple(lo for lo, _, _ in items)
        full_shape = tuple(Poly.const(1) for _ in view.prefix) + tuple(
            hi - lo for lo, hi, _ in items
        )
        update = self.add("reshape", [value], shape=full_shape)
        if rows is None:
            out = self.add("update_slice", [whole, update], starts=starts)
        else:  # per-row positions along `axis`, rows along the first kept axis
            at, k = rows
            axis = len(view.prefix) + k
            row_axis = len(view.prefix) + [keep for _, _, keep in items].index(True)
            positions = row_positions(self, at, full_shape[row_axis], full_shape[axis])
            out = self.add(
                "update_rows", [whole, update, positions], axis=axis, row_axis=row_axis,
                starts=starts,
            )  # fmt: skip
        self.state_values[view.state] = out.v


__all__ = ["Statements", "StateVal"]

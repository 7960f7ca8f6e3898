"""Statements, calls and function bodies: a mixin of the Elaborator.

Checking runs each function once against its signature; lowering inlines
every call with the caller's values, so a function's dims (B, S, P…) are
pattern variables bound by unification at each call.
"""

from __future__ import annotations

import copy

from linnet.check.builtins import BUILTINS, REQUIRED
from linnet.check.expressions import Expressions, _unparse
from linnet.check.values import (
    BlockInfo,
    BlockVal,
    BVal,
    DVal,
    Frame,
    FVal,
    GroupVal,
    NoneVal,
    StateVal,
    StateView,
    SVal,
    TVal,
    describe,
)
from linnet.core.dims import Poly
from linnet.ir.types import OpTypeError, TensorType
from linnet.syntax import ast as A

SCALAR_KINDS = {"int": DVal, "float": (FVal, DVal), "bool": BVal, "str": SVal}


def _conjuncts(cond: A.Expr):
    """`a and b` holds: so do `a`, `b` (and their own conjuncts) and the whole."""
    yield _unparse(cond)
    if isinstance(cond, A.BinOp) and cond.op == "and":
        yield from _conjuncts(cond.left)
        yield from _conjuncts(cond.right)


class Statements(Expressions):
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
        items = self.index_items(s.items, target.type, frame)
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
        if self.lowering:
            self.emit_state_write(target, items, value)

    def emit_state_write(self, view: StateView, items: list, value: TVal) -> None:
        whole = self.state_value(view.state)
        starts = tuple(view.prefix) + tuple(lo for lo, _, _ in items)
        full_shape = tuple(Poly.const(1) for _ in view.prefix) + tuple(
            hi - lo for lo, hi, _ in items
        )
        update = self.add("reshape", [value], shape=full_shape)
        out = self.add("update_slice", [whole, update], starts=starts)
        self.state_values[view.state] = out.v

    # -- calls ---------------------------------------------------------------------------------
    def call(self, e: A.Call, frame):
        if e.func in self.fns:
            return self.call_fn(self.fns[e.func], e, frame)
        spec = BUILTINS.get(e.func)
        if spec is None:
            known = sorted(set(self.fns) | set(BUILTINS))
            close = [k for k in known if k[:3] == e.func[:3]]
            self.error(
                e.span,
                f"unknown function `{e.func}`",
                hint=f"did you mean {', '.join(close)}?" if close else None,
                frame=frame,
            )
        names = [n for n, _, _ in spec.signature]
        given = self.bind_args(e, names, frame)
        args = []
        for name, kind, default in spec.signature:
            if name not in given:
                if default is REQUIRED:
                    self.error(e.span, f"`{e.func}` needs argument `{name}`", frame=frame)
                args.append(default)
                continue
            args.append(self.convert(given[name], kind, name, e, frame))
        self._span, self._frame = e.span, frame
        self._where = f"{self.module.path}:{e.span.line}:{e.span.col}"
        try:
            return spec.body(self, *args)
        except OpTypeError as err:
            self.error(e.span, err.message, err.expected, err.received, err.hint, frame=frame)

    def bind_args(self, e: A.Call, names: list[str], frame) -> dict:
        if len(e.args) > len(names):
            self.error(
                e.span,
                f"`{e.func}` takes {len(names)} arguments",
                len(names),
                len(e.args),
                frame=frame,
            )
        given = dict(zip(names, e.args))
        for key, value in e.kwargs.items():
            span = e.kw_spans.get(key, value.span)
            if key not in names:
                self.error(
                    span,
                    f"`{e.func}` has no argument `{key}`",
                    hint="arguments: " + ", ".join(names),
                    frame=frame,
                )
            if key in given:
                self.error(span, f"argument `{key}` given twice", frame=frame)
            given[key] = value
        return given

    def convert(self, arg: A.Expr, kind: str, name: str, e: A.Call, frame):
        value = self.expr(arg, frame)
        if kind in ("tensor", "tensor?"):
            if kind == "tensor?" and isinstance(value, NoneVal):
                return None
            return self.tensor(value, arg, frame, optional_ok=kind == "tensor?")
        if not isinstance(value, SCALAR_KINDS[kind]):
            self.error(
                arg.span,
                f"argument `{name}` of `{e.func}` must be {kind}",
                kind,
                describe(value),
                frame=frame,
            )
        if isinstance(value, DVal):
            return (
                value.poly
                if kind == "int"
                else (float(value.poly.value) if value.poly.is_const else None)
            )
        return value.value

    def call_fn(self, fn: A.FnDef, e: A.Call, frame):
        if fn.kind == "entry":
            self.error(e.span, f"`{fn.name}` is an entry point and cannot be called", frame=frame)
        given = self.bind_args(e, [a.name for a in fn.args], frame)
        callee = Frame(fn)
        callee.facts = list(frame.facts)
        bind: dict[str, Poly] = {}
        for arg in fn.args:
            expr = given.setdefault(arg.name, arg.default)
            if expr is None:
                self.error(e.span, f"`{fn.name}` needs argument `{arg.name}`", frame=frame)
            value = self.expr(expr, frame)
            callee.vars[arg.name] = self.bind_arg(arg, value, expr, bind, fn, frame)
        callee.dims = {d: bind.get(d, Poly.atom(d)) for d in self.symbolic_dims()}
        if self.lowering or self.is_template(fn):
            if fn.name in self.checking_stack:
                self.error(fn.span, f"`{fn.name}` calls itself; recursion is not supported")
            self.checking_stack.append(fn.name)
            try:
                self.run_body(fn.body, callee)
            finally:
                self.checking_stack.pop()
            return callee.returned
        self.check_fn(fn)
        frame.calls_broken |= fn.name in self.broken_fns
        for written in self.fn_writes[fn.name]:
            self.propagate_write(fn, written, given.get(written), frame)
        ret = self.tensor_type(fn.ret, callee)
        return TVal(ret, ret)

    def bind_arg(self, arg: A.Arg, value, expr: A.Expr, bind: dict, fn, frame):
        t = arg.type
        if t.dims is not None:
            if isinstance(value, NoneVal) and t.optional:
                return value
            pattern = self.tensor_type(t, self.pattern_frame(fn))
            actual = value.type if isinstance(value, (TVal, StateView)) else None
            if actual is None:
                self.error(
                    expr.span,
                    f"argument `{arg.name}` of `{fn.name}` must be a tensor",
                    pattern,
                    describe(value),
                    frame=frame,
                )
            if isinstance(value, TVal):
                value = self.tensor(value, expr, frame)
            if not self.unify(pattern, actual, bind):
                self.error(
                    expr.span,
                    f"argument `{arg.name}` of `{fn.name}` has the wrong type",
                    pattern,
                    actual,
                    frame=frame,
                )
            return value
        if t.name in SCALAR_KINDS:
            if not isinstance(value, SCALAR_KINDS[t.name]):
                self.error(
                    expr.span,
                    f"argument `{arg.name}` must be {t.name}",
                    t.name,
                    describe(value),
                    frame=frame,
                )
            return value
        if t.name == "group":
            if not isinstance(value, GroupVal):
                self.error(
                    expr.span,
                    f"argument `{arg.name}` must be one repetition of a param block",
                    "group",
                    describe(value),
                    frame=frame,
                )
            return value
        kind = self.globals.get(t.name)
        if isinstance(kind, BlockVal):
            if not (isinstance(value, GroupVal) and value.block is kind.block):
                self.error(
                    expr.span,
                    f"argument `{arg.name}` must be one `{t.name}` block",
                    t.name,
                    describe(value),
                    frame=frame,
                )
            return value
        if t.name in self.symbolic_dims():
            if not isinstance(value, DVal):
                self.error(
                    expr.span,
                    f"argument `{arg.name}` must be an int",
                    "int",
                    describe(value),
                    frame=frame,
                )
            if not self.unify_dim(Poly.atom(t.name), value.poly, bind):
                self.error(
                    expr.span,
                    f"argument `{arg.name}` disagrees with dim {t.name}",
                    bind.get(t.name),
                    value.poly,
                    frame=frame,
                )
            return value
        self.error(t.span, f"unknown type `{t.name}`", frame=frame)

    def is_template(self, fn: A.FnDef) -> bool:
        """A function with a `group` argument (one repetition of any block, whose params'
        shapes differ per call) is checked at each call, with the caller's values."""
        return any(a.type.name == "group" and a.type.dims is None for a in fn.args)

    def symbolic_dims(self) -> list[str]:
        return [d.name for d in self.module.dims if d.value is None]

    def pattern_frame(self, fn):
        f = Frame(fn)
        f.dims = {d: Poly.atom(d) for d in self.symbolic_dims()}
        return f

    def unify(self, pattern: TensorType, actual: TensorType, bind: dict) -> bool:
        if pattern.dtype != actual.dtype or pattern.rank != actual.rank:
            return False
        return all(self.unify_dim(p, a, bind) for p, a in zip(pattern.shape, actual.shape))

    def unify_dim(self, pattern: Poly, actual: Poly, bind: dict) -> bool:
        free = (pattern.atoms() & set(self.symbolic_dims())) - set(bind)
        atom = pattern.as_atom()
        if atom in free:
            bind[atom] = actual
            return True
        if free:
            return False
        return pattern.subs(bind) == actual

    def propagate_write(self, fn, written: str, expr, frame) -> None:
        value = self.expr(expr, frame) if expr is not None else None
        if isinstance(value, StateView):
            frame.state_writes.add(value.state)
        elif (
            isinstance(expr, A.Name) and frame.fn and any(a.name == expr.id for a in frame.fn.args)
        ):
            frame.writes.add(expr.id)
        elif not isinstance(value, NoneVal):
            self.error(
                expr.span if expr is not None else self._span,
                f"`{fn.name}` writes into `{written}`, so it needs a slice of state",
                "state such as `kv[i]`",
                describe(value),
                frame=frame,
            )

    # -- checking one function ----------------------------------------------------------------
    def check_fn(self, fn: A.FnDef) -> None:
        # an entry may have variants (`entry forward ... if COND`), each checked
        key = fn.name if fn.kind == "fn" else f"{fn.name}:{fn.span.line}"
        if key in self.fn_writes:
            return
        if fn.name in self.checking_stack:
            self.error(fn.span, f"`{fn.name}` calls itself; recursion is not supported")
        self.checking_stack.append(key)
        frame = self.pattern_frame(fn)
        self._frame = frame
        self.broken_fns.add(key)  # until its body checks through
        try:
            for arg in fn.args:
                frame.vars[arg.name] = self.arg_value(arg, frame)
            if fn.cond is not None:  # the body may use the params of that condition
                self.expect_kind(self.expr(fn.cond, frame), BVal, fn.cond, "an entry's `if`", frame)
                frame.true_conds = frame.true_conds | set(_conjuncts(fn.cond))
            self.run_body(fn.body, frame)
            if frame.returned is None:
                self.error(fn.span, f"`{fn.name}` does not end with `return`", frame=frame)
            if fn.kind == "entry" and not frame.calls_broken:
                self.check_updates(fn, frame)
            self.broken_fns.discard(key)
        finally:  # a broken function is reported once, not again at each call
            self.checking_stack.pop()
            self.fn_writes[key] = frame.writes

    def arg_value(self, arg: A.Arg, frame):
        t = arg.type
        if t.dims is not None:
            tt = self.tensor_type(t, frame)
            return TVal(tt, tt, t.optional)
        if t.name in SCALAR_KINDS:
            return {
                "int": DVal(Poly.atom(arg.name)),
                "float": FVal(None),
                "bool": BVal(None),
                "str": SVal(None),
            }[t.name]
        kind = self.globals.get(t.name)
        if isinstance(kind, BlockVal):
            return GroupVal(kind.block, Poly.atom("_i"))
        if t.name in self.symbolic_dims():
            return DVal(Poly.atom(t.name))
        self.error(
            t.span,
            f"unknown type `{t.name}`",
            "a tensor type, int, float, bool, str, a dim or a param block",
            t.name,
            frame=frame,
        )

    def check_updates(self, fn: A.FnDef, frame) -> None:
        for name in fn.updates:
            if not isinstance(self.globals.get(name), StateVal):
                self.error(
                    fn.span,
                    f"`{fn.name}` updates `{name}`, which is not declared state",
                    frame=frame,
                )
        for name in frame.state_writes - set(fn.updates):
            self.error(
                fn.span,
                f"`{fn.name}` writes state `{name}` without declaring it",
                hint=f"add `updates {name}` before `->`",
                frame=frame,
            )
        for name in set(fn.updates) - frame.state_writes:
            self.error(
                fn.span, f"`{fn.name}` declares `updates {name}` but never writes it", frame=frame
            )


__all__ = ["Statements", "StateVal"]

"""Calls: builtins, and user functions inlined (lowering) or checked once against their
signature (checking); a function's dims are pattern variables bound by unification at
each call. A mixin of the Elaborator, under `Statements`.
"""

from __future__ import annotations

from linnet.check.builtins import BUILTINS, REQUIRED
from linnet.check.expressions import Expressions, _unparse
from linnet.check.values import (
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


def _conjuncts(cond: A.Expr):
    """`a and b` holds: so do `a`, `b` (and their own conjuncts) and the whole."""
    yield _unparse(cond)
    if isinstance(cond, A.BinOp) and cond.op == "and":
        yield from _conjuncts(cond.left)
        yield from _conjuncts(cond.right)


SCALAR_KINDS = {"int": DVal, "float": (FVal, DVal), "bool": BVal, "str": SVal}


class Calls(Expressions):
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
        if kind == "position":  # an int, or a vector of per-row start positions
            if isinstance(value, TVal):
                return self.tensor(value, arg, frame)
            kind = "int"
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
            return self.bind_tensor_arg(arg, value, expr, bind, fn, frame)
        kind = self.globals.get(t.name)
        if t.name in SCALAR_KINDS:
            ok, want, what = isinstance(value, SCALAR_KINDS[t.name]), t.name, f"be {t.name}"
        elif t.name == "group":
            ok, want = isinstance(value, GroupVal), "group"
            what = "be one repetition of a param block"
        elif isinstance(kind, BlockVal):
            ok = isinstance(value, GroupVal) and value.block is kind.block
            want, what = t.name, f"be one `{t.name}` block"
        elif t.name in self.symbolic_dims():
            return self.bind_dim_arg(arg, value, expr, bind, frame)
        else:
            self.error(t.span, f"unknown type `{t.name}`", frame=frame)
        if not ok:
            message = f"argument `{arg.name}` must {what}"
            self.error(expr.span, message, want, describe(value), frame=frame)
        return value

    def bind_tensor_arg(self, arg: A.Arg, value, expr: A.Expr, bind: dict, fn, frame):
        pattern = self.tensor_type(arg.type, self.pattern_frame(fn))
        actual = value.type if isinstance(value, (TVal, StateView)) else None
        if actual is None:
            message = f"argument `{arg.name}` of `{fn.name}` must be a tensor"
            self.error(expr.span, message, pattern, describe(value), frame=frame)
        if isinstance(value, TVal):  # a param that may be absent fits an optional argument
            value = self.tensor(value, expr, frame, optional_ok=arg.type.optional)
        if not self.unify(pattern, actual, bind):
            message = f"argument `{arg.name}` of `{fn.name}` has the wrong type"
            self.error(expr.span, message, pattern, actual, frame=frame)
        return value

    def bind_dim_arg(self, arg: A.Arg, value, expr: A.Expr, bind: dict, frame):
        name = arg.type.name
        if not isinstance(value, DVal):
            message = f"argument `{arg.name}` must be an int"
            self.error(expr.span, message, "int", describe(value), frame=frame)
        if not self.unify_dim(Poly.atom(name), value.poly, bind):
            message = f"argument `{arg.name}` disagrees with dim {name}"
            self.error(expr.span, message, bind.get(name), value.poly, frame=frame)
        return value

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

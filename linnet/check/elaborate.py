"""The front end's walk over a source: checking and lowering in one evaluator.

`Elaborator(module)` with no config *checks*: config ints are symbolic atoms,
every branch on config is taken, loops run once, and each function body is
checked once against its signature. With a concrete config it *lowers* an
entry to a Core-IR graph: branches resolve, loops unroll, calls inline.
Both modes call the same op-table rules through a builder, so what the
checker accepts is what lowering builds.
"""

from __future__ import annotations

import copy

from linnet.check import statements
from linnet.check.config import list_length
from linnet.check.values import (
    BlockInfo,
    BlockVal,
    BVal,
    DtypeVal,
    DVal,
    Frame,
    FVal,
    ListVal,
    NoneVal,
    StateVal,
    SVal,
    describe,
)
from linnet.core.diagnostics import Diagnostic, DiagnosticError
from linnet.core.dims import Poly
from linnet.errors import ConfigError
from linnet.ir.graph import Graph, GraphBuilder, TypeBuilder
from linnet.ir.types import DTYPES, TensorType
from linnet.syntax import ast as A

SCALAR_TYPES = ("int", "float", "bool", "str", "dtype")
KIND_NAMES = {BVal: "bool", DVal: "int", FVal: "float", SVal: "str", DtypeVal: "dtype"}


class Elaborator(statements.Statements):
    def __init__(self, module: A.Module, config: dict | None = None) -> None:
        self.module = module
        self.lowering = config is not None
        self.config = config
        self.builder = TypeBuilder()
        self.graph: Graph | None = None
        self.diagnostics: list[Diagnostic] = []
        self.fns = {f.name: f for f in module.fns}
        self.fn_writes: dict[str, set[str]] = {}
        self.checking_stack: list[str] = []
        self.broken_fns: set[str] = set()
        self.state_values: dict = {}
        self.globals: dict = {}
        self.minimums: dict[str, int] = {}
        self._declare_globals()

    # -- errors ---------------------------------------------------------------------
    def error(
        self,
        span: A.Span,
        message: str,
        expected=None,
        received=None,
        hint=None,
        frame: Frame | None = None,
    ):
        dims = {}
        if frame is not None:
            dims = {k: str(v) for k, v in frame.dims.items() if str(v) != k}
            symbolic = [k for k, v in frame.dims.items() if str(v) == k]
            if symbolic:
                dims = {", ".join(symbolic): "symbolic", **dims}
        raise DiagnosticError(
            Diagnostic(
                self.module.path,
                span.line,
                span.col,
                span.end_col,
                message,
                None if expected is None else str(expected),
                None if received is None else str(received),
                hint,
                self.module.lines[span.line - 1],
                dims,
            )
        )

    # -- module-level names ----------------------------------------------------------
    def _declare_globals(self) -> None:
        g = self.globals
        for f in self.module.fields:
            if f.name in g:
                self.error(f.span, f"config field `{f.name}` is declared twice")
            if f.type.name not in SCALAR_TYPES or (
                f.type.dims is not None and list_length(f) is None
            ):
                self.error(
                    f.type.span,
                    f"config field `{f.name}` has an unsupported type",
                    "int, float, bool, str, dtype or int[N] (N a number)",
                    f.type.name,
                )
            g[f.name] = self._config_value(f)
        frame = Frame(None)
        for d in self.module.dims:
            if d.name in g:
                self.error(d.span, f"`{d.name}` is already declared")
            if d.value is None:
                g[d.name] = DVal(Poly.atom(d.name))
                self.minimums[d.name] = 0
            else:
                g[d.name] = DVal(self.dim_expr(d.value, frame, "a static dim"))
        self._mark_input_dims()
        self.param_tree = self._declare_params(self.module.params, "", frame, top=True)
        for s in self.module.states:
            if s.name in g:
                self.error(s.span, f"`{s.name}` is already declared")
            g[s.name] = StateVal(s.name, self.tensor_type(s.type, frame))
        seen: dict[str, A.FnDef] = {}
        for fn in self.module.fns:
            variants = fn.kind == "entry" == getattr(seen.get(fn.name), "kind", None)
            if variants and fn.cond is not None and seen[fn.name].cond is not None:
                continue  # entry variants: `entry forward(...) -> ... if COND`, one per config
            if fn.name in seen:
                self.error(
                    fn.span, f"`{fn.name}` is already declared (on line {seen[fn.name].span.line})"
                )
            if fn.name in g:
                self.error(fn.span, f"`{fn.name}` is already declared above")
            seen[fn.name] = fn

    def _config_value(self, f: A.Field):
        n = list_length(f)
        if n is not None:  # items are ints: constants when lowering, atoms when checking
            if self.lowering:
                return ListVal(f.name, [DVal(Poly.const(v)) for v in self.config[f.name]])
            return ListVal(f.name, [DVal(Poly.atom(f"{f.name}[{k}]")) for k in range(n)])
        if self.lowering:
            value = self.config[f.name]
            return {
                "int": lambda: DVal(Poly.const(value)),
                "float": lambda: FVal(value),
                "bool": lambda: BVal(value),
                "str": lambda: SVal(value),
                "dtype": lambda: DtypeVal(value),
            }[f.type.name]()
        return {
            "int": DVal(Poly.atom(f.name)),
            "float": FVal(None),
            "bool": BVal(None),
            "str": SVal(None),
            "dtype": DtypeVal(f.name),
        }[f.type.name]

    def _mark_input_dims(self) -> None:
        """Dims that size an entry's input tensor are at least 1; others at least 0."""
        for fn in self.module.fns:
            for arg in fn.args:
                for d in (arg.type.dims or []) if fn.kind == "entry" else []:
                    if isinstance(d, A.Name) and d.id in self.minimums:
                        self.minimums[d.id] = 1

    def _declare_params(self, decls, prefix: str, frame: Frame, top: bool = False) -> dict:
        tree: dict = {}
        for d in decls:
            if d.name in tree or (top and d.name in self.globals):
                self.error(d.span, f"`{d.name}` is already declared")
            if isinstance(d, A.ParamBlock):
                count = self.dim_expr(d.count, frame, "a block count")
                info = BlockInfo(prefix + d.name, d, count)
                if d.index is not None:
                    info.resolve = lambda i, info=info: self._block_members(info, i, frame)
                elif any(isinstance(m, A.ParamBlock) for m in d.body):
                    self.error(
                        d.span,
                        f"a block nested in `{d.name}` needs its index",
                        hint=f"name it: `{d.name}[...] as i`",
                    )
                else:
                    info.members = self._declare_params(d.body, "", frame)
                tree[d.name] = info
            else:
                if frame.vars:  # inside an indexed block: one declaration per index
                    d = copy.copy(d)
                    d.frame = frame
                tree[d.name] = d
                d.resolved = self.tensor_type(d.type, frame)
                if d.cond is not None:
                    self.expect_kind(self.expr(d.cond, frame), BVal, d.cond, "a condition")
                if d.alias is not None:
                    self._check_alias(d, tree, frame)
            if top:
                self.globals[d.name] = (
                    BlockVal(tree[d.name]) if isinstance(d, A.ParamBlock) else ("param", d)
                )
        return tree

    def _block_members(self, info: BlockInfo, index: Poly, outer: Frame) -> dict:
        """The members of one repetition of `NAME[...] as i`, with `i` bound to `index`."""
        frame = Frame(None, vars={**outer.vars, info.decl.index: DVal(index)})
        return self._declare_params(info.decl.body, f"{info.name}.{index}.", frame)

    def _check_alias(self, d: A.ParamDecl, tree: dict, frame: Frame) -> None:
        target = tree.get(d.alias.id) if isinstance(d.alias, A.Name) else None
        if not isinstance(target, A.ParamDecl):
            self.error(
                d.alias.span, "a param can only alias another param declared above it", frame=frame
            )
        if target.resolved != d.resolved:
            self.error(
                d.alias.span,
                f"`{d.name}` aliases `{target.name}` of another type",
                d.resolved,
                target.resolved,
                frame=frame,
            )

    # -- types -------------------------------------------------------------------------
    def dtype_name(self, name: str, span: A.Span, frame: Frame) -> str:
        if name in DTYPES:
            return name
        value = self.globals.get(name)
        if isinstance(value, DtypeVal):
            return value.name
        self.error(
            span,
            f"unknown dtype `{name}`",
            "f32, f16, bf16, i64, i32, bool or a config field of type dtype",
            name,
            frame=frame,
        )

    def tensor_type(self, t: A.TypeRef, frame: Frame) -> TensorType:
        if t.dims is None:
            self.error(
                t.span,
                "expected a tensor type such as `act[B, S, dim]`",
                received=t.name,
                frame=frame,
            )
        dtype = self.dtype_name(t.name, t.span, frame)
        return TensorType(dtype, tuple(self.dim_expr(e, frame, "a dim") for e in t.dims))

    def dim_expr(self, e: A.Expr, frame: Frame, what: str) -> Poly:
        value = self.expr(e, frame)
        if not isinstance(value, DVal):
            self.error(
                e.span, f"{what} must be an integer expression", "int", describe(value), frame=frame
            )
        return value.poly

    def expect_kind(self, value, kind, e: A.Expr, what: str, frame: Frame | None = None):
        if not isinstance(value, kind):
            name = KIND_NAMES[kind]
            self.error(e.span, f"{what} must be {name}", name, describe(value), frame=frame)
        return value

    # -- checking the whole module ------------------------------------------------------
    def check_module(self) -> list[Diagnostic]:
        for f in self.module.fields:
            if f.default is not None:
                self._guard(lambda f=f: self._check_default(f))
        for r in self.module.constraints:
            self._guard(
                lambda r=r: self.expect_kind(
                    self.expr(r.cond, Frame(None)), BVal, r.cond, "a constraint"
                )
            )
        for fn in self.module.fns:
            if not self.is_template(fn):  # checked at each call
                self._guard(lambda fn=fn: self.check_fn(fn))
        if not any(f.kind == "entry" for f in self.module.fns):
            self.diagnostics.append(
                Diagnostic(
                    self.module.path,
                    1,
                    1,
                    6,
                    "the source declares no entry point",
                    source_line=self.module.lines[0],
                    hint="add `entry forward(...) -> ...`",
                )
            )
        return self.diagnostics

    def _guard(self, thunk) -> None:
        try:
            thunk()
        except DiagnosticError as err:
            d = err.diagnostic
            if all(
                (x.line, x.col, x.message) != (d.line, d.col, d.message) for x in self.diagnostics
            ):
                self.diagnostics.append(d)

    def _check_default(self, f: A.Field) -> None:
        value = self.expr(f.default, Frame(None))
        kinds = {"int": DVal, "float": (FVal, DVal), "bool": BVal, "str": SVal, "dtype": DtypeVal}
        n = list_length(f)
        if n is not None:
            ok = isinstance(value, ListVal) and len(value.items) == n
            if not ok or not all(isinstance(v, DVal) for v in value.items):
                self.error(
                    f.default.span, f"default of `{f.name}` has the wrong type", f"int[{n}]",
                    describe(value) if not isinstance(value, list) else "a list",
                )  # fmt: skip
            return
        if not isinstance(value, kinds[f.type.name]):
            self.error(
                f.default.span,
                f"default of `{f.name}` has the wrong type",
                f.type.name,
                describe(value),
            )

    # -- lowering -------------------------------------------------------------------------
    def lower_entry(self, name: str) -> Graph:
        fn = self.entry_variant(name)
        if fn is None:
            raise ConfigError(f"{self.module.path}: no entry point `{name}`")
        self.graph = Graph(name)
        self.builder = GraphBuilder(self.graph)
        frame = Frame(fn)
        for arg in fn.args:
            if arg.type.dims is not None:
                t = self.tensor_type(arg.type, frame)
                value = self.graph.input(arg.name, t)
                frame.vars[arg.name] = self.tval(value)
            else:
                atom = self.globals[arg.type.name].poly.as_atom()
                self.graph.dim_inputs[arg.name] = atom
                frame.vars[arg.name] = DVal(Poly.atom(atom))
        for d in self.module.dims:
            if d.value is None:
                frame.dims[d.name] = Poly.atom(d.name)
        if not self.entry_exists(fn):
            self.graph.outputs = [self._absent_entry(fn, frame)]
            return self.graph
        self.run_body(fn.body, frame)
        self.graph.outputs = [frame.returned.v]
        for s, v in self.state_values.items():
            if v is not self.graph.states[s]:
                self.graph.state_outputs[s] = v
        return self.graph

    def entry_variant(self, name: str) -> A.FnDef | None:
        """The declaration of entry `name` for this config: the first whose `if` holds (or
        the first, when none does: it lowers to a graph that says so)."""
        variants = [f for f in self.module.fns if f.kind == "entry" and f.name == name]
        return next(
            (f for f in variants if self.entry_exists(f)), variants[0] if variants else None
        )

    def entry_exists(self, fn: A.FnDef) -> bool:
        """Whether an entry declared `entry ... if COND` has COND true for this config."""
        return fn.cond is None or self.expr(fn.cond, Frame(fn)).value is True

    def _absent_entry(self, fn: A.FnDef, frame: Frame):
        """The graph of an entry this config lacks: a guard that always fails with the
        reason, and a zero result of the declared type (never returned), so every backend
        can build all of a source's entries and a call says what is wrong."""
        self._where = f"{self.module.path}:{fn.span.line}:{fn.span.col}"
        message = absent_entry_message(self.module, fn)
        self.builder.add("guard", [], where=self._where, lhs=Poly.const(1), rhs=Poly.const(0),
                         message=message)  # fmt: skip
        t = self.tensor_type(fn.ret, frame)
        zero = self.builder.add("iota", [], length=Poly.const(1), start=Poly.const(0), dtype="i64")
        zero = self.builder.add("reshape", [zero], shape=(Poly.const(1),) * t.rank)
        zero = self.builder.add("cast", [zero], dtype=t.dtype)
        return self.builder.add("broadcast", [zero], shape=t.shape)


def absent_entry_message(module: A.Module, fn: A.FnDef) -> str:
    """Why a config lacks entry `fn` (declared `entry ... if COND`), quoting COND."""
    cond = module.lines[fn.cond.span.line - 1][fn.cond.span.col - 1 :].strip()
    return f"entry `{fn.name}` exists only `if {cond}`, which this config does not meet"


def check_source(module: A.Module) -> list[Diagnostic]:
    try:
        return Elaborator(module).check_module()
    except DiagnosticError as err:  # a mistake in the declarations stops the check
        return [err.diagnostic]


__all__ = ["Elaborator", "Frame", "check_source", "NoneVal"]

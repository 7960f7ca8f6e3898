"""Syntax tree of a `.linnet` source. Every node keeps its source span."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Span:
    line: int
    col: int
    end_col: int


# -- expressions ---------------------------------------------------------------
@dataclass
class Expr:
    span: Span


@dataclass
class Name(Expr):
    id: str


@dataclass
class Num(Expr):
    value: int | float


@dataclass
class Str(Expr):
    value: str


@dataclass
class Const(Expr):
    value: bool | None  # true, false, none


@dataclass
class BinOp(Expr):
    op: str  # + - * / // % @ == != < <= > >= and or
    left: Expr
    right: Expr


@dataclass
class Unary(Expr):
    op: str  # - not
    operand: Expr


@dataclass
class Call(Expr):
    func: str
    args: list[Expr]
    kwargs: dict[str, Expr]
    kw_spans: dict[str, Span] = field(default_factory=dict)  # where each keyword is written


@dataclass
class Slice(Expr):
    start: Expr | None
    stop: Expr | None


@dataclass
class Index(Expr):
    value: Expr
    items: list[Expr]  # Expr or Slice


@dataclass
class Attr(Expr):
    value: Expr
    name: str


@dataclass
class Tuple(Expr):
    items: list[Expr]


@dataclass
class ListLit(Expr):
    items: list[Expr]  # `[a, b, c]`: the value of an `int[N]` config field


# -- types -----------------------------------------------------------------------
@dataclass
class TypeRef:
    span: Span
    name: str  # int float bool str dtype, a dtype (f32, act...), a dim or a param block
    dims: list[Expr] | None = None  # present for tensor types
    optional: bool = False


# -- statements ------------------------------------------------------------------
@dataclass
class Stmt:
    span: Span


@dataclass
class Assign(Stmt):
    targets: list[Name]
    value: Expr


@dataclass
class IndexAssign(Stmt):
    target: Name
    items: list[Expr]
    value: Expr


@dataclass
class Return(Stmt):
    value: Expr


@dataclass
class If(Stmt):
    cond: Expr
    then: list[Stmt]
    orelse: list[Stmt]


@dataclass
class For(Stmt):
    index: str | None
    item: str
    iter: Expr
    body: list[Stmt]


@dataclass
class Require(Stmt):
    cond: Expr


# -- declarations -----------------------------------------------------------------
@dataclass
class Field:
    span: Span
    name: str
    type: TypeRef
    default: Expr | None


@dataclass
class DimDecl:
    span: Span
    name: str
    value: Expr | None  # None: symbolic


@dataclass
class ParamDecl:
    span: Span
    name: str
    type: TypeRef
    alias: Expr | None = None  # `= embed if tied`: shares another param
    cond: Expr | None = None  # present only when the condition holds (or the alias applies)


@dataclass
class ParamBlock:
    span: Span
    name: str
    count: Expr
    body: list[ParamDecl | ParamBlock]
    index: str | None = None  # `stages[4] as s`: members may use `s` in shapes, counts, conditions


@dataclass
class StateDecl:
    span: Span
    name: str
    type: TypeRef


@dataclass
class Arg:
    span: Span
    name: str
    type: TypeRef
    default: Expr | None


@dataclass
class FnDef:
    span: Span
    kind: str  # fn or entry
    name: str
    args: list[Arg]
    ret: TypeRef
    updates: list[str]
    body: list[Stmt]
    cond: Expr | None = None  # entries only: the config condition under which it exists


@dataclass
class Module:
    path: str
    lines: list[str]
    name: str
    fields: list[Field] = field(default_factory=list)
    constraints: list[Require] = field(default_factory=list)
    dims: list[DimDecl] = field(default_factory=list)
    params: list[ParamDecl | ParamBlock] = field(default_factory=list)
    states: list[StateDecl] = field(default_factory=list)
    fns: list[FnDef] = field(default_factory=list)

"""Resolving a source's config: overrides, defaults in order, then constraints."""

from __future__ import annotations

import math

from linnet.errors import ConfigError
from linnet.ir.types import DTYPES
from linnet.syntax import ast as A

PY_TYPES = {"int": int, "float": (float, int), "bool": bool, "str": str, "dtype": str}


class ParamLimitError(ConfigError):
    """A block count (`layers[n_layers]`) asks for more params than `limit`: a config that
    does not describe the checkpoint, stopped before it builds millions of names."""

    def __init__(self, path: str, block: str, info, limit: int):
        count = info.decl.count
        self.block = block
        self.count = info.count.value
        self.field = count.id if isinstance(count, A.Name) else None
        self.limit = limit
        super().__init__(f"{path}: `{block}[{self.count}]` needs more than {limit} params")


def resolve_config(
    module: A.Module, overrides: dict | None = None, origins: dict | None = None
) -> dict:
    """Concrete config values: each field from `overrides` or its default. `origins` maps
    a field to where its override was read ("config.json: hidden_size"), for errors."""
    overrides = dict(overrides or {})
    origins = origins or {}
    unknown = set(overrides) - {f.name for f in module.fields}
    if unknown:
        raise ConfigError(
            f"{module.path}: unknown config field(s) {sorted(unknown)}; "
            f"the source declares {[f.name for f in module.fields]}"
        )
    env: dict = {}
    for f in module.fields:
        if f.name in overrides:
            env[f.name] = _coerce(module, f, overrides[f.name], origins.get(f.name))
        elif f.default is not None:
            env[f.name] = _coerce(module, f, _eval(module, f.default, env))
        else:
            raise ConfigError(
                f"{module.path}:{f.span.line}: config field `{f.name}` has no "
                "default and no value was given"
            )
    for r in module.constraints:
        try:
            holds = _eval(module, r.cond, env) is True
        except ConfigError:
            holds = False
        if not holds:
            names = sorted(_names(r.cond) & set(env))
            values = ", ".join(_described(n, env[n], origins) for n in names)
            text = module.lines[r.span.line - 1].strip()
            raise ConfigError(f"{module.path}:{r.span.line}: config breaks `{text}` ({values})")
    return env


def _described(name: str, value, origins: dict) -> str:
    origin = origins.get(name)
    return f"{name} = {value!r}" + (f" from {origin}" if origin else "")


def list_length(f: A.Field) -> int | None:
    """N for an `int[N]` field (a list of ints), None for a scalar field."""
    dims = f.type.dims
    if f.type.name == "int" and dims and len(dims) == 1 and isinstance(dims[0], A.Num):
        return int(dims[0].value)
    return None


def _coerce(module: A.Module, f: A.Field, value, origin: str | None = None):
    """`value` checked against the field's declared type; an error names `origin` (where the
    value was read) when there is one, else the source's field."""
    what = f"{origin} (the source's `{f.name}`)" if origin else f"{module.path}: config `{f.name}`"
    n = list_length(f)
    if n is not None:
        if not isinstance(value, (list, tuple)) or len(value) != n:
            raise ConfigError(f"{what} must be a list of {n} ints, got {value!r}")
        item = A.Field(f.span, f"{f.name}[i]", A.TypeRef(f.type.span, "int"), None)
        return [_coerce(module, item, v, origin) for v in value]
    kind = f.type.name
    if kind == "bool" and not isinstance(value, bool):
        raise ConfigError(f"{what} must be bool, got {value!r}")
    if kind != "bool" and (isinstance(value, bool) or not isinstance(value, PY_TYPES[kind])):
        raise ConfigError(f"{what} must be {kind}, got {value!r}")
    if kind == "dtype" and value not in DTYPES:
        raise ConfigError(f"{what} must be one of {DTYPES}, got {value!r}")
    if kind == "int" and value < 0:
        raise ConfigError(f"{what} must not be negative, got {value}")
    if kind == "float":
        return _finite(value, what)
    return value


def _finite(value, what: str) -> float:
    try:
        number = float(value)  # an int too large for a float overflows
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise ConfigError(f"{what} must be a finite number, got {value}")
    return number


def _eval(module: A.Module, e: A.Expr, env: dict):
    if isinstance(e, (A.Num, A.Str, A.Const)):
        return e.value
    if isinstance(e, A.Name):
        if e.id in env:
            return env[e.id]
        if e.id in DTYPES:
            return e.id
        raise ConfigError(
            f"{module.path}:{e.span.line}: `{e.id}` is not a config field declared above this one"
        )
    if isinstance(e, A.ListLit):
        return [_eval(module, item, env) for item in e.items]
    if isinstance(e, A.Index) and len(e.items) == 1:  # an item of an `int[N]` field
        items, k = _eval(module, e.value, env), _eval(module, e.items[0], env)
        if isinstance(items, list) and isinstance(k, int) and 0 <= k < len(items):
            return items[k]
        raise ConfigError(f"{module.path}:{e.span.line}: index {k!r} out of range")
    if isinstance(e, A.Unary):
        v = _eval(module, e.operand, env)
        return (not v) if e.op == "not" else -v
    if isinstance(e, A.BinOp):
        a, b = _eval(module, e.left, env), _eval(module, e.right, env)
        if e.op in ("/", "//", "%") and b == 0:
            raise ConfigError(
                f"{module.path}:{e.span.line}: division by zero in "
                f"`{module.lines[e.span.line - 1].strip()}`"
            )
        if e.op == "/" and isinstance(a, int) and isinstance(b, int):
            if b == 0 or a % b:
                raise ConfigError(
                    f"{module.path}:{e.span.line}: {a} / {b} is not exact "
                    f"(`{module.lines[e.span.line - 1].strip()}`)"
                )
            return a // b
        return {
            "+": lambda: a + b,
            "-": lambda: a - b,
            "*": lambda: a * b,
            "/": lambda: a / b,
            "//": lambda: a // b,
            "%": lambda: a % b,
            "==": lambda: a == b,
            "!=": lambda: a != b,
            "<": lambda: a < b,
            "<=": lambda: a <= b,
            ">": lambda: a > b,
            ">=": lambda: a >= b,
            "and": lambda: a and b,
            "or": lambda: a or b,
        }[e.op]()
    raise ConfigError(f"{module.path}:{e.span.line}: unsupported expression in config")


def _names(e: A.Expr) -> set[str]:
    if isinstance(e, A.Name):
        return {e.id}
    if isinstance(e, A.BinOp):
        return _names(e.left) | _names(e.right)
    if isinstance(e, A.Unary):
        return _names(e.operand)
    if isinstance(e, A.Index):
        return _names(e.value)
    return set()

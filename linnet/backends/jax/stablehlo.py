"""StableHLO: one entry point exported with `jax.export`, written, read back and run.

    exported = export_entry(program, "decode")              # symbolic B and S
    save(exported, "decode.mlir", program, "equivalent")    # decode.mlir + decode.exported
    model = linnet.jax.load(ckpt, from_stablehlo="decode.mlir")

The export is the generated JAX function (`codegen.py`), so params are
arguments (a pytree named like the source; any weights of this config fit),
the state goes in and comes out (aliased: `tf.aliasing_output`), batch and
sequence are symbolic where the source declares them, and the start position
is a runtime int32 scalar: one export serves every batch size, sequence length
and position. The source's `require`s become shape constraints (the position
at 0) and host checks. `.mlir` is the readable StableHLO text; `.exported` is
`Exported.serialize()` — the same module with its calling convention — which
`jax.export.deserialize` reads and XLA runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
from jax import export as jax_export

from linnet.backends.jax.codegen import POSITION, JaxEntry, generate_entries, prepare
from linnet.backends.jax.emit import JAX_DTYPE_NAMES
from linnet.backends.jax.prelude import nest_params
from linnet.backends.jax.runners import load_module
from linnet.core.dims import Poly
from linnet.errors import LinnetError
from linnet.ir.program import Program

SUFFIX = ".exported"


def _dtype(name: str):
    return getattr(jnp, JAX_DTYPE_NAMES[name].removeprefix("jnp."))


def constraints(entry: JaxEntry) -> list[str]:
    """The entry's guards on shape dims alone, with the position at its least (0)."""
    out = []
    for node in entry.guards:
        lhs = Poly.lift(node.attrs["lhs"]).subs({POSITION: 0})
        rhs = Poly.lift(node.attrs["rhs"]).subs({POSITION: 0})
        if (lhs - rhs).is_const:
            continue  # holds or fails whatever the shapes: the host check says which
        text = f"{lhs} <= {rhs}"
        if text not in out:
            out.append(text)
    return out


def arg_specs(program: Program, entry: JaxEntry) -> list:
    """`jax.ShapeDtypeStruct`s for (params, *states, *inputs, *dim args), shape dims
    symbolic (one scope, with the entry's constraints)."""
    graph = entry.graph
    atoms = []
    for v in list(graph.inputs) + list(graph.states.values()):
        for d in v.type.shape:
            atoms += [a for a in sorted(d.atoms()) if a not in atoms]
    symbols = {}
    if atoms:
        dims = jax_export.symbolic_shape(", ".join(atoms), constraints=constraints(entry))
        symbols = dict(zip(atoms, dims))

    def spec(t):
        shape = tuple(d.value if d.is_const else _eval(d, symbols) for d in t.shape)
        return jax.ShapeDtypeStruct(shape, _dtype(t.dtype))

    params = nest_params({name: spec(t) for name, t in program.params.items()})
    args = [spec(v.type) for v in graph.states.values()] + [spec(v.type) for v in graph.inputs]
    args += [jax.ShapeDtypeStruct((), jnp.int32) for _ in graph.dim_inputs]
    return [params, *args]


def _eval(poly: Poly, symbols: dict):
    total = 0
    for mono, coef in poly.terms:
        term = coef
        for atom in mono:
            term = term * symbols[atom]
        total = total + term
    return total


def export_entry(
    program: Program,
    entry: str,
    numerics: str = "equivalent",
    platforms: tuple[str, ...] | None = None,
) -> jax_export.Exported:
    """`entry` of `program` as a `jax.export.Exported` (StableHLO inside)."""
    if entry not in program.entries:
        raise LinnetError(
            f"--entry {entry}: the {program.name} source has {', '.join(program.entries)}"
        )
    prepared = prepare(program, entry)
    module = load_module(generate_entries(program, {entry: prepared}, numerics), entry)
    donate = tuple(range(1, 1 + len(prepared.graph.states)))
    fn = jax.jit(getattr(module, entry), donate_argnums=donate)
    return jax_export.export(fn, platforms=platforms)(*arg_specs(program, prepared))


def save(
    exported: jax_export.Exported,
    path: str | Path,
    program: Program,
    numerics: str,
) -> tuple[Path, Path]:
    """Write the StableHLO text to `path` (.mlir) and the serialized export beside it."""
    path = Path(path)
    serialized = path.with_suffix(SUFFIX)
    n_params = len(program.params)
    about = {
        "source": program.name,
        "entry": exported.fun_name,
        "numerics": numerics,
        "platforms": list(exported.platforms),
        "params": n_params,
        "arguments": [str(a) for a in exported.in_avals[n_params:]],  # states, inputs, dims
        "config": program.config,
    }
    header = [
        f"// Linnet: `{exported.fun_name}` of the `{program.name}` source as StableHLO "
        "(jax.export).",
        f"// Run it with linnet.jax.load(checkpoint, from_stablehlo={str(path)!r}), which "
        f"reads {serialized.name}.",
        "// " + json.dumps(about, default=str),
    ]
    _atomic_write(path, ("\n".join(header) + "\n" + exported.mlir_module()).encode())
    _atomic_write(serialized, bytes(exported.serialize()))
    return path, serialized


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def read(path: str | Path) -> jax_export.Exported:
    """One export: a `.exported` file, or the `.mlir` written beside one."""
    path = Path(path)
    if path.suffix != SUFFIX:
        path = path.with_suffix(SUFFIX)
    if not path.is_file():
        raise LinnetError(f"{path}: no serialized export here (write one with `linnet stablehlo`)")
    try:
        return jax_export.deserialize(bytearray(path.read_bytes()))
    except Exception as err:  # flatbuffers/jax raise their own types
        raise LinnetError(f"{path}: not a serialized jax.export artifact: {err}") from err


def load_exports(spec) -> dict[str, jax_export.Exported]:
    """Entry -> export, from a file, a folder of `*.exported` files, or a dict."""
    if isinstance(spec, dict):
        return {entry: read(p) for entry, p in spec.items()}
    path = Path(spec)
    files = sorted(path.glob(f"*{SUFFIX}")) if path.is_dir() else [path]
    if not files:
        raise LinnetError(f"{path}: no {SUFFIX} files in this folder")
    exports = [read(f) for f in files]
    return {e.fun_name: e for e in exports}


def check_fits(exports: dict, params, entries: dict) -> None:
    """Each export takes these params, and a state of this config's shape."""
    for name, exported in exports.items():
        graph = entries[name].graph
        leaves = jax.tree_util.tree_flatten_with_path(params)[0]
        want = [(jax.tree_util.keystr(k), x.shape, x.dtype) for k, x in leaves]
        want += [(s, v.type, None) for s, v in graph.states.items()]
        have = exported.in_avals
        if len(have) < len(want):
            raise LinnetError(f"the `{name}` export takes {len(have)} arrays; expected more")
        for (what, shape, dtype), aval in zip(want, have):
            if dtype is None:  # a state: compare the static dims
                static = [d.value if d.is_const else None for d in shape.shape]
                ok = len(static) == len(aval.shape) and all(
                    s is None or s == a for s, a in zip(static, aval.shape)
                )
            else:
                ok = tuple(aval.shape) == tuple(shape) and aval.dtype == dtype
            if not ok:
                raise LinnetError(
                    f"the `{name}` export takes {what} as {aval.str_short()}, but this "
                    f"checkpoint and config give {shape}{'' if dtype is None else ' ' + str(dtype)}"
                    " (export again for this config: max_positions, dtype)"
                )

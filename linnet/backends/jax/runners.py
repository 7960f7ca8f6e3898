"""How a JaxModel runs its entries: generated JAX under jit, or StableHLO exports.

- `JitRunner`: the module `jax_codegen` writes (the same text `linnet jax` prints),
  exec'd in-process; each entry under `jax.jit` with its state donated. A
  trace counter per entry says how many times XLA compiled it.
- `ExportRunner`: serialized `jax.export` artifacts (`linnet stablehlo`), run with XLA.

A runner has `entries` (name -> JaxEntry: graph and host guards) and
`run(entry, params, states, inputs, dim_values) -> (outputs, new states)`.
Host guards are the model's job (`JaxModel`), since they need concrete values.
"""

from __future__ import annotations

import itertools
import types
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np

from linnet.backends.jax.codegen import generate_entries, prepare_all
from linnet.core.dtypes import numpy_dtype as core_numpy_dtype
from linnet.errors import LinnetError
from linnet.ir.program import Program

NUMERICS = ("equivalent", "fast")
_counter = itertools.count()


def load_module(text: str, name: str, consts: dict | None = None) -> types.ModuleType:
    """Exec generated JAX source as a module; folded array constants become its globals."""
    module = types.ModuleType(f"linnet_jax_{name}_{next(_counter)}")
    for key, (value, dtype) in (consts or {}).items():
        module.__dict__[key] = np.asarray(value, dtype=numpy_dtype(dtype))
    exec(compile(text, f"<linnet jax {name}>", "exec"), module.__dict__)
    return module


def numpy_dtype(name: str):
    """What a JAX array of a Linnet dtype holds (i64 as jnp's default int32)."""
    return core_numpy_dtype(name, as_jax=True)


def _split(entry, result) -> tuple[list, dict]:
    """A function's results -> (outputs, {state name: new state})."""
    n_out = len(entry.graph.outputs)
    result = result if isinstance(result, tuple) else (result,)
    states = dict(zip(entry.graph.state_outputs, result[n_out:]))
    return list(result[:n_out]), states


def _written_states(graph) -> tuple:
    """Argument positions of the states an entry writes (donated); a state it only reads
    (Whisper's cross-attention keys in `decode`) stays the caller's."""
    return tuple(1 + i for i, s in enumerate(graph.states) if s in graph.state_outputs)


class JitRunner:
    """Generated JAX under jax.jit, with the state donated."""

    def __init__(self, program: Program, numerics="equivalent", decomposed=False):
        if numerics not in NUMERICS:
            raise LinnetError(f"numerics={numerics!r}: choose one of {', '.join(NUMERICS)}")
        self.numerics = numerics
        self.entries = prepare_all(program, decomposed)
        consts: dict = {}
        self.text = generate_entries(program, self.entries, numerics, consts)
        self.module = load_module(self.text, program.name, consts)
        self.traces: Counter = Counter()  # entry -> times traced (compiled) so far
        self.jitted = {}
        for name, entry in self.entries.items():
            donate = _written_states(entry.graph)
            self.jitted[name] = jax.jit(self._counted(name), donate_argnums=donate)

    def _counted(self, name: str):
        fn = getattr(self.module, name)

        def traced(*args):
            self.traces[name] += 1  # runs once per trace, never per call
            return fn(*args)

        return traced

    def run(self, name, params, states, inputs, dim_values):
        entry = self.entries[name]
        args = [states[s] for s in entry.graph.states] + list(inputs)
        args += [np.int32(dim_values[k]) for k in entry.graph.dim_inputs]
        return _split(entry, self.jitted[name](params, *args))


class ExportRunner:
    """Serialized `jax.export` artifacts, one per entry, run with XLA."""

    def __init__(self, program: Program, exports: dict):
        self.entries = prepare_all(program)
        self.exports = exports
        self.jitted = {}
        for name, exported in exports.items():
            if name not in self.entries:
                raise LinnetError(
                    f"the StableHLO export is of `{name}`, which the {program.name} source "
                    f"does not have (entries: {', '.join(self.entries)})"
                )
            donate = _written_states(self.entries[name].graph)
            self.jitted[name] = jax.jit(exported.call, donate_argnums=donate)

    @property
    def traces(self) -> Counter:
        """Entry -> shapes compiled so far (an export is not traced: jit caches its calls)."""
        return Counter({name: fn._cache_size() for name, fn in self.jitted.items()})

    def run(self, name, params, states, inputs, dim_values):
        if name not in self.jitted:
            have = ", ".join(self.jitted) or "none"
            raise LinnetError(
                f"`{name}` is not among the StableHLO exports this model was loaded from "
                f"({have}); export it with `linnet stablehlo SRC --entry {name} -o ...`"
            )
        entry = self.entries[name]
        args = [states[s] for s in entry.graph.states] + list(inputs)
        args += [jnp.int32(dim_values[k]) for k in entry.graph.dim_inputs]
        return _split(entry, self.jitted[name](params, *args))

"""Load a model onto JAX/XLA: a Hugging Face folder through its weights map, or a source
with weights you already hold. Needs jax and numpy, not torch.

    model = linnet.jax.load("path/to/SmolLM2-135M-Instruct", dtype="f32")
    logits = model.forward(ids)                 # [B, S] -> f32 [B, S, vocab]
    model.decode(ids, 0); model.decode(next_ids, ids.shape[1])   # the cache stays on device
    tokens = model.generate(ids, 20)            # greedy

The model object keeps the contract of `linnet.torch.load`: `run(entry, ...)`,
`forward`, and `embed` or `decode`/`reset`/`generate` where the source has those
entries. Arrays in are anything numpy can read; arrays out are jax Arrays.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from linnet.backends.jax.arrays import JaxArrays
from linnet.backends.jax.codegen import guard_dims
from linnet.backends.jax.prelude import nest_params
from linnet.backends.jax.runners import ExportRunner, JitRunner, numpy_dtype
from linnet.errors import RuntimeGuardError
from linnet.model import Decoder, Encoder, Seq2Seq, SourceModel, family
from linnet.source import Source
from linnet.weights.checkpoint import open_checkpoint


class JaxModel(SourceModel):
    """A source's entries on JAX. `JaxModel(...)` gives `JaxDecoder` for a source with
    `decode`, `JaxEncoder` for one with `embed` (the contract of `linnet/model.py`)."""

    arrays = JaxArrays()

    def __init__(self, source: Source, config: dict, params: dict, runner, *, hf_config=None):
        self.source = source
        self.config = config
        self.hf_config = hf_config or {}
        self.runner = runner
        self.params = nest_params({k: jnp.asarray(v) for k, v in params.items()})
        self.state: dict = {}

    @property
    def numerics(self) -> str:
        return getattr(self.runner, "numerics", "exported")

    @property
    def compilations(self) -> dict:
        """Entry -> how many times XLA traced (and so compiled) it in this process."""
        return dict(self.runner.traces)

    def _declared(self, entry: str) -> list:
        graph = self.runner.entries[entry].graph
        return [(v.name, v.type.dtype, v.type.rank) for v in graph.inputs]

    def _state_types(self) -> dict:
        return {
            name: (value.type.shape, value.type.dtype)
            for entry in self.runner.entries.values()
            for name, value in entry.graph.states.items()
        }

    def _execute(self, name: str, inputs: list, dim_values: dict) -> jax.Array:
        self._check_guards(name, inputs, dim_values)
        outputs, states = self.runner.run(name, self.params, self.state, inputs, dim_values)
        self.state.update(states)
        return outputs[0]

    def _new_state(self, name: str, shape, dtype: str) -> None:
        super()._new_state(name, shape, dtype)
        sharding = getattr(self, "state_shardings", {}).get(name)  # mesh=: docs/parallel.md
        if sharding is not None:
            self.state[name] = jax.device_put(self.state[name], sharding)

    def _check_guards(self, name: str, inputs: list, dim_values: dict) -> None:
        """The source's `require`s, on the host."""
        entry = self.runner.entries[name]
        dims = guard_dims(entry, inputs, dim_values)
        for node in entry.guards:
            lhs, rhs = node.attrs["lhs"].eval(dims), node.attrs["rhs"].eval(dims)
            if lhs > rhs:
                where = f"{node.where}: " if node.where else ""
                raise RuntimeGuardError(
                    f"{where}{node.attrs['message']} failed: "
                    f"{node.attrs['lhs']} = {lhs} > {node.attrs['rhs']} = {rhs}"
                )


class JaxEncoder(Encoder, JaxModel):
    """A source with an `embed` entry: one vector per sequence."""


class JaxDecoder(Decoder, JaxModel):
    """A source with a `decode` entry: the cache stays on device between steps."""


class JaxSeq2Seq(Seq2Seq, JaxModel):
    """A source with `encode` and `decode`: the encoder fills the states decoding reads."""


family(JaxModel, JaxEncoder, JaxDecoder, JaxSeq2Seq)


def load(
    path: str | Path,
    *,
    dtype=None,
    numerics: str = "equivalent",
    max_positions: int | None = None,
    from_stablehlo=None,
    mesh=None,
) -> JaxModel:
    """A local HF checkpoint folder (config.json + safetensors) or a `.gguf` file as a
    Linnet model on JAX.

    dtype: "f32", "bf16", "f16"; default: the checkpoint's dtype.
    numerics: "equivalent" (the reference's f32 norms, softmax and rope tables, full-precision
        matmuls) or "fast" (XLA picks: default precision, jax.nn attention).
    max_positions: KV-cache length; default the config's context, capped at 4096.
    from_stablehlo: run serialized exports (`linnet stablehlo`) instead of tracing the
        generated code: a file (one entry), a folder of `*.exported` files, or a dict
        entry -> path. The export fixes numerics and the config (max_positions included).
    mesh: a `jax.sharding.Mesh` with an axis "tp": tensor parallel, params and cache
        sharded by the plan derived from the source, collectives left to XLA
        (docs/parallel.md).
    """
    ck = open_checkpoint(path, dtype=dtype, max_positions=max_positions)  # folder or .gguf
    source, config, hf_config = ck.source, ck.config, ck.hf_config
    params = ck.numpy_params()
    program = source.program(config)
    if mesh is not None:
        from linnet.shard import jax_tp

        plan = jax_tp.mesh_plan(program, mesh)
        program, params, plan = jax_tp.pad_uneven(program, params, plan)
        params = jax_tp.place_params(params, plan, mesh)
    if from_stablehlo is not None:
        from linnet.stablehlo import load_exports

        runner = ExportRunner(program, load_exports(from_stablehlo))
    else:
        runner = JitRunner(program, numerics)
    model = JaxModel(source, config, params, runner, hf_config=hf_config)
    if mesh is not None:
        model.state_shardings = jax_tp.state_shardings(program, plan, mesh)
        model.shard_plan = plan
    model.folder = Path(path) if Path(path).is_dir() else None  # companions (Whisper's rules)
    if from_stablehlo is not None:
        from linnet.stablehlo import check_fits

        check_fits(runner.exports, model.params, model.runner.entries)
    return model


def load_source(
    source_path: str | Path,
    config: dict,
    weights: dict,
    *,
    numerics: str = "equivalent",
) -> JaxModel:
    """A source outside the zoo with a config and params named as the source names them
    (numpy arrays, jax arrays, or anything numpy reads)."""
    source = Source.load(source_path)
    config = source.config(config)
    weights = {name: np.asarray(w) for name, w in weights.items()}
    layout = source.check_weights(config, weights, str(source_path))
    params = {}
    for name, t in layout.shapes.items():
        params[name] = weights[name].astype(numpy_dtype(t.dtype))
    runner = JitRunner(source.program(config), numerics)
    return JaxModel(source, config, params, runner)

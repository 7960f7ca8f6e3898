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

from linnet.backends.jax_codegen import guard_dims, state_shape
from linnet.backends.jax_prelude import nest_params
from linnet.backends.jax_runners import ExportRunner, JitRunner, numpy_dtype
from linnet.errors import LinnetError, RuntimeGuardError
from linnet.generation import Generation, check_ids
from linnet.inputs import MASK_INPUTS, TOKEN_INPUTS
from linnet.loading import plan_checkpoint
from linnet.source import Source


class JaxModel:
    """A source's entries on JAX. `JaxModel(...)` gives `JaxDecoder` for a source with
    `decode`, `JaxEncoder` for one with `embed` (as `linnet.runtime.TorchModel` does)."""

    def __new__(cls, source: Source, *args, **kwargs):
        if cls is JaxModel:
            if "decode" in source.entries:
                cls = JaxDecoder
            elif "embed" in source.entries:
                cls = JaxEncoder
        return super().__new__(cls)

    def __init__(self, source: Source, config: dict, params: dict, runner, *, hf_config=None):
        self.source = source
        self.config = config
        self.hf_config = hf_config or {}
        self.runner = runner
        self.params = nest_params({k: jnp.asarray(v) for k, v in params.items()})
        self.state: dict = {}

    @property
    def entries(self) -> list[str]:
        return self.source.entries

    @property
    def numerics(self) -> str:
        return getattr(self.runner, "numerics", "exported")

    @property
    def compilations(self) -> dict:
        """Entry -> how many times XLA traced (and so compiled) it in this process."""
        return dict(self.runner.traces)

    # -- entries -----------------------------------------------------------------------
    def run(self, entry: str, *inputs, **dims) -> jax.Array:
        """Run one entry: its tensor inputs in the source's order (None where a default
        exists), its runtime dims (`at=...`) by keyword."""
        if entry not in self.runner.entries:
            raise LinnetError(
                f"the {self.source.name} source has no entry `{entry}` "
                f"(entries: {', '.join(self.entries)})"
            )
        return self._run(entry, self._inputs(entry, list(inputs)), dims)[0]

    def forward(self, *inputs) -> jax.Array:
        """The `forward` entry (decoders: logits of every position, [B, S, V])."""
        return self.run("forward", *inputs)

    __call__ = forward

    # -- helpers -------------------------------------------------------------------------
    def _run(self, name: str, inputs: list, dim_values: dict) -> list:
        entry = self.runner.entries[name]
        dims = guard_dims(entry, inputs, dim_values)
        for node in entry.guards:  # the source's `require`s, on the host
            lhs, rhs = node.attrs["lhs"].eval(dims), node.attrs["rhs"].eval(dims)
            if lhs > rhs:
                where = f"{node.where}: " if node.where else ""
                raise RuntimeGuardError(
                    f"{where}{node.attrs['message']} failed: "
                    f"{node.attrs['lhs']} = {lhs} > {node.attrs['rhs']} = {rhs}"
                )
        outputs, states = self.runner.run(name, self.params, self.state, inputs, dim_values)
        self.state.update(states)
        return outputs

    def _inputs(self, name: str, given: list) -> list:
        declared = self.runner.entries[name].graph.inputs
        if len(given) > len(declared):
            names = ", ".join(v.name for v in declared)
            raise LinnetError(f"`{name}` takes {len(declared)} inputs ({names})")
        given += [None] * (len(declared) - len(given))
        out = []
        for value, x in zip(declared, given):
            if x is None:
                x = default_input(value.name, out)
            elif value.name in TOKEN_INPUTS:
                x = self._ids(x)
            out.append(jnp.asarray(x, dtype=numpy_dtype(value.type.dtype)))
        return out

    def _ids(self, ids) -> jax.Array:
        return jnp.asarray(check_ids(ids, self.config.get("vocab")), dtype=jnp.int32)


def default_input(name: str, given: list):
    """A padding mask left out: all ones (every position valid), like the ids before it."""
    if name in MASK_INPUTS and given:
        return jnp.ones(given[0].shape[:2], dtype=jnp.int32)
    raise LinnetError(f"input `{name}` is required")


class JaxEncoder(JaxModel):
    """A source with an `embed` entry: one vector per sequence."""

    def embed(self, ids, attention_mask=None, normalize: bool = False) -> jax.Array:
        """Pooled embeddings [B, H]; `normalize`: scaled to unit L2 norm."""
        out = self.run("embed", ids, attention_mask)
        if not normalize:
            return out
        return out / jnp.maximum(jnp.linalg.norm(out, axis=-1, keepdims=True), 1e-12)


class JaxDecoder(Generation, JaxModel):
    """A source with a `decode` entry: the cache stays on device between steps."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.position = 0

    @property
    def max_positions(self) -> int:
        return self.config["max_positions"]

    def decode(self, ids, pos: int) -> jax.Array:
        """Run `ids` at positions pos.., appending to the cache; last-position logits [B, V]."""
        return self._decode(self._ids(ids), int(pos))

    def _decode(self, ids, pos: int) -> jax.Array:
        self._ensure_state(ids.shape[0], pos)
        out = self._run("decode", [ids], {"at": pos})[0]
        self.position = pos + ids.shape[1]
        return out

    def reset(self) -> None:
        self.state = {}
        self.position = 0

    def _sampler(self, do_sample, temperature, top_k, seed: int = 0):
        keys = [jax.random.PRNGKey(seed)]

        def pick(logits):
            keys[0], sub = jax.random.split(keys[0])
            return _pick(logits, do_sample, temperature, top_k, sub)

        return pick

    @staticmethod
    def _concat(parts) -> jax.Array:
        return jnp.concatenate(parts, axis=1)

    def _state_specs(self, batch: int):
        for entry in self.runner.entries.values():
            for name, value in entry.graph.states.items():
                yield name, state_shape(value.type, batch), value.type.dtype

    @staticmethod
    def _shape_of(x):
        return x.shape

    def _new_state(self, name: str, shape, dtype: str) -> None:
        self.state[name] = jnp.zeros(shape, numpy_dtype(dtype))


def _pick(logits, do_sample, temperature, top_k, key) -> jax.Array:
    if not do_sample:
        return jnp.argmax(logits, axis=-1)
    scores = logits.astype(jnp.float32) / max(temperature, 1e-6)
    if top_k:
        kth = jax.lax.top_k(scores, top_k)[0][:, -1:]
        scores = jnp.where(scores < kth, -jnp.inf, scores)
    return jax.random.categorical(key, scores, axis=-1)


def load(
    path: str | Path,
    *,
    dtype=None,
    numerics: str = "equivalent",
    max_positions: int | None = None,
    from_stablehlo=None,
) -> JaxModel:
    """A local HF checkpoint folder (config.json + safetensors) as a Linnet model on JAX.

    dtype: "f32", "bf16", "f16"; default: the checkpoint's dtype.
    numerics: "equivalent" (the reference's f32 norms, softmax and rope tables, full-precision
        matmuls) or "fast" (XLA picks: default precision, jax.nn attention).
    max_positions: KV-cache length; default the config's context, capped at 4096.
    from_stablehlo: run serialized exports (`linnet stablehlo`) instead of tracing the
        generated code: a file (one entry), a folder of `*.exported` files, or a dict
        entry -> path. The export fixes numerics and the config (max_positions included).
    """
    plan, source, config, hf_config = plan_checkpoint(
        path, dtype=dtype, max_positions=max_positions
    )
    plan.check()
    params = dict(plan.load_numpy(config["act"]))
    if from_stablehlo is not None:
        from linnet.stablehlo import load_exports

        runner = ExportRunner(source.program(config), load_exports(from_stablehlo))
    else:
        runner = JitRunner(source.program(config), numerics)
    model = JaxModel(source, config, params, runner, hf_config=hf_config)
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

"""The JAX array adapter of the model contract (see `linnet/backends/arrays.py`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from linnet.backends.arrays import check_ids
from linnet.backends.jax.runners import numpy_dtype


class JaxArrays:
    @staticmethod
    def tokens(x, dtype: str, rank: int, vocab: int | None) -> jax.Array:
        return jnp.asarray(check_ids(x, vocab), dtype=numpy_dtype(dtype))

    @staticmethod
    def convert(name: str, dtype: str, x) -> jax.Array:
        return jnp.asarray(x, dtype=numpy_dtype(dtype))

    @staticmethod
    def mask_like(ids) -> jax.Array:
        return jnp.ones(ids.shape[:2], dtype=jnp.int32)

    @staticmethod
    def zeros(shape, dtype: str) -> jax.Array:
        return jnp.zeros(shape, numpy_dtype(dtype))

    @staticmethod
    def row(x, axis: int, r: int) -> jax.Array:
        """Row r of a state along its batch axis (a new array)."""
        return jax.lax.slice_in_dim(x, r, r + 1, axis=axis)

    @staticmethod
    def put_row(x, axis: int, r: int, part) -> jax.Array:
        return jax.lax.dynamic_update_slice_in_dim(x, part, r, axis)

    @staticmethod
    def concat(parts) -> jax.Array:
        return jnp.concatenate(parts, axis=1)

    @staticmethod
    def shape(x) -> tuple:
        return tuple(x.shape)

    @staticmethod
    def normalize(x) -> jax.Array:
        return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)

    @staticmethod
    def sampler(do_sample, temperature, top_k, seed: int = 0):
        keys = [jax.random.PRNGKey(seed)]

        def draw(logits):
            keys[0], sub = jax.random.split(keys[0])
            return pick(logits, do_sample, temperature, top_k, sub)

        return draw


def pick(logits, do_sample, temperature, top_k, key) -> jax.Array:
    """Token ids [B] from logits [B, V]: argmax, or drawn from the tempered top-k."""
    if not do_sample:
        return jnp.argmax(logits, axis=-1)
    scores = logits.astype(jnp.float32) / max(temperature, 1e-6)
    if top_k:
        kth = jax.lax.top_k(scores, top_k)[0][:, -1:]
        scores = jnp.where(scores < kth, -jnp.inf, scores)
    return jax.random.categorical(key, scores, axis=-1)

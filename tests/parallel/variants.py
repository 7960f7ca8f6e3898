"""A tiny variant the parallel tests add to `tests/tiny_decoders.TINY_CONFIGS`: KV heads
fewer than ranks (4 query heads over one KV head), which each rank then holds whole."""

from __future__ import annotations

from tests import tiny_decoders

tiny_decoders.TINY_CONFIGS[("LlamaForCausalLM", "kv1")] = dict(
    tiny_decoders._LLAMA, n_heads=4, n_kv=1
)
tiny_decoders.TINY_EDGES[("LlamaForCausalLM", "kv1")] = "one KV head (fewer than 2 ranks)"

"""What every backend's array adapter shares: token ids checked on the host with numpy.

An adapter is what the model contract (`linnet/model.py`) needs of a backend's arrays:

    tokens(x, dtype, rank, vocab)   # token ids: integers [B, S] (1-D: one row), in [0, vocab)
    convert(name, dtype, x)         # any other input, in the entry's dtype
    mask_like(ids)                  # an all-ones padding mask [B, S]
    zeros(shape, dtype)             # a state
    concat(parts)                   # along the sequence axis
    shape(state)                    # a state's shape
    sampler(do_sample, temperature, top_k, **rng)   # logits [B, V] -> token ids [B]
    normalize(x)                    # unit L2 norm along the last axis
"""

from __future__ import annotations

import numpy as np

from linnet.errors import LinnetError


def check_ids(ids, vocab: int | None) -> np.ndarray:
    """Token ids as int64 [B, S] (a 1-D sequence is one batch row), each in [0, vocab)."""
    ids = np.asarray(ids)
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
        raise LinnetError(f"token ids must be integers [B, S], got {ids.dtype}{list(ids.shape)}")
    if ids.size and vocab and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise LinnetError(
            f"token ids must lie in [0, {vocab}), got {int(ids.min())} to {int(ids.max())}"
        )
    return ids.astype(np.int64)

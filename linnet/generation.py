"""The generation loop every backend's model shares, over its own `decode`.

`linnet.model.Decoder` mixes it in for every backend. A model provides `_ids(ids)`
(validated ids in its array type), `_decode(ids, pos)` (last-position logits, the cache advanced),
`reset()`, `position`, `_sampler(do_sample, temperature, top_k, **rng)` (a function
logits -> token ids [B]) and `_concat(parts)` (join along the sequence axis); for the
cache, `_state_specs(batch)` (name, shape, dtype of each state), `_shape_of(array)` and
`_new_state(name, shape, dtype)` (zeros in its array type), which `_ensure_state` uses.
"""

from __future__ import annotations

import numpy as np

from linnet.errors import LinnetError


class Generation:
    def generate(
        self,
        ids,
        max_new_tokens: int,
        *,
        eos_token_id=None,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = None,
        on_token=None,
        **rng,
    ):
        """Prompt plus up to `max_new_tokens` tokens, [B, S + n]; greedy by default.
        Sampling draws from `generator=` (PyTorch) or `seed=` (JAX, ONNX)."""
        ids = self._ids(ids)
        self.reset()
        eos = sorted(set([eos_token_id] if isinstance(eos_token_id, int) else eos_token_id or []))
        pick = self._sampler(do_sample, temperature, top_k, **rng)
        logits = self._decode(ids, 0)
        out = [ids]
        done = np.zeros(ids.shape[0], dtype=bool)
        for step in range(max_new_tokens):
            token = pick(logits)
            out.append(token[:, None])
            if on_token is not None:
                on_token(token)
            if eos:  # one host sync per step, only when there is something to stop at
                done |= np.isin(np.asarray(_host(token)), eos)
                if done.all():
                    break
            if step + 1 < max_new_tokens:
                logits = self._decode(token[:, None], self.position)  # ids known valid
        return self._concat(out)

    def _ensure_state(self, batch: int, pos: int) -> None:
        """Zeros for a decode at position 0 (a new prompt, any batch); past 0 the cache must
        already hold this batch."""
        for name, shape, dtype in self._state_specs(batch):
            have = self.state.get(name)
            if have is not None and tuple(self._shape_of(have)) == shape:
                continue
            if pos != 0:
                why = "is empty" if have is None else "holds another batch"
                raise LinnetError(
                    f"decode at position {pos} with batch {batch}, but the cache {why}: "
                    "call reset() and start at position 0"
                )
            self._new_state(name, shape, dtype)


def _host(token):
    return token.cpu() if hasattr(token, "cpu") else token

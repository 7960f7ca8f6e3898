"""The model object every backend returns: forward, decode, reset, generate.

model.forward(ids)            # LongTensor[B, S] -> f32 logits [B, S, V]
model.decode(ids, pos)        # appends to the static KV cache -> logits [B, V]
model.reset()                 # forget the cache
model.generate(ids, 20)       # greedy unless do_sample=True
"""

from __future__ import annotations

import torch

from linnet.backends.interp import TORCH_DTYPES
from linnet.backends.torch_runners import make_runner
from linnet.errors import LinnetError
from linnet.source import Source


class TorchModel:
    def __init__(
        self,
        source: Source,
        config: dict,
        params: dict[str, torch.Tensor],
        *,
        device="cpu",
        numerics: str = "equivalent",
        mode: str = "interpret",
        hf_config: dict | None = None,
    ):
        self.source = source
        self.config = config
        self.hf_config = hf_config or {}
        self.params = params
        self.device = torch.device(device)
        self.numerics = numerics
        self.mode = mode
        self.runner = make_runner(mode, source, config, params, self.device, numerics)
        self.state: dict[str, torch.Tensor] = {}
        self.position = 0

    @property
    def max_positions(self) -> int:
        return self.config["max_positions"]

    # -- entries -----------------------------------------------------------------------
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits of every position, [B, S, V] (no cache involved)."""
        with torch.inference_mode():
            return self.runner.forward(self._ids(ids))

    __call__ = forward

    def decode(self, ids: torch.Tensor, pos: int) -> torch.Tensor:
        """Run `ids` at positions pos.., appending to the cache; last-position logits [B, V]."""
        return self._decode(self._ids(ids), int(pos))

    def _decode(self, ids: torch.Tensor, pos: int) -> torch.Tensor:
        with torch.inference_mode():
            self._ensure_state(ids.shape[0], pos)
            out = self.runner.decode(ids, pos, self.state)
        self.position = pos + ids.shape[1]
        return out

    def reset(self) -> None:
        self.state = {}
        self.position = 0

    def generate(
        self,
        ids: torch.Tensor,
        max_new_tokens: int,
        *,
        eos_token_id=None,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        on_token=None,
    ) -> torch.Tensor:
        """Prompt plus up to `max_new_tokens` tokens, [B, S + n]; greedy by default."""
        ids = self._ids(ids)
        self.reset()
        eos = set([eos_token_id] if isinstance(eos_token_id, int) else eos_token_id or [])
        logits = self.decode(ids, 0)
        out = [ids]
        done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
        for step in range(max_new_tokens):
            token = _pick(logits, do_sample, temperature, top_k, generator)
            out.append(token[:, None])
            if on_token is not None:
                on_token(token)
            if eos:
                done |= torch.isin(token, torch.tensor(sorted(eos), device=token.device))
                if bool(done.all()):
                    break
            if step + 1 < max_new_tokens:
                logits = self._decode(token[:, None], self.position)  # ids known valid
        return torch.cat(out, dim=1)

    # -- helpers -------------------------------------------------------------------------
    def _ids(self, ids) -> torch.Tensor:
        ids = torch.as_tensor(ids)
        if ids.dim() == 1:
            ids = ids[None]
        if ids.dtype not in (torch.int64, torch.int32):
            raise LinnetError(f"token ids must be integers, got {ids.dtype}")
        vocab = self.config.get("vocab")
        if ids.numel() and vocab and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            raise LinnetError(
                f"token ids must lie in [0, {vocab}), got {int(ids.min())} to {int(ids.max())}"
            )
        return ids.to(torch.int64).to(self.device)

    def _ensure_state(self, batch: int, pos: int) -> None:
        for name, t in self.runner.state_types.items():
            shape = [d.eval({"B": batch}) if not d.is_const else d.value for d in t.shape]
            have = self.state.get(name)
            if have is None or list(have.shape) != shape:
                if pos != 0:
                    why = "is empty" if have is None else "holds another batch"
                    raise LinnetError(
                        f"decode at position {pos} with batch {batch}, but the cache {why}: "
                        "call reset() and start at position 0"
                    )
                self.state[name] = torch.zeros(
                    shape, dtype=TORCH_DTYPES[t.dtype], device=self.device
                )


def _pick(logits, do_sample, temperature, top_k, generator) -> torch.Tensor:
    if not do_sample:
        return logits.argmax(dim=-1)
    scores = logits.float() / max(temperature, 1e-6)
    if top_k:
        kth = torch.topk(scores, top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]

"""The model object every PyTorch runner backs: a source's entries as methods.

model.run("embed", ids, mask)  # any entry: its inputs in order, runtime dims by keyword
model.forward(ids)             # the `forward` entry (decoders: f32 logits [B, S, V])
model.embed(ids, mask)         # sources with an `embed` entry: pooled [B, H]
model.decode(ids, pos)         # sources with a `decode` entry: appends to the KV cache
model.reset()                  # forget the cache
model.generate(ids, 20)        # greedy unless do_sample=True

`TorchModel(...)` gives the class the source's entries call for: `DecoderModel` when
it has `decode`, `EncoderModel` when it has `embed`, else the plain `TorchModel`.
"""

from __future__ import annotations

import torch

from linnet.backends.interp import TORCH_DTYPES
from linnet.backends.torch_runners import make_runner
from linnet.errors import LinnetError
from linnet.generation import Generation
from linnet.inputs import MASK_INPUTS, TOKEN_INPUTS
from linnet.ir.types import INT_DTYPES
from linnet.source import Source


def default_input(name: str, given: list):
    """An input the caller may leave out (None): a padding mask of all ones (every
    position valid), shaped like the token ids before it."""
    if name in MASK_INPUTS and given:
        return torch.ones(given[0].shape[:2], dtype=torch.int64, device=given[0].device)
    raise LinnetError(f"input `{name}` is required")


class TorchModel:
    def __new__(cls, source: Source, *args, **kwargs):
        if cls is TorchModel:  # the class follows the source's entries
            if "decode" in source.entries:
                cls = DecoderModel
            elif "embed" in source.entries:
                cls = EncoderModel
        return super().__new__(cls)

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
        self.params = dict(params)  # the runner may make some views of stacked weights
        self.device = torch.device(device)
        self.numerics = numerics
        self.mode = mode
        program = source.program(config)
        self.runner = make_runner(mode, program, self.params, self.device, numerics)
        self.state: dict[str, torch.Tensor] = {}

    @property
    def entries(self) -> list[str]:
        return self.source.entries

    # -- entries -----------------------------------------------------------------------
    def run(self, entry: str, *inputs, **dims) -> torch.Tensor:
        """Run one entry: its tensor inputs in the source's order (None where a default
        exists), its runtime dims (`at=...`) by keyword. State is the model's own."""
        if entry not in self.entries:
            raise LinnetError(
                f"the {self.source.name} source has no entry `{entry}` "
                f"(entries: {', '.join(self.entries)})"
            )
        tensors = self._inputs(entry, list(inputs))
        with torch.inference_mode():
            return self.runner.run(entry, tensors, dims, self.state)

    def forward(self, *inputs) -> torch.Tensor:
        """The `forward` entry (decoders: logits of every position, [B, S, V])."""
        return self.run("forward", *inputs)

    __call__ = forward

    # -- helpers -------------------------------------------------------------------------
    def _inputs(self, entry: str, given: list) -> list[torch.Tensor]:
        declared = self.runner.inputs[entry]
        if len(given) > len(declared):
            names = ", ".join(name for name, _ in declared)
            raise LinnetError(f"`{entry}` takes {len(declared)} inputs ({names})")
        given += [None] * (len(declared) - len(given))
        out = []
        for (name, t), x in zip(declared, given):
            x = default_input(name, out) if x is None else torch.as_tensor(x)
            out.append(self._convert(name, t, x))
        return out

    def _convert(self, name: str, t, x: torch.Tensor) -> torch.Tensor:
        if name in TOKEN_INPUTS and x.dim() == t.rank - 1:
            x = x[None]  # one sequence
        if t.dtype in INT_DTYPES:
            if x.dtype.is_floating_point or x.dtype.is_complex:
                raise LinnetError(f"`{name}` must hold integers, got {x.dtype}")
            if name in TOKEN_INPUTS:
                self._check_vocab(x)
        return x.to(device=self.device, dtype=TORCH_DTYPES[t.dtype])

    def _check_vocab(self, ids: torch.Tensor) -> None:
        vocab = self.config.get("vocab")
        if ids.numel() and vocab and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            raise LinnetError(
                f"token ids must lie in [0, {vocab}), got {int(ids.min())} to {int(ids.max())}"
            )

    def _ids(self, ids) -> torch.Tensor:
        """Token ids as the `forward` entry's first input takes them."""
        name, t = self.runner.inputs["forward"][0]
        return self._convert(name, t, torch.as_tensor(ids))


class EncoderModel(TorchModel):
    """A source with an `embed` entry: one vector per sequence."""

    def embed(self, ids, attention_mask=None, normalize: bool = False) -> torch.Tensor:
        """Pooled embeddings [B, H] (the source's pooling over the mask's valid positions);
        `normalize`: scaled to unit L2 norm, for cosine similarity."""
        out = self.run("embed", ids, attention_mask)
        return torch.nn.functional.normalize(out, p=2.0, dim=-1) if normalize else out


class DecoderModel(Generation, TorchModel):
    """A source with a `decode` entry: a static KV cache, decode steps and generation."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.position = 0

    @property
    def max_positions(self) -> int:
        return self.config["max_positions"]

    def decode(self, ids: torch.Tensor, pos: int) -> torch.Tensor:
        """Run `ids` at positions pos.., appending to the cache; last-position logits [B, V]."""
        return self._decode(self._ids(ids), int(pos))

    def _decode(self, ids: torch.Tensor, pos: int) -> torch.Tensor:
        with torch.inference_mode():
            self._ensure_state(ids.shape[0], pos)
            out = self.runner.run("decode", [ids], {"at": pos}, self.state)
        self.position = pos + ids.shape[1]
        return out

    def reset(self) -> None:
        self.state = {}
        self.position = 0

    def _sampler(self, do_sample, temperature, top_k, generator=None):
        return lambda logits: _pick(logits, do_sample, temperature, top_k, generator)

    @staticmethod
    def _concat(parts) -> torch.Tensor:
        return torch.cat(parts, dim=1)

    def _state_specs(self, batch: int):
        for name, t in self.runner.state_types.items():
            shape = tuple(d.eval({"B": batch}) if not d.is_const else d.value for d in t.shape)
            yield name, shape, t.dtype

    @staticmethod
    def _shape_of(x):
        return x.shape

    def _new_state(self, name: str, shape, dtype: str) -> None:
        self.state[name] = torch.zeros(shape, dtype=TORCH_DTYPES[dtype], device=self.device)


def _pick(logits, do_sample, temperature, top_k, generator) -> torch.Tensor:
    if not do_sample:
        return logits.argmax(dim=-1)
    scores = logits.float() / max(temperature, 1e-6)
    if top_k:
        kth = torch.topk(scores, top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]

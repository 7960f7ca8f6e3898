"""The PyTorch backend's model: the contract of `linnet/model.py` over the PyTorch array
adapter and one runner per mode (`linnet/backends/torch/runners.py`).

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

from linnet.backends.torch.arrays import TorchArrays
from linnet.backends.torch.runners import make_runner
from linnet.model import Decoder, Encoder, Seq2Seq, SourceModel, family
from linnet.source import Source


class TorchModel(SourceModel):
    """`params` is kept, not copied: the runner puts views of its fused stacks and the
    copies in 2 MB pages (huge_pages.py) in its entries, the same values, and a copy of
    the dict would hold every old storage until the load returned (SmolLM2 f32: 140 MB
    more at the peak and after)."""

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
        program=None,  # a rank's local program (tensor parallel, linnet/shard)
        placement: dict | None = None,  # devices, split, max_device_bytes (linnet/shard)
        entries=None,  # only these entries lowered and generated (`linnet.torch.load`)
    ):
        self.source = source
        self.config = config
        self.hf_config = hf_config or {}
        self.params = params
        self.device = torch.device(device)
        self.numerics = numerics
        self.mode = mode
        self.arrays = TorchArrays(self.device)
        whole = program is None  # else a tensor-parallel rank's share (linnet/shard)
        program = program or source.program(config, entries)
        if entries is not None:
            self._entries = [e for e in source.entries_for(config) if e in entries]
        if placement is not None:  # layers across devices, or streamed from host memory
            from linnet.shard.placed import PlacedRunner

            self.runner = PlacedRunner(
                program, self.params, numerics=numerics, mode=mode, **placement
            )
            self.placement = self.runner.placement
        else:
            self.runner = make_runner(mode, program, self.params, self.device, numerics, whole)
        self.state: dict[str, torch.Tensor] = {}

    def _declared(self, entry: str) -> list:
        return [(name, t.dtype, t.rank) for name, t in self.runner.inputs[entry]]

    def _state_types(self) -> dict:
        return {name: (t.shape, t.dtype) for name, t in self.runner.state_types.items()}

    def _execute(self, entry: str, inputs: list, dims: dict) -> torch.Tensor:
        with torch.inference_mode():
            return self.runner.run(entry, inputs, dims, self.state)


class EncoderModel(Encoder, TorchModel):
    """A source with an `embed` entry: one vector per sequence."""


class DecoderModel(Decoder, TorchModel):
    """A source with a `decode` entry: a static KV cache, decode steps and generation."""


class Seq2SeqModel(Seq2Seq, TorchModel):
    """A source with `encode` and `decode`: the encoder fills the states decoding reads."""


family(TorchModel, EncoderModel, DecoderModel, Seq2SeqModel)

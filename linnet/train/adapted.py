"""A checkpoint with LoRA adapters, ready to train: the base frozen, the adapters leaves.

model = LoraModel.load("path/to/checkpoint", LoraSpec(("layers.*.wq",), r=8))
logits = model(ids)                    # adapted, differentiable in the adapters
ref = model.reference(ids)             # the same weights with adapters disabled
model.save_adapter("out/adapter")      # PEFT's format
model.export_merged("out/merged")      # merged into the base, through linnet.hf.export
"""

from __future__ import annotations

from pathlib import Path

import torch

from linnet.train.lora import LoraSpec
from linnet.train.lora_base import LoraCheckpoint
from linnet.train.module import trainable_module
from linnet.train.peft_format import merge_lora, save_adapter


class LoraModel(LoraCheckpoint):
    def __init__(
        self,
        checkpoint,
        spec: LoraSpec,
        *,
        adapters=None,
        seed=0,
        numerics="equivalent",
        checkpoint_layers=False,
    ):
        initial = self._adapt(checkpoint, spec, adapters, seed)
        self.numerics = numerics
        self.base = checkpoint.torch_params()
        self.module = trainable_module(
            self.program,
            {**self.base, **{k: v.to(self.dtype) for k, v in initial.items()}},
            trainable=lambda name: name in self.adapter_names,
            lora_dropout=spec.dropout,
            numerics=numerics,
            checkpointed=checkpoint_layers,  # each layer recomputed in the backward
        )
        self._reference = None
        self._sampler = None  # the rollout decoder, kept across steps

    @property
    def dtype(self):
        return next(iter(self.base.values())).dtype

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return self.module(ids)

    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    def reference(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits of the base weights (adapters disabled), without gradients."""
        if self._reference is None:
            self._reference = trainable_module(
                self.base_program, self.base, trainable=lambda n: False, numerics=self.numerics
            )
        with torch.no_grad():
            return self._reference(ids)

    def adapters(self) -> dict[str, torch.Tensor]:
        params = dict(self.module.named_parameters())
        return {n: params[n].detach() for n in self.adapter_names}

    def save_adapter(self, folder) -> Path:
        wmap = self._wmap(self.checkpoint)
        origin = str(self.checkpoint.origin)
        return save_adapter(folder, self.adapters(), self.spec, self.targets, wmap, origin)

    def merged_params(self) -> dict[str, torch.Tensor]:
        return merge_lora(self.base, self.adapters(), self.targets, self.spec.scale)

    def merged_targets(self) -> dict[str, torch.Tensor]:
        """Only the adapted weights, merged (the rest are the base's)."""
        merged = merge_lora(self.base, self.adapters(), self.targets, self.spec.scale)
        return {t: merged[t] for t in self.targets}

    def sampler(self, positions: int | None = None):
        """A decoder over the merged weights as they are now, for rollouts (GRPO), whose
        cache holds `positions` tokens (default: the model's). Built once (and again only
        for longer rows): later calls copy the merged targets into its weights in place,
        since building a generated decoder per step cost more than the rollout itself."""
        positions = min(positions or self.max_positions, self.max_positions)
        held = self._sampler
        if held is not None and held.max_positions >= positions:
            with torch.no_grad():
                for name, value in self.merged_targets().items():
                    held.params[name].copy_(value)  # views of the decoder's fused weights
            return held
        from linnet.runtime import TorchModel

        ck = self.checkpoint
        config = {**ck.config, "max_positions": positions}
        self._sampler = TorchModel(ck.source, config, self.merged_params(), mode="generated")
        return self._sampler

    @property
    def max_positions(self) -> int:
        return self.checkpoint.config["max_positions"]

    def export_merged(self, out_dir, *, overwrite=False, **kwargs) -> Path:
        """The merged weights as an HF checkpoint (config and tokenizer of the base)."""
        import linnet.hf
        from linnet.runtime import TorchModel

        ck = self.checkpoint
        model = TorchModel(ck.source, ck.config, self.merged_params(), hf_config=ck.hf_config)
        tokenizer = ck.origin if Path(str(ck.origin)).is_dir() else None
        return linnet.hf.export(
            model, out_dir, tokenizer=tokenizer, overwrite=overwrite, progress=False, **kwargs
        )

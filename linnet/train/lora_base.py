"""What the PyTorch and JAX LoRA models share: the adapted program of a checkpoint, and the
two ways to load one (a checkpoint alone, or with a PEFT adapter folder)."""

from __future__ import annotations

from linnet.train.lora import LoraSpec, add_lora, init_lora, lora_names
from linnet.train.peft_format import load_adapter
from linnet.weights.checkpoint import open_checkpoint
from linnet.weights.maps.loading import find_weights_map


class LoraCheckpoint:
    """Subclasses take `(checkpoint, spec, *, adapters=None, seed=0, ...)` and call `_adapt`."""

    def _adapt(self, checkpoint, spec: LoraSpec, adapters, seed: int) -> dict:
        """Set the base and adapted programs and the adapter names; return the adapters'
        initial values (`adapters` over a seeded init)."""
        self.checkpoint, self.spec = checkpoint, spec  # an OpenCheckpoint
        self.base_program = checkpoint.source.program(checkpoint.config)
        self.program, self.targets = add_lora(self.base_program, spec)
        initial = init_lora(self.program, self.targets, seed)
        initial.update(adapters or {})
        self.adapter_names = [n for t in self.targets for n in lora_names(t)]
        return initial

    @classmethod
    def load(cls, path, spec: LoraSpec, *, dtype="f32", **kwargs):
        return cls(open_checkpoint(path, dtype=dtype), spec, **kwargs)

    @classmethod
    def from_peft(cls, path, adapter_folder, *, dtype="f32", **kwargs):
        """The checkpoint with a PEFT adapter folder's LoRA weights (and its r, alpha)."""
        ck = open_checkpoint(path, dtype=dtype)
        names = ck.source.program(ck.config).params
        adapters, spec, _ = load_adapter(adapter_folder, cls._wmap(ck), names)
        return cls(ck, spec, adapters=adapters, **kwargs)

    @staticmethod
    def _wmap(ck):
        return find_weights_map(ck.hf_config["architectures"][0])

    def wmap(self):
        return self._wmap(self.checkpoint)

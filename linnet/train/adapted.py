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

from linnet.train.grpo import completion_logps
from linnet.train.head import LmHead, labelled_logps, last_logps, split_head
from linnet.train.lora import LoraSpec, lora_graph
from linnet.train.lora_base import LoraCheckpoint
from linnet.train.module import trainable_module
from linnet.train.objectives import token_logps
from linnet.train.peft_format import merge_lora, save_adapter
from linnet.train.prefix import PrefixRunner, hidden_decode, shared_labelled_logps, shared_start
from linnet.train.tokens import IGNORE


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
        cut_head=True,
    ):
        initial = self._adapt(checkpoint, spec, adapters, seed)
        self.numerics, self.checkpointed = numerics, checkpoint_layers
        self.base = checkpoint.torch_params()
        # the LM head apart: losses run it only where they read logits (train/head.py)
        program, self.head_spec = (
            self._without_head(self.program) if cut_head else (self.program, None)
        )
        self.module = trainable_module(
            program,
            {**self.base, **{k: v.to(self.dtype) for k, v in initial.items()}},
            trainable=lambda name: name in self.adapter_names,
            lora_dropout=spec.dropout,
            numerics=numerics,
            checkpointed=checkpoint_layers,  # each layer recomputed in the backward
        )
        self.head = LmHead.of(self.head_spec, self.module) if self.head_spec else None
        self._reference = None
        self._sampler = None  # the rollout decoder, kept across steps
        self._prefix: dict = {}  # reference? -> PrefixRunner or None (train/prefix.py)

    def _without_head(self, program):
        """The program whose `forward` stops before the LM head, and the head; or the
        program itself and None (a head that trains, or a tail that is no plain linear)."""
        split = split_head(program)
        if split is None or split[1].weight in self.adapter_names:
            return program, None
        return split

    @property
    def dtype(self):
        return next(iter(self.base.values())).dtype

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        out = self.module(ids)
        return self.head.logits(out) if self.head else out

    def label_logps(self, ids, labels, *, reference=False):
        """`objectives.token_logps(self(ids), labels)` (or of `reference(ids)`), the
        logits computed only at labelled positions; a start all rows share is run once."""
        module = self._reference_module() if reference else self.module
        if self.head is None or not (labels[:, 1:] != IGNORE).any():
            logits = self.reference(ids) if reference else self(ids)
            return token_logps(logits, labels)
        start = shared_start(ids, labels)  # DPO's rows share their chat template's start
        runner = self._prefix_runner(reference) if start else None
        with torch.set_grad_enabled(not reference and torch.is_grad_enabled()):
            if runner is not None:
                return shared_labelled_logps(runner, self.head, ids, labels, start)
            return labelled_logps(module, self.head, ids, labels)

    def completion_logps(self, ids, completion, temperature, *, reference=False, ran=None):
        """`grpo.completion_logps` of this model's (or the reference's) logits, the head
        run on the completion's positions only; a prompt all rows share is run once (`ran`:
        the policy's prompt pass that `prompt_pass` made)."""
        if self.head is None:
            logits = self.reference(ids) if reference else self(ids)
            return completion_logps(logits, completion, temperature)
        module = self._reference_module() if reference else self.module
        start = ids.shape[1] - completion.shape[1]
        shared = start > 0 and ids.shape[0] > 1 and bool((ids[:, :start] == ids[:1, :start]).all())
        runner = self._prefix_runner(reference) if shared else None
        with torch.set_grad_enabled(not reference and torch.is_grad_enabled()):
            if runner is None:
                return last_logps(module, self.head, ids, completion, temperature)
            hidden = runner.hidden(ids[0, :start], completion, None if reference else ran)
            rows = hidden.reshape(-1, hidden.shape[-1])
            picked = self.head.logps(rows, completion.reshape(-1), temperature)
            return picked.reshape(completion.shape)

    def _prefix_runner(self, reference: bool):
        """The shared-prompt runner (train/prefix.py), or None: no `decode` entry to cut,
        LoRA dropout (PEFT draws a mask per row, prompt included) or layer checkpointing
        (the caller chose memory over the repeated prompt)."""
        if reference not in self._prefix:
            decode = self.base_program.graphs.get("decode")
            graph = hidden_decode(decode) if decode is not None else None
            if graph is None or self.spec.dropout or self.checkpointed:
                self._prefix[reference] = None
                return None
            program = self.base_program if reference else self.program
            if not reference:
                graph = lora_graph(graph, self.targets, self.spec.r, self.spec.scale)
            module = self._reference_module() if reference else self.module
            weights = module.state_dict(keep_vars=True)
            self._prefix[reference] = PrefixRunner(program, graph, weights, self.numerics)
        return self._prefix[reference]

    def prompt_pass(self, prompt: list[int]):
        """The policy's shared-prompt pass over `prompt` (autograd on), for `completion_logps`
        and `prefill`; None where the loss runs the prompt per row."""
        runner = self._prefix_runner(False) if self.head is not None else None
        return runner.prompt(torch.tensor(prompt)) if runner is not None else None

    def prefill(self, decoder, ran, length: int) -> torch.Tensor:
        """`decoder` (the rollout's) left as if it had prefilled the `length`-token prompt
        of `ran` (`prompt_pass`'s): its cache copied in, the last logits [1, V] returned.
        The rollout and the loss share one prompt pass (rounded as the unmerged adapters)."""
        first, cache = ran
        decoder.reset()
        for name, shape, dtype in decoder._state_specs(1):
            decoder._new_state(name, shape, dtype)
        with torch.inference_mode():  # the decoder's states are inference tensors
            self._prefix[False].fill(decoder.state, cache)
            decoder.position = length
            return self.head.logits(first.detach()).reshape(1, -1)

    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    def reference(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits of the base weights (adapters disabled), without gradients."""
        with torch.no_grad():
            out = self._reference_module()(ids)
            return self.head.logits(out) if self.head else out

    def _reference_module(self):
        if self._reference is None:
            program = self.base_program
            if self.head is not None:
                program = split_head(program)[0]  # the base ends in the same head
            self._reference = trainable_module(
                program, self.base, trainable=lambda n: False, numerics=self.numerics
            )
        return self._reference

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

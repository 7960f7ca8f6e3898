"""A source's `forward` as a trainable PyTorch module: the generated straight-line code
(`linnet torch`), unfused so every param keeps the source's name, run with autograd on.

    module = trainable_module(program, params, trainable=lambda name: True)
    logits = module(tokens)          # [B, S, vocab], differentiable

Params that train are copied (the caller's tensors stay as they were) and become leaves
with `requires_grad`; frozen ones are shared as they are.

`checkpoint_layers=True` writes the entry outlined (`linnet.backends.torch.outlined`: one
method per layer kind, called once per layer) and runs each layer call under
`torch.utils.checkpoint`: a layer's activations are dropped after the forward and computed
again during the backward, so only the values passed between layers are kept.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

import torch
import torch.utils.checkpoint

from linnet.backends.torch.codegen import generate_graphs, lower_entries
from linnet.backends.torch.outlined import emit_outlined
from linnet.backends.torch.runners import load_generated
from linnet.errors import LinnetError
from linnet.ir.program import Program
from linnet.train.lora import lora_dropout_source


def training_source(program: Program, numerics: str = "equivalent", outlined=False) -> str:
    """The generated module's text with the `forward` entry only (no KV cache);
    `outlined`: one method per layer kind (`_forward_layer<k>`), called per layer."""
    if "forward" not in program.graphs:
        raise LinnetError(f"the {program.name} source has no `forward` entry to train")
    graphs, _ = lower_entries(program, fuse=False)
    emitter = emit_outlined if outlined else None
    return generate_graphs(program, {"forward": graphs["forward"]}, numerics, emitter=emitter)


def layer_methods(module: torch.nn.Module) -> list[str]:
    """The outlined layer methods of a generated module (`_forward_layer0`, ...)."""
    return [n for n in vars(type(module)) if re.fullmatch(r"_forward_layer\d+", n)]


def checkpoint_layers(module: torch.nn.Module) -> list[str]:
    """Each layer method of `module` called through `torch.utils.checkpoint` (non-reentrant,
    so gradients reach params that are not arguments); the methods wrapped."""
    names = layer_methods(module)
    if not names:
        raise LinnetError("checkpoint_layers: the source's layers could not be outlined")
    for name in names:
        method = getattr(module, name)
        wrapped = functools.partial(torch.utils.checkpoint.checkpoint, method, use_reentrant=False)
        setattr(module, name, wrapped)
    return names


def trainable_module(
    program: Program,
    params: dict[str, torch.Tensor],
    *,
    numerics: str = "equivalent",
    trainable: Callable[[str], bool] = lambda name: True,
    lora_dropout: float = 0.0,
    checkpointed: bool = False,
) -> torch.nn.Module:
    """The generated module with `params` loaded; `trainable(name)` picks the leaves that
    get gradients; `lora_dropout` drops LoRA branch inputs in `train()` mode;
    `checkpointed`: each layer recomputed in the backward (activation checkpointing)."""
    text = training_source(program, numerics, outlined=checkpointed)
    text = lora_dropout_source(text, lora_dropout)
    module = load_generated(text, program.name)()
    names = module.state_dict().keys()  # tied params are not attributes of their own
    missing = [n for n in names if n not in params]
    if missing:
        raise LinnetError(f"no tensor for param {missing[0]} of the {program.name} source")
    weights = {n: params[n].detach().clone() if trainable(n) else params[n] for n in names}
    module.load_state_dict(weights, assign=True)
    for name, p in module.named_parameters():
        p.requires_grad_(trainable(name))
    if checkpointed:
        checkpoint_layers(module)
    return module

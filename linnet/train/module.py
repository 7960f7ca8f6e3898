"""A source's `forward` as a trainable PyTorch module: the generated straight-line code
(`linnet torch`), unfused so every param keeps the source's name, run with autograd on.

    module = trainable_module(program, params, trainable=lambda name: True)
    logits = module(tokens)          # [B, S, vocab], differentiable

Params that train are copied (the caller's tensors stay as they were) and become leaves
with `requires_grad`; frozen ones are shared as they are.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from linnet.backends.torch.codegen import generate_graphs, lower_entries
from linnet.backends.torch.runners import load_generated
from linnet.errors import LinnetError
from linnet.ir.program import Program
from linnet.train.lora import lora_dropout_source


def training_source(program: Program, numerics: str = "equivalent") -> str:
    """The generated module's text with the `forward` entry only (no KV cache)."""
    if "forward" not in program.graphs:
        raise LinnetError(f"the {program.name} source has no `forward` entry to train")
    graphs, _ = lower_entries(program, fuse=False)
    return generate_graphs(program, {"forward": graphs["forward"]}, numerics)


def trainable_module(
    program: Program,
    params: dict[str, torch.Tensor],
    *,
    numerics: str = "equivalent",
    trainable: Callable[[str], bool] = lambda name: True,
    lora_dropout: float = 0.0,
) -> torch.nn.Module:
    """The generated module with `params` loaded; `trainable(name)` picks the leaves that
    get gradients; `lora_dropout` drops LoRA branch inputs in `train()` mode."""
    text = lora_dropout_source(training_source(program, numerics), lora_dropout)
    module = load_generated(text, program.name)()
    names = module.state_dict().keys()  # tied params are not attributes of their own
    missing = [n for n in names if n not in params]
    if missing:
        raise LinnetError(f"no tensor for param {missing[0]} of the {program.name} source")
    weights = {n: params[n].detach().clone() if trainable(n) else params[n] for n in names}
    module.load_state_dict(weights, assign=True)
    for name, p in module.named_parameters():
        p.requires_grad_(trainable(name))
    return module

"""The LM head out of the generated training module, so that a loss computes logits only
where it reads them (issue 17).

An SFT row of 64 tokens labels a few of them (the completion); DPO labels completions;
GRPO reads the last `C` positions. The generated `forward` computes the head's
[B, S, vocab] logits at every position, and autograd keeps them for the backward: 14% of
an SFT step on SmolLM2, for positions no loss reads. `split_head` cuts the tail
`linear(h, w[, b])` (and its `cast`) off the `forward` graph, so the module returns `h`;
`LmHead.logps` then scores only the rows asked for, in chunks of `CHUNK` rows:

    log_softmax(linear(h, w, b) / temperature)[target]

and, in the same pass, its gradient with respect to `h`, `(onehot - softmax) @ w / T` per
row (each row's log-prob depends on that row's `h` alone), which the backward scales by the
incoming gradient. The logits of a chunk are dropped after it: no [rows, vocab] tensor is
kept for the backward. The head's weight is frozen (LoRA never trains it here); a source
whose `forward` does not end in a plain linear keeps its logits (`split_head` gives None).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from linnet.backends.torch.interp import TORCH_DTYPES
from linnet.ir.graph import Graph
from linnet.ir.program import Program
from linnet.train.tokens import IGNORE

CHUNK = 256  # rows of logits at a time: 256 x 49152 f32 is 50 MB


@dataclass(frozen=True)
class HeadSpec:
    weight: str  # the param the head multiplies by (`embed` when tied)
    bias: str | None
    dtype: str | None  # the tail's cast of the logits, if any


def _producers(graph: Graph) -> dict:
    return {n.output: n for n in graph.nodes if n.output is not None}


def _readers(graph: Graph, value) -> int:
    return sum(value in n.inputs for n in graph.nodes) + graph.outputs.count(value)


def find_head(graph: Graph):
    """(the head's `linear` node, the nodes it ends with, HeadSpec) or None."""
    if len(graph.outputs) != 1 or graph.state_outputs:
        return None
    made = _producers(graph)
    node, tail, dtype = made.get(graph.outputs[0]), [], None
    if node is not None and node.op == "cast" and _readers(graph, node.inputs[0]) == 1:
        dtype, tail, node = node.attrs["dtype"], [node], made.get(node.inputs[0])
    if node is None or node.op != "linear" or _readers(graph, node.output) != 1:
        return None
    names = {v: n for n, v in graph.params.items()}
    weight = names.get(node.inputs[1])
    bias = names.get(node.inputs[2]) if len(node.inputs) > 2 else None
    if weight is None or (len(node.inputs) > 2 and bias is None):
        return None
    return node, [node, *tail], HeadSpec(weight, bias, dtype)


def split_head(program: Program) -> tuple[Program, HeadSpec] | None:
    """`program` whose `forward` returns the head's input instead of the logits."""
    graph = program.graphs["forward"]
    found = find_head(graph)
    if found is None:
        return None
    head, tail, spec = found
    cut = Graph(
        graph.name,
        inputs=list(graph.inputs),
        dim_inputs=dict(graph.dim_inputs),
        params=dict(graph.params),
        states=dict(graph.states),
        nodes=[n for n in graph.nodes if all(n is not t for t in tail)],
        outputs=[head.inputs[0]],
        _next_id=graph._next_id,
    )
    return replace(program, graphs={**program.graphs, "forward": cut}), spec


class _PickedLogps(torch.autograd.Function):
    """log_softmax(linear(h, w, b) / T)[target] per row, chunked; the gradient per row kept."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, dtype):
        keep_grad = ctx.needs_input_grad[0]
        picked, grads = [], []
        for start in range(0, hidden.shape[0], CHUNK):
            rows = slice(start, start + CHUNK)
            logits = F.linear(hidden[rows], weight, bias)
            scores = logits.to(dtype or logits.dtype).float() / temperature
            logps = torch.log_softmax(scores, dim=-1)
            chosen = targets[rows].unsqueeze(-1)
            picked.append(logps.gather(-1, chosen).squeeze(-1))
            if keep_grad:  # d logp[target] / d scores = onehot - softmax
                ones = torch.ones_like(chosen, dtype=logps.dtype)
                slope = logps.exp_().neg_().scatter_add_(-1, chosen, ones)
                grads.append((slope / temperature).to(weight.dtype) @ weight)
        if keep_grad:
            ctx.save_for_backward(torch.cat(grads))
            ctx.hidden_dtype = hidden.dtype
        return torch.cat(picked)

    @staticmethod
    def backward(ctx, grad):
        (slopes,) = ctx.saved_tensors
        return (grad.unsqueeze(-1) * slopes).to(ctx.hidden_dtype), None, None, None, None, None


@dataclass
class LmHead:
    """The cut-off head over the module's own tensors (frozen)."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    dtype: torch.dtype | None

    @classmethod
    def of(cls, spec: HeadSpec, module: torch.nn.Module) -> LmHead:
        tensors = module.state_dict(keep_vars=True)
        bias = tensors[spec.bias] if spec.bias else None
        return cls(tensors[spec.weight], bias, TORCH_DTYPES[spec.dtype] if spec.dtype else None)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """What the uncut `forward` returned."""
        out = F.linear(hidden, self.weight, self.bias)
        return out.to(self.dtype) if self.dtype is not None else out

    def logps(self, hidden: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0):
        """Log-prob of `targets` [N] under rows `hidden` [N, D] (logits / temperature)."""
        if self.weight.requires_grad:
            raise RuntimeError("LmHead.logps: the head's weight is frozen here")
        return _PickedLogps.apply(hidden, self.weight, self.bias, targets, temperature, self.dtype)


def labelled_logps(hidden_of, head: LmHead, ids: torch.Tensor, labels: torch.Tensor):
    """`token_logps(logits, labels)` of `objectives` ([B, S-1] log-probs of the next labels,
    zero where unlabelled; the mask) with the hidden states of `hidden_of(ids)`: the
    positions after the last label are not run (under a causal mask they change nothing
    before them), and the head scores only the labelled rows."""
    mask = labels[:, 1:] != IGNORE
    last = int(mask.any(dim=0).nonzero().max()) + 1  # callers make sure one label exists
    hidden = hidden_of(ids[:, :last])
    kept = mask[:, :last]
    values = head.logps(hidden[kept], labels[:, 1 : last + 1][kept])
    picked = values.new_zeros(mask.shape).masked_scatter(mask, values)
    return picked, mask


def last_logps(hidden_of, head: LmHead, ids, completion: torch.Tensor, temperature: float):
    """Log-probs [G, C] of the last C tokens of `ids` (`completion`), as `grpo`'s
    `completion_logps(logits, completion, temperature)`."""
    width = completion.shape[1]
    hidden = hidden_of(ids)[:, -width - 1 : -1]
    rows = hidden.reshape(-1, hidden.shape[-1])
    return head.logps(rows, completion.reshape(-1), temperature).reshape(completion.shape)

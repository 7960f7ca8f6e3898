"""GRPO's and DPO's losses with the rows' shared prompt run once (issue 17).

A GRPO group is one prompt and `G` completions. The loss's forward over the [G, P + C] rows
ran the prompt's P positions once per row, though under the causal mask they are the same
in every row (a SmolLM2 prompt with its chat template is about 44 tokens, a completion 6
to 16). `PrefixRunner` runs the source's `decode` entry with autograd on instead: the
prompt at batch 1 (its keys and values written into a cache exactly P long), that cache
repeated `G` times along the batch axis (a differentiable copy: the prompt's gradient is
the sum of the rows'), then the completions at batch G from position P. The positions,
the causal mask and every op are the same as the full forward's; only the matmuls' shapes
(and so their rounding) differ.

The `decode` graph returns the last position's logits; `hidden_decode` cuts it to return
the head's input (the final norm) at every new position, as `head.split_head` does for
`forward`, and the head scores the completion's rows (`LmHead.logps`).

DPO's rows (each pair's chosen and rejected completions, the pairs of a batch) share their
first tokens too: the chat template's system prompt and the user header, 24 of SmolLM2's 44
to 46 tokens in the bench's batches. `shared_start` finds that prefix (no label inside it)
and `shared_labelled_logps` runs it once, the rest of every row at batch R from there: the
log-probs of `head.labelled_logps`, with 4 x 46 positions cut to 24 + 4 x 22.

The cache is split per layer and k/v (`split_entry_states`): each part is written once per
call before it is read, so autograd's version counters never see a saved view modified.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from linnet.backends.torch.codegen import generate_graphs
from linnet.backends.torch.runners import load_generated, split_entry_states
from linnet.ir.graph import Graph, GraphBuilder
from linnet.ir.passes import copy_frame
from linnet.ir.pipeline import run_pipelines
from linnet.ir.program import Program
from linnet.train.tokens import IGNORE

_TAIL_OPS = ("reshape", "slice", "cast")
# the shared prefix runs when it saves this many positions: below, the extra pass over the
# weights (its own matmuls at batch 1) costs about what it saves
MIN_SAVED = 32


def hidden_decode(graph: Graph) -> Graph | None:
    """`decode` returning the final norm's output at every new position, [B, S, dim];
    None when its tail is not `slice(last position) -> norm -> linear -> cast/slice`."""
    if len(graph.outputs) != 1:
        return None
    made = {n.output: n for n in graph.nodes if n.output is not None}
    node = made.get(graph.outputs[0])
    while node is not None and node.op in _TAIL_OPS:
        node = made.get(node.inputs[0])
    norm = made.get(node.inputs[0]) if node is not None and node.op == "linear" else None
    cut = made.get(norm.inputs[0]) if norm is not None else None
    if cut is None or cut.op != "slice":
        return None
    out, mapping = copy_frame(graph)
    b = GraphBuilder(out)
    dropped = {cut.output}
    for n in graph.nodes:
        if n is norm or any(v in dropped for v in n.inputs):
            if n.output is not None:
                dropped.add(n.output)
            continue
        result = b.add(n.op, [mapping[v] for v in n.inputs], where=n.where, **n.attrs)
        if n.output is not None:
            mapping[n.output] = result
    ins = [mapping[cut.inputs[0]]] + [mapping[v] for v in norm.inputs[1:]]
    out.outputs = [b.add(norm.op, ins, where=norm.where, **norm.attrs)]
    if any(v in dropped for v in graph.state_outputs.values()):
        return None
    out.state_outputs = {k: mapping[v] for k, v in graph.state_outputs.items()}
    return out


class PrefixRunner:
    """The hidden-state `decode` of `program` (LoRA applied or not) as a generated module
    over `weights` (the training module's own tensors: the same leaves get the gradients)."""

    def __init__(self, program: Program, graph: Graph, weights: dict, numerics: str):
        ready = run_pipelines({"decode": graph}, "torch.generated")
        graphs, self.parts = split_entry_states({"decode": ready["decode"].graph})
        self.graph = graphs["decode"]
        program = replace(program, graphs={"decode": graph})
        module = load_generated(generate_graphs(program, graphs, numerics), program.name)()
        given = {n: weights[n] for n in module.state_dict()}
        trains = {n: w.requires_grad for n, w in given.items()}
        module.load_state_dict(given, assign=True)  # takes each placeholder's requires_grad
        for name, w in given.items():
            w.requires_grad_(trains[name])
        self.module = module
        # a frozen runner (the reference) gives a prompt the same cache every time: DPO's
        # batches all start with the chat template's system prompt, so it is kept
        self.frozen = not any(trains.values())
        self._kept: dict = {}

    def _cache(self, rows: int, length: int, like: torch.Tensor) -> dict:
        """Zeroed parts `length` positions long (the graph's position axis is the one
        sized by the source's cache length, read from the part's type)."""
        out = {}
        for name, value in self.graph.states.items():
            shape = [d.value if d.is_const else rows for d in value.type.shape]
            shape[self._position_axis(value)] = length
            out[name.replace(".", "_")] = like.new_zeros(shape)
        return out

    @staticmethod
    def _position_axis(value) -> int:
        sizes = [d.value if d.is_const else 0 for d in value.type.shape]
        return sizes.index(max(sizes))  # the cache length dwarfs heads and head_dim

    @staticmethod
    def _batch_axis(value) -> int:
        return [d.is_const for d in value.type.shape].index(False)

    def fill(self, states: dict, cache: dict) -> None:
        """Copy `cache` (this runner's parts at batch 1, P positions) into a decoder's
        `states` (the same source's `decode` states, longer) at positions 0..P-1."""
        for state, parts in self.parts.items():
            for part, index in parts.items():
                value = cache[part.replace(".", "_")].detach()
                axis = self._position_axis(self.graph.states[part])
                target = states[state][index].narrow(axis, 0, value.shape[axis])
                if target.shape != value.shape:
                    raise ValueError(f"{part}: cache {tuple(value.shape)} vs {tuple(target.shape)}")
                target.copy_(value)

    def prompt(self, prompt: torch.Tensor):
        """(the prompt's last hidden state [1, 1, dim], its cache): `hidden`'s first pass,
        to hand back to it (GRPO's rollout reads the same pass first)."""
        return self._prompt(prompt)

    def _prompt(self, prompt: torch.Tensor):
        """The prompt's last hidden state [1, 1, dim] (predicts the next token) and its
        cache; a frozen runner's without autograd kept for the next call (the last 4)."""
        key = tuple(prompt.tolist())
        if key in self._kept:
            return self._kept[key]
        cache = self._cache(1, prompt.shape[0], next(iter(self.module.parameters())))
        first = self.module.decode(prompt[None], 0, **cache)[:, -1:]
        if self.frozen and not torch.is_grad_enabled():
            self._kept = {**dict(list(self._kept.items())[-3:]), key: (first, cache)}
        return first, cache

    def hidden(self, prompt: torch.Tensor, completion: torch.Tensor, ran=None) -> torch.Tensor:
        """The head's input [G, C, dim] at the positions that predict `completion` [G, C]
        after the shared `prompt` [P]: the prompt run once (or `ran`, what `prompt` gave),
        its cache shared."""
        groups, width, start = completion.shape[0], completion.shape[1], prompt.shape[0]
        first, cache = ran if ran is not None else self._prompt(prompt)
        first = first.expand(groups, 1, first.shape[-1])
        if width == 1:
            return first
        wide = {}
        for name, value in self.graph.states.items():
            part = cache[name.replace(".", "_")]
            axis = self._position_axis(value)
            shape = list(part.shape)
            shape[self._batch_axis(value)], shape[axis] = groups, width - 1
            wide[name.replace(".", "_")] = torch.cat(
                [part.expand(*shape[:axis], start, *shape[axis + 1 :]), part.new_zeros(shape)],
                dim=axis,
            )
        rest = self.module.decode(completion[:, :-1], start, **wide)
        return torch.cat([first, rest], dim=1)


def shared_start(ids: torch.Tensor, labels: torch.Tensor) -> int:
    """The length of the prefix every row shares and no label falls in (labels from the
    token after it on), or 0 where running it once would not save `MIN_SAVED` positions."""
    same = (ids == ids[:1]).all(dim=0).long()
    start = int(same.cumprod(0).sum())
    labelled = (labels[:, 1:] != IGNORE).any(dim=0).nonzero()
    if len(labelled):
        start = min(start, int(labelled.min()) + 1)  # column j labels token j + 1
    return start if start >= 2 and (ids.shape[0] - 1) * start >= MIN_SAVED else 0


def shared_labelled_logps(runner: PrefixRunner, head, ids, labels, start: int):
    """`head.labelled_logps(module, head, ids, labels)` with the rows' first `start` tokens
    (shared, unlabelled) run once: the rest of each row from there, at batch R."""
    mask = labels[:, 1:] != IGNORE
    last = int(mask.any(dim=0).nonzero().max()) + 1  # callers make sure one label exists
    hidden = runner.hidden(ids[0, :start], ids[:, start : last + 1])  # predicts start..last
    kept = mask[:, start - 1 : last]
    values = head.logps(hidden[kept], labels[:, start : last + 1][kept])
    picked = values.new_zeros(mask.shape).masked_scatter(mask, values)
    return picked, mask

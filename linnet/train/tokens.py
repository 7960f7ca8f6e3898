"""Rows to token ids, as TRL tokenizes them (chat template, completion from the common
prefix of prompt and prompt + completion), and batches: padded or packed rows.

    example = sft_example(tokenizer, row, completion_only=True, max_positions=2048)
    batches = sft_batches(examples, batch_size=2, pad_id=0, pack=128)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from linnet.train.data import DataError

IGNORE = -100  # a label that takes no part in the loss (as transformers and TRL)


@dataclass
class Example:
    ids: list[int]
    mask: list[int]  # 1 where the token is trained on
    where: str = ""


def chat_ids(tokenizer, messages, generation_prompt=False) -> list[int]:
    out = tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=True, add_generation_prompt=generation_prompt
    )
    return list(out["input_ids"])


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _check_length(n: int, max_positions: int, where: str) -> None:
    if n > max_positions:
        raise DataError(
            f"{where}: {n} tokens, longer than the model's {max_positions} positions "
            "(shorten the row or raise max_positions)"
        )


def sft_example(tokenizer, row: dict, *, completion_only: bool, max_positions: int) -> Example:
    where = row.get("_where", "")
    if "messages" in row:
        ids = chat_ids(tokenizer, row["messages"])
        mask = [1] * len(ids)
    else:
        prompt = chat_ids(tokenizer, row["prompt"], generation_prompt=True)
        ids = chat_ids(tokenizer, row["prompt"] + row["completion"])
        start = common_prefix(prompt, ids) if completion_only else 0
        mask = [0] * start + [1] * (len(ids) - start)
    _check_length(len(ids), max_positions, where)
    return Example(ids, mask, where)


def _pad(rows: list[list[int]], value: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=torch.long)


def labelled_batch(examples: list[Example], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, labels) right-padded; labels are the ids where trained on, else IGNORE."""
    ids = [e.ids for e in examples]
    labels = [[t if m else IGNORE for t, m in zip(e.ids, e.mask)] for e in examples]
    return _pad(ids, pad_id), _pad(labels, IGNORE)


def packed_rows(examples: list[Example], length: int) -> list[Example]:
    """Every example's tokens end to end, cut into rows of `length` (TRL's "wrapped"
    packing: a row may start mid-sequence; the last row is shorter)."""
    ids = [t for e in examples for t in e.ids]
    mask = [m for e in examples for m in e.mask]
    return [Example(ids[i : i + length], mask[i : i + length]) for i in range(0, len(ids), length)]


def sft_batches(examples, batch_size: int, pad_id: int, pack: int = 0) -> list[tuple]:
    rows = packed_rows(examples, pack) if pack else list(examples)
    return [
        labelled_batch(rows[i : i + batch_size], pad_id) for i in range(0, len(rows), batch_size)
    ]


@dataclass
class Preference:
    prompt: list[int]
    chosen: list[int]
    rejected: list[int]
    where: str = ""


def dpo_example(tokenizer, row: dict, *, max_positions: int) -> Preference:
    where = row.get("_where", "")
    prompt = chat_ids(tokenizer, row["prompt"], generation_prompt=True)
    chosen = chat_ids(tokenizer, row["prompt"] + row["chosen"])
    rejected = chat_ids(tokenizer, row["prompt"] + row["rejected"])
    start = min(common_prefix(prompt, chosen), common_prefix(prompt, rejected))
    _check_length(max(len(chosen), len(rejected)), max_positions, where)
    return Preference(prompt[:start], chosen[start:], rejected[start:], where)


def dpo_batch(pairs: list[Preference], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, labels): the chosen rows then the rejected ones, labels on completions only."""
    examples = [
        Example(p.prompt + p.chosen, [0] * len(p.prompt) + [1] * len(p.chosen)) for p in pairs
    ]
    examples += [
        Example(p.prompt + p.rejected, [0] * len(p.prompt) + [1] * len(p.rejected)) for p in pairs
    ]
    return labelled_batch(examples, pad_id)


def dpo_batches(pairs, batch_size: int, pad_id: int) -> list[tuple]:
    return [dpo_batch(pairs[i : i + batch_size], pad_id) for i in range(0, len(pairs), batch_size)]

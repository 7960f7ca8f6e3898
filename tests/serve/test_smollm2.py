"""SmolLM2-135M-Instruct's real weights (f32) through `linnet serve` (mode generated, 4
rows): six greedy chat requests at once (more than the rows, prompts of different lengths
so every row sits at its own position, one prefilled in chunks) each give what the same
request alone gives, and both give transformers' greedy tokens, cut at the checkpoint's
end-of-sequence ids, with the same usage."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from tests.checkpoints import chat_prompt_ids, reference_greedy
from tests.serve.conftest import wait_ready

NEW = 12  # greedy tokens asked of each request
MESSAGES = [
    "What is 2 plus 2?",
    "Say hello.",
    "Tell me a joke.",
    "Name three colours of the rainbow and say which one you like best, in one sentence.",
    "Hi",
    "Translate 'good morning' into French.",
]


def expected(folder, tokenizer, ids: list[int], eos: set[int]) -> tuple[str, int, str]:
    """transformers' greedy answer: its text (EOS not shown), tokens drawn, finish reason."""
    new = reference_greedy(folder, torch.tensor([ids]), NEW, stop_at_eos=True)[0, len(ids) :]
    new = new.tolist()
    end = next((i for i, t in enumerate(new) if t in eos), None)
    shown = new if end is None else new[:end]
    count = len(new) if end is None else end + 1
    reason = "length" if end is None else "stop"
    return tokenizer.decode(shown, skip_special_tokens=True), count, reason


def test_smollm2_concurrent_equals_solo_equals_transformers(smollm2_checkpoint):
    import openai
    from transformers import AutoTokenizer

    import linnet.serve
    from linnet.commands.run import eos_ids

    tokenizer = AutoTokenizer.from_pretrained(smollm2_checkpoint, trust_remote_code=False)
    prompts = [p[0].tolist() for p in chat_prompt_ids(tokenizer, MESSAGES)]
    eos = set(eos_ids(smollm2_checkpoint, tokenizer))
    want = [expected(smollm2_checkpoint, tokenizer, ids, eos) for ids in prompts]
    options = dict(rows=4, positions=128, mode="generated", port=0, name="smol")
    with linnet.serve.start(str(smollm2_checkpoint), prefill_chunk=16, **options) as server:
        wait_ready(server.url, timeout=600)
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="-", max_retries=0, timeout=600)

        def ask(ids):
            out = client.completions.create(model="smol", prompt=ids, max_tokens=NEW, temperature=0)
            choice = out.choices[0]
            return choice.text, out.usage.completion_tokens, choice.finish_reason

        with ThreadPoolExecutor(len(prompts)) as pool:
            together = list(pool.map(ask, prompts))
        alone = [ask(ids) for ids in prompts]
    for i, message in enumerate(MESSAGES):
        assert together[i] == alone[i] == want[i], (message, together[i], alone[i], want[i])

"""What clients get from `linnet.serve`, through the `openai` client: greedy answers that do not
depend on what else is in flight and equal transformers', streams that concatenate to the
whole answer, stop strings and max_tokens, exact usage, seeded sampling."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch

from tests.checkpoints import load_reference
from tests.serve.conftest import EOS, MODEL, greedy_answer, metric, wait_metric


def mixed_prompts(n: int = 16) -> list[tuple[list[int], int]]:
    """(prompt ids, max_tokens) of mixed lengths: 3 to 60 prompt tokens (past the 16-token
    prefill chunk), 4 to 40 new tokens; ids avoid EOS so prompts do not end early."""
    g = torch.Generator().manual_seed(13)
    out = []
    for i in range(n):
        length = [3, 60, 9, 33, 17, 5, 48, 21][i % 8] + i // 8
        ids = torch.randint(3, 256, (length,), generator=g).tolist()
        out.append((ids, [4, 40, 12, 25, 7, 31, 18, 9][(i * 3) % 8]))
    return out


def complete(client, ids, max_tokens, **kw):
    return client.completions.create(
        model=MODEL, prompt=ids, max_tokens=max_tokens, temperature=0, **kw
    )


def test_concurrent_greedy_equals_solo_equals_transformers(client, served, tiny_served, tokenizer):
    prompts = mixed_prompts()
    solo = [complete(client, ids, n) for ids, n in prompts]
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(lambda p: complete(client, *p), prompts))
    stops = 0  # requests that end at EOS: the stop path is in the mix
    for (ids, n), alone, crowd in zip(prompts, solo, together):
        want, generated, reason = greedy_answer(tiny_served, tokenizer, ids, n)
        assert crowd.choices[0].text == alone.choices[0].text == want, (len(ids), n)
        assert crowd.usage.completion_tokens == alone.usage.completion_tokens == generated
        assert crowd.usage.prompt_tokens == len(ids)
        assert crowd.usage.total_tokens == len(ids) + generated
        assert crowd.choices[0].finish_reason == reason
        stops += reason == "stop"
    assert 0 < stops < len(prompts)
    wait_metric(served.url, "linnet_rows_in_use", 0)


def test_chat_uses_the_template_and_matches_transformers(client, tiny_served, tokenizer):
    messages = [{"role": "system", "content": "w3 w4"}, {"role": "user", "content": "w7 w8 w9"}]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    got = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=20, temperature=0
    )
    want, generated, _ = greedy_answer(tiny_served, tokenizer, list(ids), 20)
    assert got.choices[0].message.content == want
    assert got.choices[0].message.role == "assistant"
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (len(ids), generated)


def streamed(client, chat: bool, **kw):
    """(concatenated text, finish reasons, usage chunks) of a streamed request."""
    if chat:
        chunks = list(client.chat.completions.create(model=MODEL, stream=True, **kw))
        parts = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    else:
        chunks = list(client.completions.create(model=MODEL, stream=True, **kw))
        parts = [c.choices[0].text for c in chunks if c.choices]
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    return "".join(parts), [r for r in reasons if r], [c.usage for c in chunks if c.usage]


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_stream_concatenates_to_the_whole_answer(client, chat):
    kw = (
        dict(messages=[{"role": "user", "content": "w5 w6"}])
        if chat
        else dict(prompt="w5 w6 w7 w8")
    )
    whole = (client.chat.completions if chat else client.completions).create(
        model=MODEL, max_tokens=30, temperature=0, **kw
    )
    text, reasons, usages = streamed(
        client, chat, max_tokens=30, temperature=0, stream_options={"include_usage": True}, **kw
    )
    want = whole.choices[0].message.content if chat else whole.choices[0].text
    assert text == want and len(want.split()) > 3
    assert reasons == [whole.choices[0].finish_reason]
    assert [u.model_dump() for u in usages] == [whole.usage.model_dump()]


def test_stop_strings_end_the_text_before_them(client, tokenizer):
    """A stop string cut from the middle of the greedy answer, across two tokens' text: the
    answer ends right before it, whole or streamed (no part of it is ever streamed)."""
    prompt = "w11 w12 w13"
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=30, temperature=0)
    words = full.choices[0].text.split(" ")
    assert len(words) > 6, words
    stop = f"{words[4][1:]} {words[5][:2]}"  # "23 w4": the tail of one word, the head of the next
    cut = full.choices[0].text.index(stop)
    kw = dict(prompt=prompt, max_tokens=30, temperature=0, stop=[stop, "never-seen"])
    got = client.completions.create(model=MODEL, **kw)
    assert got.choices[0].text == full.choices[0].text[:cut]
    assert got.choices[0].finish_reason == "stop"
    text, reasons, _ = streamed(client, False, **kw)
    assert (text, reasons) == (full.choices[0].text[:cut], ["stop"])
    # generation ended at the token that completed the stop string: words 0..5 were drawn
    assert got.usage.completion_tokens == 6


def test_max_tokens_ends_with_length(client, tiny_served, tokenizer):
    ids = tokenizer("w40 w41")["input_ids"]
    want, generated, _ = greedy_answer(tiny_served, tokenizer, ids, 9)
    assert generated == 9 and len(want.split()) == 9  # no EOS nor unknown word: a fair probe
    for n in (1, 5, 9):
        got = client.completions.create(model=MODEL, prompt="w40 w41", max_tokens=n, temperature=0)
        assert got.choices[0].text == " ".join(want.split()[:n])
        assert got.choices[0].finish_reason == "length"
        assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (len(ids), n)


def greedy_past_eos(folder, ids: list[int], n: int) -> list[int]:
    """transformers' model, greedy, `n` tokens whatever they are (its `generate` fills an
    unset eos_token_id from the checkpoint's generation config, so it is not used here)."""
    model = load_reference(folder)
    seq = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(n):
            nxt = model(input_ids=seq).logits[0, -1].argmax()
            seq = torch.cat([seq, nxt.view(1, 1)], dim=1)
    return seq[0, len(ids) :].tolist()


def test_ignore_eos_runs_to_max_tokens_as_transformers(client, tiny_served, tokenizer):
    """vLLM's `ignore_eos` (the serving benchmark asks every system for exactly its tokens):
    the prompts whose greedy answer stops at EOS go on to `max_tokens`, token for token as
    transformers' greedy decoding that ignores EOS."""
    ending = [(ids, n) for ids, n in mixed_prompts() if greedy_answer(tiny_served, tokenizer,
              ids, n)[2] == "stop"]  # fmt: skip
    assert ending
    for ids, n in ending:
        got = complete(client, ids, n, extra_body={"ignore_eos": True})
        new = greedy_past_eos(tiny_served, ids, n)
        assert EOS in new
        assert got.choices[0].text == tokenizer.decode(new, skip_special_tokens=True)
        assert got.choices[0].finish_reason == "length"
        assert got.usage.completion_tokens == n


def test_seeded_sampling_does_not_depend_on_the_crowd(client):
    """The same seed draws the same tokens alone and among 7 other sampled requests; top_k 1
    is greedy."""
    kw = dict(
        prompt="w20 w21 w22", max_tokens=16, temperature=1.5, top_p=0.9, extra_body={"top_k": 50}
    )
    alone = client.completions.create(model=MODEL, seed=7, **kw).choices[0].text
    with ThreadPoolExecutor(8) as pool:
        crowd = list(
            pool.map(lambda s: client.completions.create(model=MODEL, seed=s, **kw), range(3, 11))
        )
    assert crowd[4].choices[0].text == alone
    assert len({c.choices[0].text for c in crowd}) > 1  # the seeds do differ
    greedy = client.completions.create(
        model=MODEL, prompt="w20 w21 w22", max_tokens=16, temperature=0
    )
    top1 = client.completions.create(
        model=MODEL,
        prompt="w20 w21 w22",
        max_tokens=16,
        temperature=1.5,
        extra_body={"top_k": 1},
        seed=1,
    )
    assert top1.choices[0].text == greedy.choices[0].text


def test_metrics_count_requests_and_tokens(client, served):
    before = metric(served.url, "linnet_generation_tokens_total")
    got = client.completions.create(model=MODEL, prompt="w9", max_tokens=6, temperature=0)
    after = metric(served.url, "linnet_generation_tokens_total")
    assert after - before == got.usage.completion_tokens
    text = httpx.get(served.url + "/metrics").text
    names = [
        "linnet_time_to_first_token_seconds_count",
        "linnet_inter_token_seconds_count",
        "linnet_queue_depth",
        'linnet_requests_total{route="/v1/completions",status="200"}',
    ]
    for name in names:
        assert f"\n{name} " in text, name

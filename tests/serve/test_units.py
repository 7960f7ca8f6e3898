"""The server's pure pieces on their own: released text around stop strings and unfinished
characters, and the sampler's cuts."""

from __future__ import annotations

import numpy as np

from linnet.serve.sampling import Sampler, SamplingParams
from linnet.serve.textout import TextOut

WORDS = {1: "ab", 2: "c", 3: "de", 4: "f", 5: "\ufffd"}


def decode(ids):
    return "".join(WORDS[i] for i in ids)


def released(stops, tokens):
    out = TextOut(decode, stops)
    parts = [out.add(t) for t in tokens]
    return parts, out


def test_a_possible_stop_string_is_held_then_released_when_it_is_not_one():
    parts, out = released(["cdX"], [1, 2, 3, 4])
    # "c" could start "cdX": held until "cde" rules it out
    assert parts == ["ab", "", "cde", "f"]
    assert not out.stopped and out.text == "abcdef"


def test_a_stop_string_across_tokens_cuts_the_text_before_it():
    parts, out = released(["cde", "zz"], [1, 2, 3])
    assert parts == ["ab", "", ""] and out.stopped and out.text == "ab"
    assert "".join(parts) + out.flush() == "ab"


def test_an_unfinished_character_waits_for_the_next_token():
    parts, out = released([], [1, 5, 2])
    assert parts[:2] == ["ab", ""]
    assert "".join(parts) + out.flush() == out.text == "ab\ufffdc"


def test_greedy_is_the_argmax():
    logits = np.array([0.1, 3.0, 2.9, -1.0], dtype=np.float32)
    assert Sampler(SamplingParams(temperature=0))(logits) == 1


def test_top_k_and_top_p_cut_the_draws():
    logits = np.log(np.array([0.05, 0.5, 0.3, 0.15]))
    top2 = Sampler(SamplingParams(temperature=1.0, top_k=2, seed=0))
    assert {top2(logits) for _ in range(200)} == {1, 2}
    # mass before token 2 is 0.5 < 0.6: tokens 1 and 2 make the nucleus; token 3 is out
    nucleus = Sampler(SamplingParams(temperature=1.0, top_p=0.6, seed=0))
    assert {nucleus(logits) for _ in range(200)} == {1, 2}
    everything = Sampler(SamplingParams(temperature=1.0, seed=0))
    assert {everything(logits) for _ in range(400)} == {0, 1, 2, 3}


def test_a_seed_gives_the_same_draws():
    logits = np.random.default_rng(3).normal(size=50)
    a, b = (Sampler(SamplingParams(seed=11)) for _ in range(2))
    assert [a(logits) for _ in range(20)] == [b(logits) for _ in range(20)]
    c = Sampler(SamplingParams(seed=12))
    assert [a(logits) for _ in range(20)] != [c(logits) for _ in range(20)]

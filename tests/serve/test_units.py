"""The server's pure pieces on their own: released text around stop strings and unfinished
characters, and the sampler's cuts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

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


# -- incremental decoding: the text equals the decoding of all tokens ------------------------
_TEXT = (
    "Héllo wörld, naïve café! 日本語のテキスト、中文字符。 Emoji: 🙂🚀👩‍💻 and ASCII words, "
    "dashes — “quotes” ‘too’ … ß Ω ∑ ≤ ≥ ﬁ. "
)


def _byte_bpe():
    """A byte-level BPE (as SmolLM2's) trained here on text with 2-, 3- and 4-byte
    characters: random ids then cut characters between tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,  # few merges: most multi-byte characters stay cut
        special_tokens=["<|endoftext|>", "<|im_start|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([_TEXT] * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def _word_level():
    import tempfile

    from transformers import PreTrainedTokenizerFast

    from tests.tiny_tokenizer import add_tiny_tokenizer

    with tempfile.TemporaryDirectory() as folder:
        add_tiny_tokenizer(Path(folder))
        return PreTrainedTokenizerFast.from_pretrained(folder, trust_remote_code=False)


def check_incremental(tokenizer, sequences, stops=()):
    """After every token: TextOut's text is the decoding of all tokens so far, cut before
    the first stop string, and begins with all released so far; the released parts and
    the flush concatenate to the final text."""

    def decode(ids):
        return tokenizer.decode(ids, skip_special_tokens=True)

    for ids in sequences:
        out = TextOut(decode, list(stops))
        parts = []
        for k, token in enumerate(ids):
            parts.append(out.add(token))
            full = decode(ids[: k + 1])
            cuts = [i for i in (full.find(s) for s in stops) if i >= 0]
            assert out.text == full[: min(cuts)] if cuts else full, (ids[: k + 1], out.text)
            assert "".join(parts) == out.sent and out.text.startswith(out.sent)
            if out.stopped:
                break
        assert "".join(parts) + out.flush() == out.text


def test_incremental_text_equals_full_decode_byte_level():
    tokenizer = _byte_bpe()
    rng = np.random.default_rng(0)
    vocab = len(tokenizer)
    random_ids = [rng.integers(0, vocab, 60).tolist() for _ in range(30)]
    encoded = tokenizer(_TEXT)["input_ids"]
    assert "\ufffd" in "".join(tokenizer.decode([t]) for t in encoded)  # cuts characters
    with_specials = [encoded[:20] + [0] + encoded[20:40] + [1] + encoded[40:]]
    check_incremental(tokenizer, random_ids + [encoded] + with_specials)
    check_incremental(tokenizer, [encoded] * 2 + random_ids[:10], stops=["café", "中文", "🚀"])


def test_incremental_text_equals_full_decode_word_level():
    """Words joined with spaces: a token's text depends on the one before it."""
    tokenizer = _word_level()
    rng = np.random.default_rng(1)
    sequences = [rng.integers(0, 256, 40).tolist() for _ in range(20)]
    check_incremental(tokenizer, sequences)
    check_incremental(tokenizer, sequences, stops=["w1", "3 w"])


def test_the_server_function_serves_more_than_once_in_a_process():
    """`linnet.serve.server` stays the function after its first call imports the module that
    holds `Server` (a submodule named `server` used to replace it on the package)."""
    import linnet.serve
    from linnet.serve.hosting import Server

    made = [linnet.serve.server(f"model-{i}", port=0) for i in range(2)]
    assert all(isinstance(s, Server) for s in made)
    assert callable(linnet.serve.server) and not isinstance(linnet.serve.server, type(linnet))


def test_threads_sets_torch_threads(tiny_served):
    """`linnet serve --threads N` (open_engine's `threads`) is torch's intra-op thread count."""
    import torch

    from linnet.serve.engine import open_engine

    before = torch.get_num_threads()
    want = 2 if before == 1 else 1
    try:
        open_engine(str(tiny_served), rows=1, threads=want, mode="interpret")
        assert torch.get_num_threads() == want
    finally:
        torch.set_num_threads(before)


class RecordingRows:
    """Rows that decode nothing (logits of zeros: greedy draws id 0) but record each call."""

    def __init__(self, rows: int, vocab: int = 8):
        self.rows, self.positions, self.vocab = rows, 1000, vocab
        self.lengths = [0] * rows
        self.calls: list[tuple[str, int]] = []  # ("prefill", tokens) or ("step", rows)

    def prefill(self, row, ids):
        self.calls.append(("prefill", len(ids)))
        self.lengths[row] += len(ids)
        return np.zeros(self.vocab, np.float32)

    def step(self, rows, ids):
        self.calls.append(("step", len(rows)))
        for r in rows:
            self.lengths[r] += 1
        return np.zeros((len(rows), self.vocab), np.float32)

    def free(self, row):
        self.lengths[row] = 0

    def length(self, row):
        return self.lengths[row]


def test_a_round_prefills_one_chunk_in_all_so_decoding_rows_keep_stepping():
    """Three 40-token prompts arrive while a row decodes: each round feeds one chunk (16) of
    prompt tokens in all, oldest first, and the decoding row steps every round."""
    from linnet.serve.metrics import Metrics
    from linnet.serve.scheduler import Job, Scheduler

    def job(length: int) -> Job:
        return Job(prompt=list(range(length)), max_tokens=20,
                   sampler=Sampler(SamplingParams(temperature=0)),
                   text=TextOut(lambda ids: "x" * len(ids), []), eos=frozenset(),
                   notify=lambda update: None)  # fmt: skip

    rows = RecordingRows(4)
    scheduler = Scheduler(rows, Metrics(), max_queue=8, chunk=16)
    first, *late = job(5), job(40), job(40), job(40)
    scheduler.submit(first)
    scheduler._round()
    for j in late:
        scheduler.submit(j)
    while scheduler._busy():
        seen = len(rows.calls)
        decoding = not first.done
        scheduler._round()
        this_round = rows.calls[seen:]
        assert sum(n for kind, n in this_round if kind == "prefill") <= 16
        assert not decoding or this_round[-1][0] == "step"
    assert [j.generated for j in (first, *late)] == [20] * 4
    assert sum(n for kind, n in rows.calls if kind == "prefill") == 5 + 3 * 40


def test_serving_dtype_computes_bf16_checkpoints_in_f32_where_the_cpu_has_no_bf16_dot(
    monkeypatch,
):
    """docs/serve.md "Session 12" and "Session 13": a bf16/f16 HF checkpoint on PyTorch
    computes in f32 where the CPU multiplies bf16 by widening it and Linnet's bf16 GEMV does
    not run (f16 has none); with the GEMV bf16 stays. Asked dtypes, GGUF files, other
    backends, f32 checkpoints and CPUs with bf16 dot products keep theirs."""
    import torch

    from linnet.backends.torch import kernels, prelude
    from linnet.serve.engine import serving_dtype

    monkeypatch.setitem(prelude._LOWP_NATIVE, torch.bfloat16, False)
    monkeypatch.setitem(prelude._LOWP_NATIVE, torch.float16, False)
    monkeypatch.setattr(kernels, "bf16_gemv_available", lambda: False)
    assert serving_dtype(None, "torch", "bf16", gguf=False) == "f32"
    assert serving_dtype(None, "torch", "f16", gguf=False) == "f32"
    assert serving_dtype("bf16", "torch", "bf16", gguf=False) == "bf16"
    assert serving_dtype(None, "torch", "bf16", gguf=True) is None
    assert serving_dtype(None, "jax", "bf16", gguf=False) is None
    assert serving_dtype(None, "torch", "f32", gguf=False) is None
    monkeypatch.setattr(kernels, "bf16_gemv_available", lambda: True)
    assert serving_dtype(None, "torch", "bf16", gguf=False) is None
    assert serving_dtype(None, "torch", "f16", gguf=False) == "f32"
    monkeypatch.setitem(prelude._LOWP_NATIVE, torch.bfloat16, True)
    monkeypatch.setattr(kernels, "bf16_gemv_available", lambda: False)
    assert serving_dtype(None, "torch", "bf16", gguf=False) is None


def test_generated_rows_run_numerics_fast_and_interpret_keeps_equivalent(tiny_served):
    """The server's PyTorch generated code runs "fast" (decode_ops.cpp's per-row attention:
    tests/backends/test_row_attention.py); the interpreter has only "equivalent"."""
    from linnet.serve.engine import open_engine

    fast = open_engine(str(tiny_served), rows=2, mode="generated")
    assert fast.rows.model.numerics == "fast"
    assert open_engine(str(tiny_served), rows=2, mode="interpret").rows.model.numerics == (
        "equivalent"
    )


@pytest.mark.parametrize("setting", [None, "auto"])
def test_served_weights_wait_for_every_2mb_page(tiny_served, monkeypatch, setting):
    """Every 2 MB page counted slow: `linnet run`'s load (LINNET_HUGE_PAGES unset: "auto")
    moves nothing into 2 MB pages, the server's moves every weight (it loads once and
    decodes for hours); LINNET_HUGE_PAGES set still decides for both."""
    import linnet.torch
    from linnet.backends.torch import huge_pages
    from linnet.serve.engine import open_engine

    monkeypatch.setattr(huge_pages, "MIN_BYTES", 0)
    monkeypatch.setattr(huge_pages, "SLOW_FAULT_S", -1.0)
    if setting is None:
        monkeypatch.delenv("LINNET_HUGE_PAGES", raising=False)
    else:
        monkeypatch.setenv("LINNET_HUGE_PAGES", setting)

    def storages(model) -> int:
        module = model.runner.module
        return len({d[k].untyped_storage().data_ptr() for d, k in huge_pages.slots(module, {})})

    run = linnet.torch.load(str(tiny_served), mode="generated")
    served = open_engine(str(tiny_served), rows=1, mode="generated").rows.model
    assert storages(run) > 1  # torch's own allocations, one a weight
    assert storages(served) == (1 if setting is None else storages(run))
    assert huge_pages.mode() == "auto"  # outside the server's load

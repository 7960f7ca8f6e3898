"""`linnet run`: streamed greedy text, the same as transformers' generate on SmolLM2."""

from __future__ import annotations

import io
import re
import shutil

import pytest
import torch
from click.testing import CliRunner

from linnet.cli import main
from linnet.commands.run import TextStream
from tests.checkpoints import chat_prompt_ids, reference_greedy
from tests.tiny_tokenizer import add_tiny_tokenizer

PROMPT = "What is 2 plus 2?"


def run(*args):
    return CliRunner().invoke(main, ["run", *args], catch_exceptions=False)


@pytest.fixture(scope="module")
def tokenizer(smollm2_checkpoint):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_checkpoint, trust_remote_code=False)


def test_run_chat_matches_transformers_generate(smollm2_checkpoint, tokenizer):
    done = run(str(smollm2_checkpoint), "--prompt", PROMPT, "--max-new-tokens", "24")
    assert done.exit_code == 0, done.output
    ids = chat_prompt_ids(tokenizer, [PROMPT])[0]
    out = reference_greedy(smollm2_checkpoint, ids, 24, stop_at_eos=True)
    want = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert done.stdout.strip() == want.strip()
    assert "4" in want  # "The answer to this classic math problem is 4."
    assert "tokens/s" in done.stderr


def test_run_plain_text_by_name_with_a_local_checkpoint(smollm2_checkpoint, tokenizer):
    import torch

    text = "The capital of France is"
    done = run(
        "smollm2-135m-instruct",
        "--checkpoint",
        str(smollm2_checkpoint),
        "--no-chat",
        "--prompt",
        text,
        "--max-new-tokens",
        "8",
    )
    assert done.exit_code == 0, done.output
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    out = reference_greedy(smollm2_checkpoint, ids, 8, stop_at_eos=True)
    assert (
        done.stdout.strip()
        == tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()
    )


def test_stream_writes_each_token_as_it_comes_and_never_half_a_character(tokenizer):
    import torch

    text = "Café au lait, 日本語のテキスト 🦜 naïve — done."
    ids = tokenizer(text)["input_ids"]
    out = io.StringIO()
    writes = []
    stream = TextStream(tokenizer, out)
    for i in ids:
        before = out.tell()
        stream(torch.tensor([i]))
        writes.append(out.getvalue()[before:])
    assert out.getvalue() == tokenizer.decode(ids, skip_special_tokens=True) == text
    assert "\ufffd" not in out.getvalue()
    assert sum(bool(w) for w in writes) > len(ids) // 2  # streamed, not written at the end
    assert any(not w for w in writes)  # a character's bytes span tokens: held back


def test_stream_decodes_a_short_window_each_step_and_writes_the_whole_text(tokenizer):
    import torch

    text = " ".join(["The lighthouse keeper counted the waves, 日本語, naïve 🦜."] * 30)
    ids = tokenizer(text)["input_ids"]
    lengths = []

    class Counting:  # the tokenizer, recording how many ids each decode is given
        def decode(self, part, **kw):
            lengths.append(len(part))
            return tokenizer.decode(part, **kw)

    out = io.StringIO()
    stream = TextStream(Counting(), out)
    for i in ids:
        stream(torch.tensor([i]))
    assert len(ids) > 400 and out.getvalue() == tokenizer.decode(ids, skip_special_tokens=True)
    assert max(lengths) <= 8  # not the whole answer every step


def test_run_unknown_target():
    done = CliRunner().invoke(main, ["run", "no-such-model", "--prompt", "hi"])
    assert done.exit_code == 1 and "is not a zoo entry" in done.output


def test_run_a_gguf_file(smollm2_checkpoint, tokenizer):
    """A .gguf path runs with the GGUF's own tokenizer and chat template: the Q4_1 file
    dequantizes to the weights of the f32 checkpoint, so the text is transformers'."""
    from tests.checkpoints import smollm2_gguf_path

    done = run(str(smollm2_gguf_path()), "--prompt", PROMPT, "--max-new-tokens", "12")
    assert done.exit_code == 0, done.output
    ids = chat_prompt_ids(tokenizer, [PROMPT])[0]
    out = reference_greedy(smollm2_checkpoint, ids, 12, stop_at_eos=True)
    want = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert done.stdout.strip() == want.strip()


@pytest.mark.parametrize("target", ["no/such/folder", "./no-such-folder", "not a repo/x y"])
def test_run_a_mistyped_path_is_one_error_line(target):
    """Neither a folder, a file, a zoo entry nor an HF repo id: exit 1, one line, no traceback
    (huggingface_hub would refuse it as a repo id with an exception of its own)."""
    done = CliRunner().invoke(main, ["run", target, "--prompt", "hi"])
    assert done.exit_code == 1, done.output
    assert done.exception is None or isinstance(done.exception, SystemExit)
    assert "Traceback" not in done.output and target in done.output


@pytest.mark.parametrize("command", ["run", "parity"])
def test_a_folder_without_a_tokenizer_is_one_error_line(tiny_checkpoint, command):
    """A checkpoint folder with weights and config but no tokenizer: a clear error, exit 1."""
    folder = tiny_checkpoint("LlamaForCausalLM")
    done = CliRunner().invoke(main, [command, str(folder), "--prompt", "hi"])
    assert done.exit_code == 1, done.output
    assert "tokenizer" in done.output and "Traceback" not in done.output


BACKENDS = [
    ["--backend", "torch", "--mode", "interpret"],
    ["--backend", "torch"],  # generated, numerics fast: the defaults
    ["--backend", "torch", "--numerics", "equivalent"],
    ["--backend", "jax"],
    ["--backend", "onnx"],
]


@pytest.mark.parametrize("choice", BACKENDS, ids=lambda c: "-".join(c[1::2]))
def test_run_on_each_backend_and_mode_matches_transformers(smollm2_checkpoint, tokenizer, choice):
    """SmolLM2's real weights in f32: every backend and mode the CLI offers gives the text of
    transformers' greedy generate, and reports load, first-token and decode times apart."""
    done = run(str(smollm2_checkpoint), "--prompt", PROMPT, "--max-new-tokens", "12", *choice)
    assert done.exit_code == 0, done.output
    ids = chat_prompt_ids(tokenizer, [PROMPT])[0]
    out = reference_greedy(smollm2_checkpoint, ids, 12, stop_at_eos=True)
    assert (
        done.stdout.strip()
        == tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()
    )
    assert re.search(r"load [\d.]+ s; first token [\d.]+ s; \d+ tokens in [\d.]+ s", done.stderr)


@pytest.fixture
def tiny_chat(tiny_checkpoint, tmp_path):
    """A tiny random Llama with a byte-level tokenizer and a chat template."""
    folder = tmp_path / "tiny-chat"
    shutil.copytree(tiny_checkpoint("LlamaForCausalLM"), folder)
    return add_tiny_tokenizer(folder, chat=True)


@pytest.mark.parametrize(
    "mode", ["interpret", "generated", "compile", "generated/equivalent", "compile/equivalent"]
)
def test_run_modes_on_a_tiny_checkpoint_match_transformers(tiny_chat, mode):
    """Every PyTorch mode, compile included (SmolLM2's 30 layers compile for minutes), with
    the default numerics (fast; equivalent for the interpreter) and with equivalent."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_chat, trust_remote_code=False)
    mode, _, numerics = mode.partition("/")
    choice = ["--mode", mode] + (["--numerics", numerics] if numerics else [])
    done = run(str(tiny_chat), "--prompt", "w7 w8 w9", "--max-new-tokens", "6", *choice)
    assert done.exit_code == 0, done.output
    ids = chat_prompt_ids(tok, ["w7 w8 w9"])[0]
    out = reference_greedy(tiny_chat, ids, 6, stop_at_eos=True)
    assert done.stdout.rstrip("\n") == tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def test_mode_is_pytorchs_only(tiny_chat):
    done = CliRunner().invoke(
        main, ["run", str(tiny_chat), "--prompt", "hi", "--backend", "jax", "--mode", "compile"]
    )
    assert done.exit_code == 2 and "PyTorch" in done.output


@pytest.mark.parametrize(
    "choice",
    [["--backend", "jax", "--numerics", "fast"], ["--mode", "interpret", "--numerics", "fast"]],
)
def test_numerics_it_cannot_run_is_a_usage_error(tiny_chat, choice):
    done = CliRunner().invoke(main, ["run", str(tiny_chat), "--prompt", "hi", *choice])
    assert done.exit_code == 2 and "--numerics" in done.output, done.output


def greedy_answer(folder, tok, history, n):
    ids = tok.apply_chat_template(
        history, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    out = reference_greedy(folder, torch.tensor([list(ids)]), n, stop_at_eos=True)
    return tok.decode(out[0, len(ids) :], skip_special_tokens=True)


def test_chat_keeps_the_history(tiny_chat):
    """Two turns on standard input: each answer is transformers' greedy answer to the whole
    conversation so far (the second prompt holds the first exchange); /reset forgets it."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_chat, trust_remote_code=False)
    turns = ["w7 w8 w9", "w10 w11", "/reset", "w10 w11"]
    done = CliRunner().invoke(
        main,
        ["chat", str(tiny_chat), "--max-new-tokens", "5", "--system", "w3"],
        input="\n".join(turns) + "\n",
    )
    assert done.exit_code == 0, done.output
    history = [{"role": "system", "content": "w3"}]
    want = []
    for turn in ["w7 w8 w9", "w10 w11"]:
        history.append({"role": "user", "content": turn})
        want.append(greedy_answer(tiny_chat, tok, history, 5))
        history.append({"role": "assistant", "content": want[-1]})
    fresh = [{"role": "system", "content": "w3"}, {"role": "user", "content": "w10 w11"}]
    want.append(greedy_answer(tiny_chat, tok, fresh, 5))
    assert done.stdout == "".join(answer + "\n" for answer in want)
    assert want[1] != want[2]  # the history changed the second answer


@pytest.mark.parametrize("which", ["smollm2", "tiny"])
def test_the_direct_tokenizer_is_autotokenizers(smollm2_checkpoint, tiny_chat, which):
    """`load_tokenizer` builds a plain fast tokenizer's class directly (no AutoTokenizer:
    ~4 s less of a fresh `linnet run`); it must be what AutoTokenizer gives: the same class,
    template, EOS, chat and plain ids (a system turn and two user turns) and decoded text."""
    from transformers import AutoTokenizer

    from linnet.parity import load_tokenizer
    from linnet.parity.prompts import _tokenizer_class

    folder = smollm2_checkpoint if which == "smollm2" else tiny_chat
    assert _tokenizer_class(folder, None) is not AutoTokenizer  # the direct path is taken
    direct = load_tokenizer(folder)
    auto = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    assert type(direct) is type(auto) and direct.chat_template == auto.chat_template
    assert direct.eos_token_id == auto.eos_token_id
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "w1 w2 héllo, 2 + 2?"},
        {"role": "assistant", "content": "w3 four"},
        {"role": "user", "content": "w4 and then?"},
    ]
    kw = dict(add_generation_prompt=True, tokenize=True, return_dict=True)
    chat = direct.apply_chat_template(history, **kw)["input_ids"]
    assert chat == auto.apply_chat_template(history, **kw)["input_ids"]
    assert direct("w5 plain  text ü")["input_ids"] == auto("w5 plain  text ü")["input_ids"]
    ids = list(range(min(200, len(auto))))
    assert direct.decode(ids, skip_special_tokens=True) == auto.decode(
        ids, skip_special_tokens=True
    )

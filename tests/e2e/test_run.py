"""`linnet run`: streamed greedy text, the same as transformers' generate on SmolLM2."""

from __future__ import annotations

import io

import pytest
from click.testing import CliRunner

from linnet.cli import main
from linnet.commands.run import TextStream
from tests.checkpoints import chat_prompt_ids, reference_greedy

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
    done = run("smollm2-135m-instruct", "--checkpoint", str(smollm2_checkpoint), "--no-chat",
               "--prompt", text, "--max-new-tokens", "8")  # fmt: skip
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

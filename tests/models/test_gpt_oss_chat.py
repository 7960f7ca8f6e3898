"""GPT-OSS's chat format (harmony) through the checkpoint's own template (issue 16).

`linnet run` and the parity prompts template a conversation with the tokenizer's
`apply_chat_template`, so a GPT-OSS checkpoint's harmony template applies as it is. The tiny
checkpoints have no tokenizer; this one gets a word tokenizer whose last ids are harmony's
special tokens and a template shaped like openai/gpt-oss-20b's: a system message with
`strftime_now` (a function transformers gives templates), `<|start|>ROLE<|message|>...<|end|>`
turns, the generation prompt `<|start|>assistant`, and generation_config.json's EOS list
(`<|return|>`, `<|call|>`), as the real checkpoint has them.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from linnet.cli import main
from linnet.parity.prompts import encode_prompts
from tests.tiny_decoders import reference_greedy
from tests.tiny_gpt_oss import build_gpt_oss

HARMONY = ["<|start|>", "<|message|>", "<|end|>", "<|channel|>", "<|return|>", "<|call|>"]
TEMPLATE = (
    "<|start|>system<|message|>w1 w2 {{ strftime_now('%Y') | length }}<|end|>"
    "{% for m in messages %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>"
    "{% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)


@pytest.fixture(scope="module")
def harmony_checkpoint(tmp_path_factory):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder = build_gpt_oss("spread", tmp_path_factory.mktemp("gpt-oss-chat"))
    named = ["system", "user", "assistant", *HARMONY]  # the last ids of the 256
    vocab = {f"w{i}": i for i in range(256 - len(named))}
    vocab |= {t: len(vocab) + k for k, t in enumerate(named)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens([AddedToken(t, special=True) for t in HARMONY])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", eos_token="<|return|>")
    fast.chat_template = TEMPLATE
    fast.save_pretrained(folder)
    eos = [vocab["<|return|>"], vocab["<|call|>"]]
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return folder


def _templated(folder, text):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, return_dict=True
    )["input_ids"]
    return tok, list(ids)


def test_parity_prompts_take_the_harmony_template(harmony_checkpoint):
    tok, want = _templated(harmony_checkpoint, "w7 w8 w9")
    start = tok.convert_tokens_to_ids("<|start|>")
    assert want.count(start) == 3 and want[-2:] == [start, tok.convert_tokens_to_ids("assistant")]
    (got,) = encode_prompts(tok, ["w7 w8 w9"], chat=True)
    assert got.tolist() == [want]


def test_run_answers_as_transformers_on_the_harmony_prompt(harmony_checkpoint):
    import torch

    tok, ids = _templated(harmony_checkpoint, "w7 w8 w9")
    done = CliRunner().invoke(
        main,
        ["run", str(harmony_checkpoint), "--prompt", "w7 w8 w9", "--max-new-tokens", "6"],
        catch_exceptions=False,
    )
    assert done.exit_code == 0, done.output
    out = reference_greedy(harmony_checkpoint, torch.tensor([ids]), 6, stop_at_eos=True)
    want = tok.decode(out[0, len(ids) :], skip_special_tokens=True)
    assert want.strip()  # the answer is not empty, so the comparison says something
    assert done.stdout.rstrip("\n") == want

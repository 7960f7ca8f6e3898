"""A tokenizer for the tiny random checkpoints (which have none): one word per id, `w0` to
`w255` (unknown words are `w0`), saved as transformers saves it, so `linnet run` and
`linnet chat` take the folder like a real one. Every id decodes to ASCII, so streamed text
is never held back for an unfinished UTF-8 character (random byte tokens would be)."""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def add_tiny_tokenizer(folder: Path, *, chat: bool = False) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(256)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0")
    if chat:
        fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    return folder

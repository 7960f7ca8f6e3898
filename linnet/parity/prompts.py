"""Text in: a checkpoint's tokenizer and the prompts as token ids.

    tokenizer = load_tokenizer(folder)                    # or load_tokenizer(folder, "x.gguf")
    ids = encode_prompts(tokenizer, ["Say hello."], chat=True)  # one [1, S] tensor each

Chat models get their chat template with the generation prompt; others the plain text.
"""

from __future__ import annotations

import json
from pathlib import Path

from linnet.errors import CheckpointError
from linnet.remote_code import refuse_remote_code
from linnet.weights.jsonfile import check_json_companions

# tokenizer_config.json classes that are transformers' plain fast tokenizer: built directly,
# without AutoTokenizer's config resolution, which imports torch and the modeling code
# (5.4-6.0 s of a fresh `linnet run` process against 1.3-1.4 s, docs/zoo.md)
_PLAIN_FAST = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(folder: Path, gguf_file: str | None = None, light: bool = False):
    """transformers' tokenizer of a checkpoint folder (or of a GGUF file in it); a folder
    without one is a CheckpointError that says so, not transformers' traceback.
    `light`: a JsonTokenizer (encode, decode, chat template; no transformers import) where
    the folder's files allow one."""
    refuse_remote_code(folder)
    check_json_companions(folder)
    if light and gguf_file is None:
        from linnet.parity.json_tokenizer import open_json_tokenizer

        if (tokenizer := open_json_tokenizer(folder)) is not None:
            return tokenizer
    try:
        cls = _tokenizer_class(Path(folder), gguf_file)
        return cls.from_pretrained(folder, gguf_file=gguf_file, trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - any failure on a user's files is named, not raised
        why = str(err).strip().splitlines()[0].rstrip(" :") if str(err).strip() else repr(err)
        where = f"{folder}/{gguf_file}" if gguf_file else str(folder)
        raise CheckpointError(f"{where}: no tokenizer transformers can load ({why})") from err


def _tokenizer_class(folder: Path, gguf_file: str | None):
    """The class tokenizer_config.json names when it is the plain fast tokenizer (the same
    class AutoTokenizer would pick), else AutoTokenizer."""
    import transformers

    config = folder / "tokenizer_config.json"
    if gguf_file is None and config.is_file() and (folder / "tokenizer.json").is_file():
        name = json.loads(config.read_text(encoding="utf-8")).get("tokenizer_class")
        if name in _PLAIN_FAST and hasattr(transformers, name):
            return getattr(transformers, name)
    return transformers.AutoTokenizer


def encode_prompts(tokenizer, prompts, chat: bool):
    """One [1, S] LongTensor per prompt: chat-templated (with the generation prompt) or plain."""
    import torch

    out = []
    for text in prompts:
        if chat:
            ids = chat_ids(tokenizer, [{"role": "user", "content": text}])
        else:
            ids = tokenizer(text)["input_ids"]
        out.append(torch.tensor([list(ids)], dtype=torch.long))
    return out


def chat_ids(tokenizer, messages) -> list[int]:
    """The conversation through the checkpoint's chat template, with the generation prompt;
    a template that fails (its own raise_exception, a sandbox refusal, bad syntax) is a
    CheckpointError with its message."""
    import jinja2

    try:
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
    except jinja2.exceptions.TemplateError as err:
        raise CheckpointError(f"the checkpoint's chat template failed: {err}") from err
    return list(ids)

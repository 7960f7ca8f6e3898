"""Text in: a checkpoint's tokenizer and the prompts as token ids.

    tokenizer = load_tokenizer(folder)                    # or load_tokenizer(folder, "x.gguf")
    ids = encode_prompts(tokenizer, ["Say hello."], chat=True)  # one [1, S] tensor each

Chat models get their chat template with the generation prompt; others the plain text.
"""

from __future__ import annotations

from pathlib import Path

from linnet.errors import CheckpointError
from linnet.remote_code import refuse_remote_code
from linnet.weights.jsonfile import check_json_companions


def load_tokenizer(folder: Path, gguf_file: str | None = None):
    """transformers' tokenizer of a checkpoint folder (or of a GGUF file in it); a folder
    without one is a CheckpointError that says so, not transformers' traceback."""
    from transformers import AutoTokenizer

    refuse_remote_code(folder)
    check_json_companions(folder)
    try:
        return AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file, trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - any failure on a user's files is named, not raised
        why = str(err).strip().splitlines()[0].rstrip(" :") if str(err).strip() else repr(err)
        where = f"{folder}/{gguf_file}" if gguf_file else str(folder)
        raise CheckpointError(f"{where}: no tokenizer transformers can load ({why})") from err


def encode_prompts(tokenizer, prompts, chat: bool):
    """One [1, S] LongTensor per prompt: chat-templated (with the generation prompt) or plain."""
    import torch

    out = []
    for text in prompts:
        if chat:
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
            )["input_ids"]
        else:
            ids = tokenizer(text)["input_ids"]
        out.append(torch.tensor([list(ids)], dtype=torch.long))
    return out

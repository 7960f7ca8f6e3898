"""A JSON file of a user's checkpoint, read as data and checked to be an object.

    config = read_json_object(folder / "tokenizer_config.json")

A file that cannot be read, is not JSON or is not an object is a `CheckpointError` naming it.
"""

from __future__ import annotations

import json
from pathlib import Path

from linnet.errors import CheckpointError

# The largest companion people ship is a tokenizer.json of ~30 MB; past this a "JSON file"
# is an attack on memory, not a config.
MAX_JSON_BYTES = 256 * 1024 * 1024


def read_json_object(path: Path) -> dict:
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise CheckpointError(
                f"{path}: {path.stat().st_size} bytes, larger than any JSON companion "
                f"({MAX_JSON_BYTES} at most)",
                file=str(path),
            )
        data = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise CheckpointError(f"{path}: JSON nested too deeply", file=str(path)) from None
    except (OSError, UnicodeDecodeError, ValueError) as err:  # ValueError: JSON syntax, huge ints
        raise CheckpointError(f"{path}: not a readable JSON file ({err})", file=str(path)) from err
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object", file=str(path))
    return data


# The JSON files transformers reads beside config.json to build a tokenizer and generate.
COMPANION_JSON = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "generation_config.json",
    "chat_template.json",
)


def check_json_companions(folder: Path) -> None:
    """Each JSON companion of `folder` that exists is a readable JSON object, or a
    `CheckpointError` naming it (transformers would end in a JSONDecodeError traceback)."""
    for name in COMPANION_JSON:
        if (Path(folder) / name).is_file():
            read_json_object(Path(folder) / name)

"""A JSON file of a user's checkpoint, read as data and checked to be an object.

    config = read_json_object(folder / "tokenizer_config.json")

A file that cannot be read, is not JSON or is not an object is a `CheckpointError` naming it.
"""

from __future__ import annotations

import json
from pathlib import Path

from linnet.errors import CheckpointError


def read_json_object(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: not a readable JSON file ({err})", file=str(path)) from err
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object", file=str(path))
    return data

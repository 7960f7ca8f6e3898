"""A checkpoint's own code never runs.

    refuse_remote_code(folder)   # before transformers reads a user's folder
    AutoTokenizer.from_pretrained(folder, trust_remote_code=False)

A Hugging Face folder asks for its own Python (`configuration_*.py`, `modeling_*.py`,
`tokenization_*.py`) through an `auto_map` in one of its JSON files. Linnet refuses such a
folder with its own error, naming the file, before transformers sees it; every call into
transformers also passes `trust_remote_code=False`, so transformers neither runs the code
nor asks on standard input whether it may (tests/weights/test_remote_code.py checks both).
"""

from __future__ import annotations

from pathlib import Path

from linnet.errors import RemoteCode
from linnet.weights.jsonfile import read_json_object

# The files transformers reads an `auto_map` from.
AUTO_MAP_FILES = (
    "config.json",
    "tokenizer_config.json",
    "processor_config.json",
    "preprocessor_config.json",
    "feature_extractor_config.json",
    "image_processor_config.json",
)


def refuse_remote_code(folder: str | Path) -> None:
    """Raise `RemoteCode` when a file of `folder` maps a transformers class to the
    checkpoint's own code; a file that is not a JSON object is a `CheckpointError`."""
    folder = Path(folder)
    for name in AUTO_MAP_FILES:
        path = folder / name
        if not path.is_file():
            continue
        data = read_json_object(path)
        auto_map = data.get("auto_map")
        if auto_map:
            classes = ", ".join(sorted(auto_map)) if isinstance(auto_map, dict) else auto_map
            raise RemoteCode(
                f"{path}: `auto_map` asks transformers to import this checkpoint's own code "
                f"({classes}); Linnet never runs a checkpoint's code",
                file=str(path),
            )

"""Training data as JSONL: TRL's conversational format, read and checked line by line.

    rows = read_jsonl("sft.jsonl", "sft")  # {"messages"} or {"prompt", "completion"}
    rows = read_jsonl("dpo.jsonl", "dpo")  # {"prompt", "chosen", "rejected"}

Each message is `{"role": ..., "content": "..."}`. A mistake is a `DataError` naming the
file and line: not JSON, a missing or empty field, a message without role or content, an
empty file, and (at tokenization, `linnet.train.tokens`) a sequence longer than the model's
positions.
"""

from __future__ import annotations

import json
from pathlib import Path

from linnet.errors import LinnetError

FIELDS = {
    "sft": (("messages",), ("prompt", "completion")),
    "dpo": (("prompt", "chosen", "rejected"),),
    "grpo": (("prompt",),),
}


class DataError(LinnetError):
    """A training file that cannot be used, with the file and line at fault."""


def _check_messages(value, field: str, where: str) -> None:
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: field {field!r} must be a non-empty list of messages")
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise DataError(f"{where}: {field}[{i}] has no 'role' (a message is {{role, content}})")
        if not isinstance(message.get("content"), str):
            raise DataError(f"{where}: {field}[{i}] has no text 'content'")


def check_row(row, kind: str, where: str) -> dict:
    """`row` if it has one of the field sets `kind` takes, each a list of messages."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: a line must be a JSON object, not {type(row).__name__}")
    choices = FIELDS[kind]
    fields = next((f for f in choices if all(k in row for k in f)), None)
    if fields is None:
        wanted = " or ".join("+".join(f) for f in choices)
        missing = [k for k in choices[0] if k not in row]
        raise DataError(f"{where}: missing field {missing[0]!r} (a {kind} row has {wanted})")
    for field in fields:
        _check_messages(row[field], field, where)
    kept = {k: row[k] for k in fields}
    if kind == "grpo" and "answer" in row:
        kept["answer"] = row["answer"]
    return kept


def read_jsonl(path, kind: str) -> list[dict]:
    """The rows of a JSONL file for `kind` ("sft", "dpo" or "grpo"); blank lines skipped."""
    if kind not in FIELDS:
        raise DataError(f"unknown data kind {kind!r}: choose one of {', '.join(FIELDS)}")
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: cannot read the data file ({err})") from err
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{where}: not JSON ({err.msg} at column {err.colno})") from err
        rows.append((where, check_row(row, kind, where)))
    if not rows:
        raise DataError(f"{path}: the data file is empty (no JSON lines)")
    return [dict(row, _where=where) for where, row in rows]


def write_jsonl(path, rows) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path

"""Per-row positions in the language (issue 13): what the checker refuses, and the IR that
`decode_rows` lowers to (zoo/llama.linnet). The numbers are checked end to end in
tests/backends/test_rows.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from linnet.errors import SourceError
from linnet.source import Source

LLAMA = (Path(__file__).resolve().parents[2] / "zoo" / "llama.linnet").read_text()
WRITE = "  cache[0, :, :, at : at + S] = k                           # each row at its own"


def edit(old: str, new: str) -> str:
    assert LLAMA.count(old) == 1, f"ambiguous or missing edit target: {old!r}"
    return LLAMA.replace(old, new)


def first_message(text: str) -> str:
    with pytest.raises(SourceError) as info:
        Source.parse_text(text, "llama.linnet")
    diags = info.value.diagnostics
    assert diags
    return diags[0].message


@pytest.mark.parametrize(
    "old,new,message",
    [
        (WRITE, WRITE.replace("at : at + S", "at : S"), "spans `at : at + n`"),
        (WRITE, WRITE.replace("at : at + S", "at : reach + S"), "spans `at : at + n`"),
        (
            WRITE,
            WRITE.replace("cache[0, :, :,", "cache[0, 0, :,").replace("= k ", "= k[0]"),
            "one i64 start per row",
        ),
        (
            "fn rotate_rows(x: act[B, H, S, head_dim], at: i64[B])",
            "fn rotate_rows(x: act[B, H, S, head_dim], at: i64[S])",
            "per-row positions must be i64[rows]",
        ),
        (
            "o = attention(q, keys, values, causal=true, q_offset=at, window=window)\n"
            "  return linear(merge_heads(o), p.wo, p.bo)\n\nfn mlp",
            "o = attention(q, keys, values, causal=true, q_offset=f32(at), window=window)\n"
            "  return linear(merge_heads(o), p.wo, p.bo)\n\nfn mlp",
            "per-row positions must be i64[rows]",
        ),
    ],
    ids=["stop-not-at-plus", "stop-other-dim", "rows-dropped", "rope-vector-length", "f32"],
)
def test_per_row_mistakes_are_diagnosed(old, new, message):
    assert message in first_message(edit(old, new))


def test_decode_rows_lowers_to_per_row_ops():
    """Rope and attention take the positions [B, S] as an operand, the cache writes are
    `update_rows` with a row axis, and no op keeps a scalar offset."""
    source = Source.parse_text(LLAMA, "llama.linnet")
    config = source.config({"dim": 64, "n_heads": 4, "n_kv": 2, "n_layers": 2, "ffn": 64,
                            "vocab": 32, "max_positions": 16, "window": 4})  # fmt: skip
    graph = source.program(config).graphs["decode_rows"]
    by_op: dict = {}
    for node in graph.nodes:
        by_op.setdefault(node.op, []).append(node)
    writes = by_op["update_rows"]
    assert len(writes) == 4 and "update_slice" not in by_op
    assert all(n.attrs["row_axis"] == 2 and n.attrs["axis"] == 4 for n in writes)
    for op in ("rope", "attention", "update_rows"):
        for node in by_op[op]:
            positions = node.inputs[-1].type
            assert positions.dtype == "i64" and [str(d) for d in positions.shape] == ["B", "S"]
    assert all(
        str(n.attrs["q_offset"]) == "0" and n.attrs["window"] == 4 for n in by_op["attention"]
    )
    assert all(str(n.attrs["offset"]) == "0" for n in by_op["rope"])

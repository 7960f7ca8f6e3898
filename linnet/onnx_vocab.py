"""numerics="fast" `decode`: the vocabulary projection as an int8 MatMul, the greedy token f32's.

The last MatMul of an exported `decode` (final hidden state h [B, 1, d] times a [d, V] weight,
Whisper's: the tied token embedding read through a Transpose) is the larger half of a one-token
step for a 51865-token vocabulary. `int8_projection` makes the fast folder's `decode` compute it
as onnxruntime's dynamic quantization does: h quantized per tensor (u8, DynamicQuantizeLinear),
the weight per output column (symmetric, `qmax` = 127, or 63 where reduce_range, see
onnx_fast.py), a MatMulInteger and the two scales; the graph also outputs h.

`Int8Vocab` then keeps the greedy token exactly f32's. Each int8 logit is within `bound(h)` of
the exact dot product h . w_j: with h = h' + e (|e| <= s_x / 2, no clipping in u8 of the
tensor's range) and w = w' + f (|f| <= s_w / 2 per column),
|h.w - h'.w'| <= (s_w/2) sum|h| + (s_x/2) sum|w_j| + d s_x s_w / 4, taken over the largest s_w
and sum|w_j| (one scalar per row), plus f32 rounding. A token can only win (be the exact
argmax among the tokens the rules leave) if its int8 logit is within twice that bound of the
largest allowed int8 logit; those candidates' logits are recomputed from h and the f32 weight
rows (in f64, rounded to f32) and the argmax is taken among them. Whatever needs the whole f32
row (sampling, log-probabilities, Whisper's timestamp rule, `decode`'s return value) gets h @ W
in f32 from the same weights (`full`): as costly as before, never approximate.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from linnet.errors import LinnetError

#: linnet.json's key on the fast folder's `decode` entry.
KEY = "int8_vocab"
HIDDEN = "hidden"
EPS32 = float(np.finfo(np.float32).eps)


def _external(tensor, folder: Path) -> np.ndarray:
    """An f32 initializer's values: read from its external data file, or inline."""
    from onnx import numpy_helper
    from onnx.external_data_helper import ExternalDataInfo

    if not tensor.external_data:
        return numpy_helper.to_array(tensor)
    info = ExternalDataInfo(tensor)
    return np.memmap(
        folder / info.location, dtype=np.float32, mode="r", offset=info.offset or 0,
        shape=tuple(tensor.dims),
    )  # fmt: skip


def _projection(graph, output: str):
    """(the MatMul node, the [V, d] initializer it reads through a Transpose, or the [d, V]
    one it reads directly) whose result becomes `output`; None where there is none."""
    producers = {o: n for n in graph.node for o in n.output}
    inits = {t.name: t for t in graph.initializer}
    node = producers.get(output)
    while node is not None and node.op_type in ("Reshape", "Squeeze", "Identity"):
        node = producers.get(node.input[0])
    if node is None or node.op_type != "MatMul":
        return None
    b = node.input[1]
    if b in inits and len(inits[b].dims) == 2:
        return node, inits[b], False
    t = producers.get(b)
    if t is not None and t.op_type == "Transpose" and t.input[0] in inits:
        return node, inits[t.input[0]], True
    return None


def int8_projection(source: Path, target: Path, qmax: int) -> dict | None:
    """Write `source` (an exported decode.onnx) as `target` with its vocabulary projection
    int8 and its final hidden state as a second output; the new weights go to
    `target`.data, the others stay where the export keeps them. Returns what `Int8Vocab`
    needs (linnet.json's `int8_vocab`), or None where the graph has no such projection."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(source), load_external_data=False)
    graph = model.graph
    found = _projection(graph, graph.output[0].name)
    if found is None:
        return None
    node, weight, transposed = found
    w = _external(weight, source.parent)
    w = np.asarray(w.T if transposed else w, dtype=np.float32)  # [d, V]
    scale = np.abs(w).max(0) / qmax
    max_scale = float(scale.max())  # a zero column (a padding token's) is exact: no error
    scale[scale == 0] = 1.0
    wq = np.clip(np.rint(w / scale), -qmax, qmax).astype(np.int8)
    h, out = node.input[0], node.output[0]
    names = {k: f"int8_vocab.{k}" for k in ("wq", "sw", "hq", "hs", "hz", "acc", "f", "s")}
    own = target.with_name(target.name + ".data")
    with own.open("wb") as f:
        for name, array in ((names["wq"], wq), (names["sw"], scale.astype(np.float32))):
            t = onnx.numpy_helper.from_array(np.ascontiguousarray(array), name)
            offset = f.tell()
            f.write(t.raw_data)
            t.ClearField("raw_data")
            t.data_location = TensorProto.EXTERNAL
            for key, value in (("location", own.name), ("offset", offset),
                               ("length", f.tell() - offset)):  # fmt: skip
                entry = t.external_data.add()
                entry.key, entry.value = key, str(value)
            graph.initializer.append(t)
    at = list(graph.node).index(node)
    new = [
        helper.make_node("DynamicQuantizeLinear", [h], [names["hq"], names["hs"], names["hz"]]),
        helper.make_node("MatMulInteger", [names["hq"], names["wq"], names["hz"]], [names["acc"]]),
        helper.make_node("Cast", [names["acc"]], [names["f"]], to=TensorProto.FLOAT),
        helper.make_node("Mul", [names["hs"], names["sw"]], [names["s"]]),
        helper.make_node("Mul", [names["f"], names["s"]], [out]),
    ]  # fmt: skip
    graph.node.remove(node)
    for i, n in enumerate(new):
        graph.node.insert(at + i, n)
    graph.output.append(helper.make_tensor_value_info(HIDDEN, TensorProto.FLOAT, None))
    graph.node.append(helper.make_node("Identity", [h], [HIDDEN]))
    onnx.save(model, str(target))
    return dict(
        weight=weight.name, transposed=transposed, qmax=qmax, d=int(w.shape[0]),
        max_scale=max_scale, max_col_abs_sum=float(np.abs(w).sum(0).max()),
    )  # fmt: skip


def add_to_signature(signature_path: Path, info: dict) -> None:
    """The fast folder's linnet.json: `decode` outputs the hidden state too."""
    signature = json.loads(signature_path.read_text(encoding="utf-8"))
    entry = signature["entries"]["decode"]
    entry["outputs"] = [entry["outputs"][0], HIDDEN]
    entry[KEY] = info
    signature_path.write_text(json.dumps(signature, indent=1), encoding="utf-8")


class Int8Vocab:
    """The f32 weight rows [V, d] (memory-mapped from the export's weights file) and the
    bound's constants (see the module's doc)."""

    def __init__(self, rows: np.ndarray, info: dict) -> None:
        self.rows = rows  # [V, d] f32: row j is token j's weight
        self.info = info

    @classmethod
    def load(cls, folder: Path, decode_file: str, info: dict) -> Int8Vocab:
        import onnx

        graph = onnx.load(str(folder / decode_file), load_external_data=False).graph
        tensor = next((t for t in graph.initializer if t.name == info["weight"]), None)
        if tensor is None:
            raise LinnetError(f"{folder / decode_file}: no weight {info['weight']!r}")
        w = _external(tensor, folder)
        return cls(w if info["transposed"] else np.ascontiguousarray(w.T), info)

    def bound(self, hidden: np.ndarray) -> np.ndarray:
        """Per row [B]: every int8 logit is within this of the exact h . w_j."""
        h = hidden.reshape(hidden.shape[0], -1).astype(np.float64)
        sx = (max(float(h.max()), 0.0) - min(float(h.min()), 0.0)) / 255  # per tensor
        sw, colsum, d = self.info["max_scale"], self.info["max_col_abs_sum"], self.info["d"]
        habs = np.abs(h).sum(1)
        quantization = sw / 2 * habs + sx / 2 * colsum + d * sx * sw / 4
        # f32: the dequantized logit's roundings and the f32 weights' own dot product
        rounding = 4 * EPS32 * habs * colsum + (d + 4) * EPS32 * habs * sw * self.info["qmax"]
        return (quantization + rounding) * (1 + 1e-3)  # s_x as onnxruntime computes it

    def full(self, hidden: np.ndarray) -> np.ndarray:
        """The whole f32 row [B, V]."""
        return hidden.reshape(hidden.shape[0], -1) @ self.rows.T

    def exact(self, hidden_row: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """Logits of `tokens` for one row's hidden state: f64 dot products rounded to f32."""
        rows = np.asarray(self.rows[tokens], dtype=np.float64)
        return (rows @ hidden_row.reshape(-1).astype(np.float64)).astype(np.float32)


class BoundedLogits:
    """One decode step's int8 logits [B, V] with what makes its greedy token exact."""

    def __init__(self, logits: np.ndarray, hidden: np.ndarray, vocab: Int8Vocab) -> None:
        self.logits, self.hidden, self.vocab = logits, hidden, vocab
        self.candidates: list[int] = []  # per row, of the last argmax (for benchmarks)

    def argmax(self, scores: np.ndarray) -> np.ndarray:
        """The exact f32 argmax of each row of `scores`: `logits` after rules that only set
        tokens to -inf (suppression); the candidates' scores are recomputed in f32."""
        slack = 2 * self.vocab.bound(self.hidden)
        hidden = self.hidden.reshape(self.hidden.shape[0], -1)
        out, self.candidates = np.empty(scores.shape[0], dtype=np.int64), []
        for i, row in enumerate(scores):
            top = row.max()
            if not np.isfinite(top):
                out[i] = int(row.argmax())  # every token suppressed: as the full row would
                continue
            tokens = np.flatnonzero(row >= top - slack[i])
            exact = self.vocab.exact(hidden[i], tokens)
            out[i] = tokens[int(exact.argmax())]  # ties: the lowest id, as argmax would
            self.candidates.append(len(tokens))
        return out

"""ONNX: export the Core IR as ONNX models, and run them on onnxruntime.

    import linnet.onnx
    linnet.onnx.export("path/to/SmolLM2-135M-Instruct", "smollm2-onnx/")
    model = linnet.onnx.load("smollm2-onnx/")         # onnxruntime, CPU by default
    logits = model.forward(ids)                        # [B, S] -> f32 [B, S, V]
    model.decode(ids, 0); model.decode(next_ids, ids.shape[1])
    tokens = model.generate(ids, 20)

The model keeps the contract of `linnet.torch.load`: `run(entry, *inputs)` and
`forward` for every export, `embed` for encoders, `decode`/`reset`/`generate` for
decoders. Arrays in are anything numpy reads; arrays out are numpy arrays. Loading
needs onnxruntime and numpy only. See docs/exports.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from linnet.backends.onnx.arrays import OnnxArrays
from linnet.core.dims import Poly
from linnet.errors import LinnetError, RuntimeGuardError
from linnet.model import Decoder, Encoder, Model, Seq2Seq, family


def export(
    model,
    out_dir: str | Path,
    *,
    dtype=None,
    max_positions: int | None = None,
    tokenizer: str | Path | None = None,
    architecture: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Write `model` (a loaded model, an HF folder, a .gguf file) as ONNX: one model per
    entry point, sharing one external weights file, plus `linnet.json`, config.json and
    the tokenizer. dtype: "f32" (default: as stored), "f16" or "bf16" (onnxruntime's CPU
    kernels cover f32; f16/bf16 are for GPU providers). max_positions: rows of the KV
    cache the decode model holds (default: the context, capped at 4096).
    The folder is written under a temporary name and renamed when complete."""
    from linnet.converters.onnx_export import export_onnx
    from linnet.targets import open_weights

    weights = open_weights(model, architecture=architecture, tokenizer=tokenizer)
    try:
        return export_onnx(
            weights,
            out_dir,
            dtype=dtype,
            max_positions=max_positions,
            overwrite=overwrite,
            progress=progress,
        )
    finally:
        weights.close()


def load(
    path: str | Path, *, providers=None, threads: int | None = None, numerics: str = "equivalent"
) -> OnnxModel:
    """An exported folder on onnxruntime; an HF checkpoint folder or a `.gguf` file is
    exported into the cache first (once). providers: onnxruntime execution providers
    (default CPU); threads: intra-op threads (default: onnxruntime's choice); numerics:
    "equivalent" (the export as written) or "fast" (int8 MatMul weights, linnet/onnx_fast.py)."""
    import onnxruntime as ort

    folder = Path(path)
    if not (folder / "linnet.json").is_file() and (
        folder.suffix == ".gguf" or (folder / "config.json").is_file()
    ):
        folder = onnx_folder_for(folder)
    if numerics not in ("equivalent", "fast"):
        raise LinnetError(f"numerics must be 'equivalent' or 'fast', not {numerics!r}")
    if numerics == "fast" and (folder / "linnet.json").is_file():
        from linnet.onnx_fast import fast_folder

        folder = fast_folder(folder)
    sig_path = folder / "linnet.json"
    if not sig_path.is_file():
        raise LinnetError(f"{folder}: no linnet.json; is this a `linnet export onnx` folder?")
    signature = json.loads(sig_path.read_text(encoding="utf-8"))
    providers = providers or ["CPUExecutionProvider"]
    sessions = {}
    for name, entry in signature["entries"].items():
        try:
            sessions[name] = ort.InferenceSession(
                str(folder / entry["file"]), _options(name, threads, numerics), providers=providers
            )
        except Exception as e:  # onnxruntime raises its own exception types
            hint = ""
            if signature["dtype"] == "bf16" and "NOT_IMPLEMENTED" in str(e):
                hint = " (onnxruntime's CPU kernels lack bf16: export f32 or f16, or use a GPU)"
            where = folder / entry["file"]
            raise LinnetError(f"{where}: onnxruntime cannot load it{hint}: {e}") from None
    model = OnnxModel(signature, sessions)
    model.export_folder = folder  # the folder run (numerics="fast": the int8 copy)
    decode = signature["entries"].get("decode", {})
    if "int8_vocab" in decode:  # numerics="fast": linnet/onnx_vocab.py
        from linnet.onnx_vocab import Int8Vocab

        model.vocab = Int8Vocab.load(folder, decode["file"], decode["int8_vocab"])
    return model


def _options(entry: str, threads: int | None, numerics: str):
    """Session options; with numerics="fast" tuned for a loaded 2-core CPU (docs/speech.md):
    no spinning (idle pool threads busy-waited for the next op: a third of a transcription's
    CPU time under load) and `decode` on one thread unless `threads` says otherwise (a
    one-token step's ops are too small to share: less CPU and wall time per step)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    if numerics == "fast":
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if entry == "decode" and not threads:
            options.intra_op_num_threads = 1
    return options


class OnnxModel(Model):
    """An export's entries on onnxruntime. `OnnxModel(...)` gives `OnnxDecoder` for an
    export with `decode`, `OnnxEncoder` for one with `embed` (the contract of
    `linnet/model.py`)."""

    @staticmethod
    def _entries_of(signature: dict, *args, **kwargs) -> list[str]:
        return list(signature["entries"])

    @staticmethod
    def _has_state(signature: dict, *args, **kwargs) -> bool:
        return any(e.get("states") for e in signature["entries"].values())

    def __init__(self, signature: dict, sessions: dict) -> None:
        self.signature = signature
        self.config = signature["config"]
        self.sessions = sessions
        self.arrays = OnnxArrays()
        self.state: dict = {}  # state part -> onnxruntime OrtValue
        self._parsed_states: dict | None = None

    @property
    def entries(self) -> list[str]:
        return list(self.signature["entries"])

    def _missing_entry(self, entry: str) -> str:
        return "this export " + super()._missing_entry(entry)

    def _declared(self, entry: str) -> list:
        declared = self.signature["entries"][entry]["inputs"]
        return [(name, spec["dtype"], len(spec["shape"])) for name, spec in declared.items()]

    def _state_types(self) -> dict:
        if self._parsed_states is None:  # parsed once: every decode step checks the states
            states = self.signature["entries"]["decode"]["states"]
            self._parsed_states = {
                name: ([Poly.from_terms(t) for t in spec["shape"]], spec["dtype"])
                for name, spec in states.items()
            }
        return self._parsed_states

    def _execute(self, name: str, inputs: list, dim_values: dict) -> np.ndarray:
        """One call through an IO binding: the cache stays in onnxruntime's buffers, and a
        part the graph writes in place (`inplace` in linnet.json) is bound as its own
        output, so a decode step copies no cache."""
        entry = self.signature["entries"][name]
        feeds = dict(zip(entry["inputs"], inputs))
        dims = self._bind_dims(entry, feeds, dim_values)
        _check_guards(entry["guards"], dims)
        io = self.sessions[name].io_binding()
        for arg, array in feeds.items():
            io.bind_cpu_input(arg, array)
        for arg in entry["dims"]:
            io.bind_cpu_input(arg, np.asarray(dim_values[arg], np.int64))
        for out in entry["outputs"]:
            io.bind_output(out)
        inplace = set(entry.get("inplace", []))
        writes = entry.get("writes", list(entry["states"]))  # exports before reads/writes
        for part in entry.get("reads", entry["states"]):
            io.bind_ortvalue_input(part, self.state[part])
        for part in writes:
            if part in inplace:
                io.bind_ortvalue_output(part + ".next", self.state[part])
            else:
                io.bind_output(part + ".next")
        self.sessions[name].run_with_iobinding(io)
        results = io.get_outputs()
        n = len(entry["outputs"])
        for part, value in zip(writes, results[n:]):
            # A part written in place stays the value we bound: the wrapper onnxruntime hands
            # back shares its memory but not the numpy buffer behind it, which would be freed.
            if part not in inplace or value.data_ptr() != self.state[part].data_ptr():
                self.state[part] = value
        return results[0].numpy() if n == 1 else tuple(r.numpy() for r in results[:n])

    @staticmethod
    def _bind_dims(entry: dict, feeds: dict, dim_values: dict) -> dict:
        dims = {atom: int(dim_values[arg]) for arg, atom in entry["dims"].items()}
        for name, spec in entry["inputs"].items():
            shape = feeds[name].shape
            if len(shape) != len(spec["shape"]):
                raise LinnetError(
                    f"`{name}` must have rank {len(spec['shape'])}, got shape {tuple(shape)}"
                )
            want = [Poly.from_terms(terms) for terms in spec["shape"]]
            for dim, size in zip(want, shape):
                scaled = dim.as_scaled_atom()  # D, or k * D: D = size / k where k divides
                if scaled is not None and scaled[0] not in dims and size % scaled[1] == 0:
                    dims[scaled[0]] = int(size) // scaled[1]
                elif scaled is not None and scaled[0] not in dims or dim.eval(dims) != size:
                    raise LinnetError(
                        f"`{name}` must be {spec['dtype']}[{', '.join(map(str, want))}], "
                        f"got shape {tuple(shape)}"
                    )
        return dims


class OnnxEncoder(Encoder, OnnxModel):
    """An export with an `embed` entry: one vector per sequence."""


class OnnxDecoder(Decoder, OnnxModel):
    """An export with a `decode` entry: the KV cache lives in onnxruntime's buffers."""


class OnnxSeq2Seq(Seq2Seq, OnnxModel):
    """An export with `encode` and `decode`: the encoder fills the states decoding reads.
    With numerics="fast" `decode` computes the vocabulary projection in int8 and its final
    hidden state (linnet/onnx_vocab.py): `decode` still returns the f32 logits (from the
    hidden state), `decode_bounded` the int8 ones with what makes the greedy token exact."""

    vocab = None  # Int8Vocab where decode.onnx projects in int8

    def _decode(self, ids, pos: int):
        out = super()._decode(ids, pos)
        if not isinstance(out, tuple):
            return out
        if self.vocab is None:
            raise LinnetError("this decode.onnx projects in int8: load it with linnet.onnx.load")
        return self.vocab.full(out[1])

    def decode_bounded(self, ids, pos: int):
        """`decode`, its logits the int8 projection's: a `BoundedLogits` whose `argmax`
        gives the f32 greedy token."""
        if self.vocab is None:
            raise LinnetError("decode_bounded: this decode.onnx projects in f32 already")
        from linnet.onnx_vocab import BoundedLogits

        logits, hidden = super()._decode(self._ids(ids), int(pos))
        return BoundedLogits(logits, hidden, self.vocab)


family(OnnxModel, OnnxEncoder, OnnxDecoder, OnnxSeq2Seq)


def _check_guards(guards: list, dims: dict) -> None:
    """The source's `require`s, on the host, with the same message as the other backends."""
    for g in guards:
        lhs, rhs = Poly.from_terms(g["lhs"]), Poly.from_terms(g["rhs"])
        if lhs.eval(dims) > rhs.eval(dims):
            where = f"{g['where']}: " if g["where"] else ""
            raise RuntimeGuardError(
                f"{where}{g['message']} failed: {lhs} = {lhs.eval(dims)} > {rhs} = {rhs.eval(dims)}"
            )


def onnx_folder_for(path: str | Path, *, max_positions: int | None = None) -> Path:
    """An ONNX export of a checkpoint folder or `.gguf` file, made once into the cache
    (`$LINNET_CACHE/onnx/`, keyed by the files' names, sizes and times) and reused."""
    import hashlib

    from linnet.hub import linnet_cache

    path = Path(path).expanduser().resolve()
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    key = hashlib.sha256(repr(max_positions).encode())
    for f in files:
        st = f.stat()
        key.update(f"{f}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    out = linnet_cache() / "onnx" / f"{path.stem}-{key.hexdigest()[:16]}"
    if not (out / "linnet.json").is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        export(path, out, max_positions=max_positions, overwrite=True, progress=False)
    return out

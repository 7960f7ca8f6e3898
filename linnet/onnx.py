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

from linnet.core.dims import Poly
from linnet.core.dtypes import numpy_dtype
from linnet.errors import LinnetError, RuntimeGuardError
from linnet.generation import Generation, check_ids
from linnet.inputs import MASK_INPUTS, TOKEN_INPUTS


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
    from linnet.weights.stream import open_weights

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


def load(path: str | Path, *, providers=None, threads: int | None = None) -> OnnxModel:
    """An exported folder on onnxruntime; an HF checkpoint folder or a `.gguf` file is
    exported into the cache first (once). providers: onnxruntime execution providers
    (default CPU); threads: intra-op threads (default: onnxruntime's choice)."""
    import onnxruntime as ort

    folder = Path(path)
    if not (folder / "linnet.json").is_file() and (
        folder.suffix == ".gguf" or (folder / "config.json").is_file()
    ):
        from linnet.loading import onnx_folder_for

        folder = onnx_folder_for(folder)
    sig_path = folder / "linnet.json"
    if not sig_path.is_file():
        raise LinnetError(f"{folder}: no linnet.json; is this a `linnet export onnx` folder?")
    signature = json.loads(sig_path.read_text(encoding="utf-8"))
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    providers = providers or ["CPUExecutionProvider"]
    sessions = {}
    for name, entry in signature["entries"].items():
        try:
            sessions[name] = ort.InferenceSession(
                str(folder / entry["file"]), options, providers=providers
            )
        except Exception as e:  # onnxruntime raises its own exception types
            hint = ""
            if signature["dtype"] == "bf16" and "NOT_IMPLEMENTED" in str(e):
                hint = " (onnxruntime's CPU kernels lack bf16: export f32 or f16, or use a GPU)"
            where = folder / entry["file"]
            raise LinnetError(f"{where}: onnxruntime cannot load it{hint}: {e}") from None
    return OnnxModel(signature, sessions)


class OnnxModel:
    """An export's entries on onnxruntime. `OnnxModel(...)` gives `OnnxDecoder` for an
    export with `decode`, `OnnxEncoder` for one with `embed` (as `linnet.torch` does)."""

    def __new__(cls, signature: dict, *args, **kwargs):
        if cls is OnnxModel:
            if "decode" in signature["entries"]:
                cls = OnnxDecoder
            elif "embed" in signature["entries"]:
                cls = OnnxEncoder
        return super().__new__(cls)

    def __init__(self, signature: dict, sessions: dict) -> None:
        self.signature = signature
        self.config = signature["config"]
        self.sessions = sessions
        self.state: dict = {}  # state part -> onnxruntime OrtValue
        self._buffers: dict[str, np.ndarray] = {}

    @property
    def entries(self) -> list[str]:
        return list(self.signature["entries"])

    # -- entries -----------------------------------------------------------------------
    def run(self, entry: str, *inputs, **dims) -> np.ndarray:
        """Run one entry: its inputs in the source's order (None where a default exists),
        its runtime dims (`at=...`) by keyword."""
        if entry not in self.signature["entries"]:
            raise LinnetError(
                f"this export has no entry `{entry}` (entries: {', '.join(self.entries)})"
            )
        return self._run(entry, self._inputs(entry, list(inputs)), dims)

    def forward(self, *inputs) -> np.ndarray:
        """The `forward` entry (decoders: logits of every position, [B, S, V])."""
        return self.run("forward", *inputs)

    __call__ = forward

    # -- helpers -------------------------------------------------------------------------
    def _inputs(self, entry: str, given: list) -> dict[str, np.ndarray]:
        declared = self.signature["entries"][entry]["inputs"]
        if len(given) > len(declared):
            raise LinnetError(f"`{entry}` takes {len(declared)} inputs ({', '.join(declared)})")
        given += [None] * (len(declared) - len(given))
        feeds: dict[str, np.ndarray] = {}
        for (name, spec), x in zip(declared.items(), given):
            if x is None:
                x = default_input(name, list(feeds.values()))
            feeds[name] = self._convert(name, spec, x)
        return feeds

    def _convert(self, name: str, spec: dict, x) -> np.ndarray:
        if name in TOKEN_INPUTS:
            return check_ids(x, self.config.get("vocab")).astype(numpy_dtype(spec["dtype"]))
        x = np.asarray(x)
        if spec["dtype"] in ("i64", "i32") and not np.issubdtype(x.dtype, np.integer):
            if x.dtype != np.bool_:
                raise LinnetError(f"`{name}` must hold integers, got {x.dtype}")
        return np.ascontiguousarray(x, dtype=numpy_dtype(spec["dtype"]))

    def _run(self, name: str, feeds: dict, dim_values: dict) -> np.ndarray:
        """One call through an IO binding: the cache stays in onnxruntime's buffers, and a
        part the graph writes in place (`inplace` in linnet.json) is bound as its own
        output, so a decode step copies no cache."""
        entry = self.signature["entries"][name]
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
        for part in entry["states"]:
            io.bind_ortvalue_input(part, self.state[part])
            if part in inplace:
                io.bind_ortvalue_output(part + ".next", self.state[part])
            else:
                io.bind_output(part + ".next")
        self.sessions[name].run_with_iobinding(io)
        results = io.get_outputs()
        n = len(entry["outputs"])
        for part, value in zip(entry["states"], results[n:]):
            self.state[part] = value
        return results[0].numpy()

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
                if dim.as_atom() is not None:
                    dims.setdefault(dim.as_atom(), int(size))
                elif dim.eval(dims) != size:
                    raise LinnetError(
                        f"`{name}` must be {spec['dtype']}[{', '.join(map(str, want))}], "
                        f"got shape {tuple(shape)}"
                    )
        return dims


def default_input(name: str, given: list) -> np.ndarray:
    """A padding mask left out: all ones (every position valid), like the ids before it."""
    if name in MASK_INPUTS and given:
        return np.ones(given[0].shape[:2], dtype=np.int64)
    raise LinnetError(f"input `{name}` is required")


class OnnxEncoder(OnnxModel):
    """An export with an `embed` entry: one vector per sequence."""

    def embed(self, ids, attention_mask=None, normalize: bool = False) -> np.ndarray:
        """Pooled embeddings [B, H]; `normalize`: scaled to unit L2 norm."""
        out = self.run("embed", ids, attention_mask)
        if not normalize:
            return out
        return out / np.maximum(np.linalg.norm(out, axis=-1, keepdims=True), 1e-12)


class OnnxDecoder(Generation, OnnxModel):
    """An export with a `decode` entry: the KV cache lives in onnxruntime's buffers."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.position = 0

    @property
    def max_positions(self) -> int:
        return self.config["max_positions"]

    def decode(self, ids, pos: int) -> np.ndarray:
        """Run `ids` at positions pos.., appending to the cache; last-position logits [B, V]."""
        return self._decode(self._ids(ids), int(pos))

    def _decode(self, ids: np.ndarray, pos: int) -> np.ndarray:
        self._ensure_state(ids.shape[0], pos)
        out = self._run("decode", {"tokens": ids}, {"at": pos})
        self.position = pos + ids.shape[1]
        return out

    def reset(self) -> None:
        self.state, self._buffers = {}, {}
        self.position = 0

    def _ids(self, ids) -> np.ndarray:
        return check_ids(ids, self.config.get("vocab"))

    def _sampler(self, do_sample, temperature, top_k, seed: int = 0):
        rng = np.random.default_rng(seed)
        return lambda logits: _pick(logits, do_sample, temperature, top_k, rng)

    @staticmethod
    def _concat(parts) -> np.ndarray:
        return np.concatenate(parts, axis=1)

    def _state_specs(self, batch: int):
        for name, spec in self.signature["entries"]["decode"]["states"].items():
            shape = tuple(Poly.from_terms(terms).eval({"B": batch}) for terms in spec["shape"])
            yield name, shape, spec["dtype"]

    @staticmethod
    def _shape_of(x):
        return x.shape()  # an OrtValue

    def _new_state(self, name: str, shape, dtype: str) -> None:
        import onnxruntime as ort

        zeros = np.zeros(shape, numpy_dtype(dtype))
        self.state[name] = ort.OrtValue.ortvalue_from_numpy(zeros)
        self._buffers[name] = zeros  # the OrtValue borrows this memory


def _check_guards(guards: list, dims: dict) -> None:
    """The source's `require`s, on the host, with the same message as the other backends."""
    for g in guards:
        lhs, rhs = Poly.from_terms(g["lhs"]), Poly.from_terms(g["rhs"])
        if lhs.eval(dims) > rhs.eval(dims):
            where = f"{g['where']}: " if g["where"] else ""
            raise RuntimeGuardError(
                f"{where}{g['message']} failed: {lhs} = {lhs.eval(dims)} > {rhs} = {rhs.eval(dims)}"
            )


def _pick(logits: np.ndarray, do_sample: bool, temperature: float, top_k, rng) -> np.ndarray:
    if not do_sample:
        return logits.argmax(axis=-1)
    scores = logits.astype(np.float64) / max(temperature, 1e-6)
    if top_k:
        kth = np.sort(scores, axis=-1)[:, -top_k][:, None]
        scores = np.where(scores < kth, -np.inf, scores)
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    return np.array([rng.choice(len(p), p=p) for p in probs])

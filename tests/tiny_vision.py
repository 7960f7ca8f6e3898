"""Tiny random image models (ViT, DINOv2, SigLIP vision, ResNet) built by transformers.

    from tests.tiny_vision import build_tiny_vision, reference_vision, vision_pixels
    folder = build_tiny_vision("Dinov2Model", tmp_path)     # VISION_CONFIGS["Dinov2Model"]
    reference_vision(folder, vision_pixels(folder))

Every weight, norm and batch-norm statistic is redrawn, so none sits at transformers' init.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from tests.tiny_decoders import _BASE_SEED, _MARKER, tiny_config  # noqa: E402

# --------------------------------------------------------------------------------------------
# Vision: tiny random image models (ViT, DINOv2, SigLIP vision, ResNet)
# --------------------------------------------------------------------------------------------

_VIT = dict(dim=32, n_layers=2, n_heads=4, ffn=48, image_size=32, patch=8)

#: HF architecture -> source config fields. Image size 32: a 4 x 4 patch grid.
VISION_CONFIGS: dict[str, dict[str, Any]] = {
    "ViTModel": dict(_VIT),
    "ViTForImageClassification": dict(_VIT, n_labels=5),
    "Dinov2Model": dict(_VIT, ffn=64),  # mlp_ratio 2
    "SiglipVisionModel": dict(_VIT),
    # basic blocks (ResNet-18's shape): stage 0 keeps its width, so it has no shortcut
    "ResNetModel": dict(widths=[8, 8, 12, 16, 24], depths=[2, 1, 2, 1], bottleneck=False),
    # bottleneck blocks (ResNet-50's shape) with a classifier
    "ResNetForImageClassification": dict(
        widths=[8, 16, 24, 32, 48], depths=[2, 1, 2, 1], bottleneck=True, n_labels=7
    ),
}
VISION_BATCH = 2


def vision_pixels(config_dir: str | os.PathLike, batch: int = VISION_BATCH, seed: int = 0):
    """Random float pixels [batch, channels, size, size] at the config's image size (224
    when the config has none, as for ResNet)."""
    cfg = json.loads((Path(config_dir) / "config.json").read_text())
    size = cfg.get("image_size", 224)
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, cfg.get("num_channels", 3), size, size, generator=g)


@torch.no_grad()
def _init_vision(model, seed: int) -> None:
    """Redraw every float param and buffer: weights N(0, 0.2/sqrt(fan_in)) scaled so that
    activations stay O(1), norm weights 1 + N(0, 0.2), biases and layer scales N(0, 0.1),
    batch-norm running means N(0, 0.1) and variances 0.5 + U(0, 1) (transformers leaves
    these at 0 and 1, which would hide them)."""
    g = torch.Generator().manual_seed(seed)
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if not t.is_floating_point():
            continue
        if name.endswith("running_var"):
            new = 0.5 + torch.rand(t.shape, generator=g)
        elif name.endswith(("running_mean", "bias")) or t.ndim <= 1 and "norm" not in name:
            new = torch.randn(t.shape, generator=g) * 0.1
        elif t.ndim == 1:  # norm and batch-norm weights
            new = 1.0 + torch.randn(t.shape, generator=g) * 0.2
        elif t.ndim >= 2 and name.endswith("weight") or "proj_weight" in name:
            fan_in = t[0].numel()
            new = torch.randn(t.shape, generator=g) / fan_in**0.5
        else:  # class token, positions, probe, mask token
            new = torch.randn(t.shape, generator=g) * 0.5
        t.copy_(new.to(t.dtype))


def build_tiny_vision(arch: str, out_dir: str | os.PathLike) -> Path:
    """Build the tiny random checkpoint ``VISION_CONFIGS[arch]`` (f32 safetensors, fixed seed)
    into ``out_dir / arch`` and return the folder; reuses a complete earlier build."""
    import transformers

    target = Path(out_dir) / arch
    marker = target / _MARKER
    if marker.is_file():
        return target
    config = tiny_config(arch, VISION_CONFIGS[arch], "vision")
    torch.manual_seed(_BASE_SEED)
    model = getattr(transformers, arch)(config).eval()
    _init_vision(model, _BASE_SEED)
    tmp = Path(tempfile.mkdtemp(prefix=f".{arch}.", dir=out_dir))
    try:
        model.save_pretrained(tmp)
        (tmp / _MARKER).write_text(json.dumps({"arch": arch, "seed": _BASE_SEED}) + "\n")
        os.chmod(tmp, 0o755)
        os.rename(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


@torch.no_grad()
def reference_vision(ckpt_dir: str | os.PathLike, pixels: torch.Tensor) -> dict[str, torch.Tensor]:
    """transformers' outputs (f32, eager attention): last hidden state, the pooled output
    where the class has one, and logits where it has a head."""
    import transformers

    cfg = json.loads((Path(ckpt_dir) / "config.json").read_text())
    cls = getattr(transformers, cfg["architectures"][0])
    model = cls.from_pretrained(
        ckpt_dir, dtype=torch.float32, attn_implementation="eager", trust_remote_code=False
    ).eval()
    if hasattr(model, "classifier"):
        out = model(pixel_values=pixels, output_hidden_states=True)
        return {"logits": out.logits}
    out = model(pixel_values=pixels)
    refs = {"forward": out.last_hidden_state}
    if getattr(out, "pooler_output", None) is not None:
        refs["pool"] = out.pooler_output
    return refs

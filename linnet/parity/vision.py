"""Vision: a batch of deterministic random pixels at the config's size (no image files
offline); every entry the class has (`forward`, `pool`, `classify`) against transformers'
last_hidden_state, pooler_output and logits (max |Δ|, rel), and for `classify` the same
top-1 class in every row.

    pixels = random_pixels(config)
    figures = measure_vision(model, reference, pixels, tolerance, ["forward", "pool"])
"""

from __future__ import annotations

from linnet.errors import LinnetError
from linnet.parity.compare import compare
from linnet.parity.report import OutputFigures


def random_pixels(config: dict, batch: int = 2, seed: int = 0):
    """Deterministic random pixels [batch, channels, size, size] (N(0, 1), what normalized
    images look like) at the source config's image size: the gate has no image files."""
    import torch

    size, channels = config.get("image_size", 224), config.get("channels", 3)
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, channels, size, size, generator=g)


def reference_vision(reference, pixels) -> dict:
    """transformers' output per Linnet entry: the base model's last_hidden_state (forward)
    and pooler_output (pool; ResNet's [B, C, 1, 1] flattened), the logits (classify)."""
    import torch

    with torch.no_grad():
        out = reference.base_model(pixel_values=pixels)
        refs = {"forward": out.last_hidden_state}
        if getattr(out, "pooler_output", None) is not None:
            refs["pool"] = out.pooler_output.flatten(1)
        if reference.base_model is not reference:  # a task model: its head's logits
            refs["classify"] = reference(pixel_values=pixels).logits
    return refs


def measure_vision(model, reference, pixels, tolerance, entries) -> list[OutputFigures]:
    """Every entry the config has against transformers' output; `classify`: top-1 too."""
    import numpy as np
    import torch

    refs = reference_vision(reference, pixels)
    label = f"random pixels {list(pixels.shape)}, seed 0"
    out = []
    for name in entries:
        if name not in refs:
            raise LinnetError(
                f"entry `{name}`: transformers' {type(reference).__name__} "
                "gives no output to compare it with"
            )
        got, want = torch.tensor(np.asarray(model.run(name, pixels))).float(), refs[name]
        extra = dict(tokens=0, rows=int(pixels.shape[0]))
        if name == "classify":
            extra["top1"] = int((got.argmax(-1) == want.argmax(-1)).sum())
        out.append(compare(got, want, label, name, tolerance, **extra))
    return out

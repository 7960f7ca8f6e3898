"""The segmenter kind (SAM, issue 15): inputs the gate makes itself.

    figures = measure_segmenter(model, reference, config, tolerance)

2 images of deterministic random pixels (N(0, 1), seed 0, the config's size): `embed_image`
against transformers' `SamModel.get_image_embeddings`. On those (transformers') image
embeddings, PROMPTS prompts per image (seed 0): points in the input's pixel frame with
labels 1, 0, -1 (not a point) and -10 (padding), boxes (x1 <= x2, y1 <= y2); the masks and
IoU scores of points with boxes (`predict_masks`, `predict_iou`), points alone
(`point_masks`, `point_iou`: SamModel's padding point) and boxes alone (`box_masks`,
`box_iou`) against `SamModel(image_embeddings=..., multimask_output=True)`'s `pred_masks`
and `iou_scores`.
"""

from __future__ import annotations

from linnet.parity.compare import compare
from linnet.parity.report import OutputFigures
from linnet.parity.vision import random_pixels

PROMPTS = 2  # per image (transformers' point batch)
LABELS = ((1, 0), (1, -1), (0, -10), (1, 1))  # two points per prompt, every label kind
#: prompt kind -> (masks entry, IoU entry, the prompts it takes)
KINDS = {
    "points and boxes": ("predict_masks", "predict_iou", ("points", "labels", "boxes")),
    "points": ("point_masks", "point_iou", ("points", "labels")),
    "boxes": ("box_masks", "box_iou", ("boxes",)),
}
HF_NAMES = {"points": "input_points", "labels": "input_labels", "boxes": "input_boxes"}


def random_prompts(config: dict, batch: int, seed: int = 0) -> dict:
    """Points [batch, PROMPTS, 2, 2] and boxes [batch, PROMPTS, 4] inside the prompt frame,
    labels [batch, PROMPTS, 2] cycling through LABELS."""
    import torch

    g = torch.Generator().manual_seed(seed)
    size = config.get("prompt_size", config.get("image_size", 1024))
    rows = [LABELS[(b * PROMPTS + q) % len(LABELS)] for b in range(batch) for q in range(PROMPTS)]
    corners = torch.sort(torch.rand(batch, PROMPTS, 2, 2, generator=g) * size, dim=2).values
    return {
        "points": torch.rand(batch, PROMPTS, 2, 2, generator=g) * size,
        "labels": torch.tensor(rows).reshape(batch, PROMPTS, 2),
        "boxes": corners.reshape(batch, PROMPTS, 4),
    }


def measure_segmenter(model, reference, config: dict, tolerance) -> list[OutputFigures]:
    """embed_image, then each prompt kind's masks and IoU scores on made inputs."""
    import numpy as np
    import torch

    pixels = random_pixels(config)
    with torch.no_grad():
        embeddings = reference.get_image_embeddings(pixels)
    got = np.asarray(model.run("embed_image", pixels))
    rows = int(pixels.shape[0])
    label = f"random pixels {list(pixels.shape)}, seed 0"
    out = [compare(got, embeddings, label, "embed_image", tolerance, tokens=0, rows=rows)]
    prompts = random_prompts(config, rows)
    for kind, (masks, iou, names) in KINDS.items():
        with torch.no_grad():
            kw = {HF_NAMES[n]: prompts[n] for n in names}
            want = reference(image_embeddings=embeddings, multimask_output=True, **kw)
        args = [embeddings] + [prompts[n] for n in names]
        label = f"{kind}, {PROMPTS} prompts per image (seed 0) on transformers' embeddings"
        for entry, ref in ((masks, want.pred_masks), (iou, want.iou_scores)):
            got = np.asarray(model.run(entry, *args))
            out.append(compare(got, ref, label, entry, tolerance, tokens=0, rows=rows))
    return out

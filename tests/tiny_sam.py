"""Tiny random SamModel checkpoints that transformers builds and saves (issue 15)."""

from __future__ import annotations

# name -> (vision, prompt encoder, mask decoder) arguments beyond the shared widths
VARIANTS = {
    # grid 10 in windows of 4: padded to 12 (window padding), global attention at layer 2
    "padded": dict(
        vision=dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, mlp_dim=64,
                    image_size=80, patch_size=8, window_size=4, global_attn_indexes=[2]),
        width=32, decoder=dict(mlp_dim=64, num_hidden_layers=2, num_attention_heads=4,
                               iou_head_hidden_dim=24),
    ),
    # grid 8 in windows of 4 (no padding), globals at 1 and 3, no qkv bias, iou depth 4
    "even": dict(
        vision=dict(hidden_size=48, num_hidden_layers=4, num_attention_heads=3, mlp_dim=96,
                    image_size=64, patch_size=8, window_size=4, global_attn_indexes=[1, 3],
                    qkv_bias=False),
        width=16, decoder=dict(mlp_dim=32, num_hidden_layers=1, num_attention_heads=2,
                               iou_head_hidden_dim=20, iou_head_depth=4),
    ),
}  # fmt: skip


def sam_config(name: str):
    from transformers import SamConfig

    spec = VARIANTS[name]
    vision = dict(spec["vision"], output_channels=spec["width"], num_pos_feats=spec["width"] // 2)
    grid = vision["image_size"] // vision["patch_size"]
    prompt = dict(hidden_size=spec["width"], image_size=vision["image_size"],
                  patch_size=vision["patch_size"], image_embedding_size=grid,
                  mask_input_channels=8)  # fmt: skip
    decoder = dict(spec["decoder"], hidden_size=spec["width"])
    return SamConfig(
        vision_config=vision, prompt_encoder_config=prompt, mask_decoder_config=decoder
    )


def build_sam(folder, name: str, seed: int = 0):
    """A tiny SamModel saved by transformers, every weight drawn off its initialization
    (zero position tables, unit norms) so that none is trivial."""
    import torch
    from transformers import SamModel

    torch.manual_seed(seed)
    model = SamModel(sam_config(name)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder)
    return folder

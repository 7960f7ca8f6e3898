"""The three models of bench/diffusion.py: how each is built (a random checkpoint with the
real model's structure, scaled to fit a small CPU), its inputs, diffusers' or transformers'
module as the reference, and the Linnet entries that compute the same outputs.

Each model is a `Task`: `reference(folder)` is a torch module whose `forward(*inputs)`
returns a tuple of tensors (what eager, torch.compile and torch.onnx run), `linnet(run,
inputs)` calls Linnet's entries through `run(entry, *arrays)` and returns the same tuple.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench import unet as unet_bench


@dataclass
class Task:
    name: str
    shape: dict  # what the benchmark ran, as recorded
    build: Callable[[Path], None]
    inputs: Callable[[], tuple]
    reference: Callable[[Path], object]
    linnet: Callable[[Callable, tuple], tuple]
    input_names: list = field(default_factory=list)
    output_names: list = field(default_factory=list)


# -- SD VAE decoder: AutoencoderKL.decode ---------------------------------------------------

# SD's VAE: widths (128, 256, 512, 512), 2 layers a block, 32 groups, a 64 x 64 latent
VAE_SCALES = {
    "small": dict(widths=(64, 128, 256, 256), layers=2, groups=32, latent=16),
    "sd": dict(widths=(128, 256, 512, 512), layers=2, groups=32, latent=64),
}


def vae_build(scale: dict) -> Callable:
    def build(folder: Path) -> None:
        import torch
        from diffusers import AutoencoderKL

        torch.manual_seed(0)
        AutoencoderKL(
            latent_channels=4,
            block_out_channels=scale["widths"],
            layers_per_block=scale["layers"],
            norm_num_groups=scale["groups"],
            down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4,
            sample_size=8 * scale["latent"],
        ).eval().save_pretrained(folder)

    return build


def vae_task(scale_name: str) -> Task:
    import torch

    scale = VAE_SCALES[scale_name]

    class Decode(torch.nn.Module):
        def __init__(self, vae):
            super().__init__()
            self.vae = vae

        def forward(self, latents):
            return (self.vae.decode(latents).sample,)

    def reference(folder):
        from diffusers import AutoencoderKL

        return Decode(AutoencoderKL.from_pretrained(folder, trust_remote_code=False).eval())

    def inputs():
        g = torch.Generator().manual_seed(1)
        return (torch.randn(1, 4, scale["latent"], scale["latent"], generator=g),)

    return Task(
        name="sd-vae-decoder",
        shape={scale_name: scale},
        build=vae_build(scale),
        inputs=inputs,
        reference=reference,
        linnet=lambda run, args: (run("decode", *args),),
        input_names=["latents"],
        output_names=["image"],
    )


# -- SDXL UNet: one step (bench/unet.py's checkpoint and inputs) ----------------------------


def unet_task(scale_name: str) -> Task:
    import torch

    scale = unet_bench.SCALES[scale_name]

    class Step(torch.nn.Module):
        def __init__(self, unet):
            super().__init__()
            self.unet = unet

        def forward(self, sample, t, states, text, ids):
            extra = {"text_embeds": text, "time_ids": ids}
            return (self.unet(sample, t, states, added_cond_kwargs=extra).sample,)

    def reference(folder):
        from diffusers import UNet2DConditionModel

        unet = UNet2DConditionModel.from_pretrained(folder, trust_remote_code=False)
        return Step(unet.eval())

    return Task(
        name="sdxl-unet",
        shape={scale_name: scale},
        build=lambda folder: unet_bench.build(folder, scale),
        inputs=lambda: unet_bench.make_inputs(scale),
        reference=reference,
        linnet=lambda run, args: (run("forward", *args),),
        input_names=["sample", "timestep", "encoder_hidden_states", "text_embeds", "time_ids"],
        output_names=["noise"],
    )


# -- SAM ViT-Base: embed_image, then one point prompt's masks ------------------------------

# sam-vit-base: ViT-B (768 wide, 12 layers of 12 heads, MLP 3072, global attention at 2, 5,
# 8, 11, windows of 14) on 1024 x 1024 pixels (a 64 x 64 grid padded to 70 for the windows)
SAM_SCALES = {
    "small": dict(image=256, window=7),  # a 16 x 16 grid, padded to 21: 3 x 3 windows
    "base": dict(image=1024, window=14),
}


def sam_config(scale: dict):
    from transformers import SamConfig

    grid = scale["image"] // 16
    vision = dict(
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, mlp_dim=3072,
        image_size=scale["image"], patch_size=16, window_size=scale["window"],
        global_attn_indexes=[2, 5, 8, 11], output_channels=256,
    )  # fmt: skip
    prompt = dict(hidden_size=256, image_size=scale["image"], patch_size=16,
                  image_embedding_size=grid)  # fmt: skip
    return SamConfig(vision_config=vision, prompt_encoder_config=prompt)


def sam_task(scale_name: str) -> Task:
    import torch

    scale = SAM_SCALES[scale_name]

    class Segment(torch.nn.Module):
        def __init__(self, sam):
            super().__init__()
            self.sam = sam

        def forward(self, pixels, points, labels):
            embeddings = self.sam.get_image_embeddings(pixels)
            out = self.sam(
                image_embeddings=embeddings, input_points=points, input_labels=labels,
                multimask_output=True,
            )  # fmt: skip
            return embeddings, out.pred_masks

    def build(folder):
        from transformers import SamModel

        torch.manual_seed(0)
        model = SamModel(sam_config(scale)).eval()
        with torch.no_grad():  # SamModel's initialization gives embeddings of about 1e-19
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.02)
        model.save_pretrained(folder)

    def reference(folder):
        from transformers import SamModel

        return Segment(SamModel.from_pretrained(folder, trust_remote_code=False).eval())

    def inputs():
        g = torch.Generator().manual_seed(1)
        size = scale["image"]
        point = torch.tensor([[[[0.4 * size, 0.6 * size]]]])  # one prompt of one point
        return (torch.randn(1, 3, size, size, generator=g), point, torch.ones(1, 1, 1).long())

    def linnet(run, args):
        pixels, points, labels = args
        embeddings = run("embed_image", pixels)
        return embeddings, run("point_masks", embeddings, points, labels)

    return Task(
        name="sam-vit-base",
        shape={scale_name: dict(scale, hidden=768, layers=12, heads=12, globals=[2, 5, 8, 11])},
        build=build,
        inputs=inputs,
        reference=reference,
        linnet=linnet,
        input_names=["pixels", "points", "labels"],
        output_names=["embeddings", "masks"],
    )


TASKS = {"vae": vae_task, "unet": unet_task, "sam": sam_task}

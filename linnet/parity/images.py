"""Image-text (SigLIP) and image decoders (a VAE's decoder): inputs the gate makes itself.

    figures = measure_image_text(model, reference, config, tolerance)
    figures = measure_image_decoder(model, reference, config, tolerance)

* image-text: 2 images of deterministic random pixels (N(0, 1), seed 0, the config's size)
  and 3 texts of deterministic random token ids (seed 0) of the text tower's full length (as
  SigLIP's processor pads them); `embed_image`, `embed_text` against transformers'
  `get_image_features`, `get_text_features`, and `logits` against `logits_per_image`, with
  the same best text for every image;
* image-decoder: 2 latents of N(0, 1) (seed 0) of LATENT_SIZE; `decode` against diffusers'
  `decode(latents).sample`; where the source has them, `encode` and `encode_logvar` of 2
  images of N(0, 1) pixels (seed 0, 8x LATENT_SIZE) against diffusers'
  `encode(pixels).latent_dist.mean` and `.logvar`;
* unet: 2 latents of N(0, 1) of UNET_LATENT, timesteps 999 and 17 (both ends of the
  schedule), 5 text states and a pooled text embedding of N(0, 1), SDXL's time ids (size,
  crop, target; seed 0); `forward` against diffusers' `UNet2DConditionModel(...).sample`.
"""

from __future__ import annotations

from linnet.parity.compare import compare
from linnet.parity.report import OutputFigures
from linnet.parity.vision import random_pixels

TEXTS = 3
#: The latents' height and width (the image is 8x): small, not square (a transposed image
#: fails), and the same for tiny and real checkpoints.
LATENT_SIZE = (6, 8)
#: A UNet's latents: sides the UNet's three levels halve twice (multiples of 4), not square.
UNET_LATENT = (8, 12)
UNET_TEXT_TOKENS = 5
#: SDXL's time ids: original size, crop top-left, target size (one row per latent).
TIME_IDS = ((1024.0, 1024.0, 0.0, 0.0, 1024.0, 1024.0), (768.0, 1344.0, 64.0, 32.0, 832.0, 1216.0))


def random_texts(config: dict, count: int = TEXTS, seed: int = 0):
    """Deterministic random token ids [count, text_positions] inside the vocab."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, config["vocab"], (count, config["text_positions"]), generator=g)


def reference_image_text(reference, pixels, ids) -> dict:
    """transformers' SiglipModel outputs per Linnet entry."""
    import torch

    def pooled(out):  # transformers 5 returns a model output, 4 a tensor
        return getattr(out, "pooler_output", out)

    with torch.no_grad():
        return {
            "embed_image": pooled(reference.get_image_features(pixel_values=pixels)),
            "embed_text": pooled(reference.get_text_features(input_ids=ids)),
            "logits": reference(input_ids=ids, pixel_values=pixels).logits_per_image,
        }


def measure_image_text(model, reference, config: dict, tolerance) -> list[OutputFigures]:
    """embed_image, embed_text and logits (with the best text per image) on made inputs."""
    import numpy as np
    import torch

    pixels, ids = random_pixels(config), random_texts(config)
    refs = reference_image_text(reference, pixels, ids)
    label = f"random pixels {list(pixels.shape)}, ids {list(ids.shape)}, seed 0"
    args = {"embed_image": (pixels,), "embed_text": (ids,), "logits": (pixels, ids)}
    out = []
    for name, want in refs.items():
        got = torch.tensor(np.asarray(model.run(name, *args[name]))).float()
        extra = dict(tokens=int(ids.shape[1]) if name != "embed_image" else 0)
        if name == "logits":
            extra.update(
                rows=int(got.shape[0]), top1=int((got.argmax(-1) == want.argmax(-1)).sum())
            )
        out.append(compare(got, want, label, name, tolerance, **extra))
    return out


def random_latents(config: dict, batch: int = 2, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, config["latent_channels"], *LATENT_SIZE, generator=g)


def measure_image_decoder(model, reference, config: dict, tolerance) -> list[OutputFigures]:
    """`decode` of seeded latents against diffusers' decode(latents).sample."""
    import numpy as np
    import torch

    latents = random_latents(config)
    with torch.no_grad():
        want = reference.decode(latents).sample
    got = np.asarray(model.run("decode", latents))
    label = f"random latents {list(latents.shape)}, seed 0"
    rows = int(latents.shape[0])
    out = [compare(got, want, label, "decode", tolerance, tokens=0, rows=rows)]
    return out + measure_image_encoder(model, reference, config, tolerance)


def random_images(config: dict, batch: int = 2, seed: int = 0):
    """N(0, 1) pixels [batch, in_channels, 8 * LATENT_SIZE] (the encoder halves them 3 times)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    size = [8 * side for side in LATENT_SIZE]
    return torch.randn(batch, config.get("in_channels", 3), *size, generator=g)


def measure_image_encoder(model, reference, config: dict, tolerance) -> list[OutputFigures]:
    """`encode` and `encode_logvar`, those the model has, against diffusers' latent_dist."""
    import numpy as np
    import torch

    entries = [e for e in ("encode", "encode_logvar") if e in model.entries]
    if not entries:
        return []
    pixels = random_images(config)
    with torch.no_grad():
        dist = reference.encode(pixels).latent_dist
    wants = {"encode": dist.mean, "encode_logvar": dist.logvar}
    label = f"random pixels {list(pixels.shape)}, seed 0"
    rows = int(pixels.shape[0])
    return [
        compare(
            np.asarray(model.run(e, pixels)), wants[e], label, e, tolerance, tokens=0, rows=rows
        )
        for e in entries
    ]


def unet_inputs(config: dict, seed: int = 0) -> dict:
    """`forward`'s arguments, deterministic; the pooled text's width is what add_in leaves."""
    import torch

    g = torch.Generator().manual_seed(seed)
    batch, ids = len(TIME_IDS), len(TIME_IDS[0])
    text = config["add_in"] - ids * config["time_id_dim"]
    return {
        "sample": torch.randn(batch, config["in_channels"], *UNET_LATENT, generator=g),
        "timestep": torch.tensor([999.0, 17.0]),
        "encoder_hidden_states": torch.randn(
            batch, UNET_TEXT_TOKENS, config["cross_dim"], generator=g
        ),
        "text_embeds": torch.randn(batch, text, generator=g),
        "time_ids": torch.tensor(TIME_IDS),
    }


def measure_unet(model, reference, config: dict, tolerance) -> list[OutputFigures]:
    """`forward` on made inputs against diffusers' UNet2DConditionModel(...).sample."""
    import numpy as np
    import torch

    x = unet_inputs(config)
    added = {"text_embeds": x["text_embeds"], "time_ids": x["time_ids"]}
    with torch.no_grad():
        want = reference(
            x["sample"], x["timestep"], x["encoder_hidden_states"], added_cond_kwargs=added
        ).sample
    got = np.asarray(model.run("forward", *x.values()))
    shape = list(x["sample"].shape)
    label = f"random latents {shape}, timesteps 999 and 17, {UNET_TEXT_TOKENS} text states"
    return [compare(got, want, label, "forward", tolerance, tokens=0, rows=shape[0])]

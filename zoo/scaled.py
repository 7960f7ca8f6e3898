"""A scaled-down copy of a zoo entry's config, for parity on tiny random weights.

    from linnet.zoo import get
    from linnet.zoo.scaled import scaled_config
    fields = scaled_config(get("qwen3-4b"))     # config.json fields, model_type included
    AutoConfig.for_model(fields.pop("model_type"), **fields)

Derived from the entry and its weights map alone, so a new entry needs no table here:
the entry's config is translated to the source's fields by the map, the fields are shrunk
by rules keyed by source field names (one rule per concept, whatever the architecture),
and the map writes config.json back (`config_to_hf`, which adds model_type and
architectures). Config.json fields the map does not read are kept as the entry states them.

What decides the code path is kept: GQA ratio, an explicit head_dim that differs from
dim / n_heads (it becomes twice the implied one), tied head, rope type and parameters, norm
eps, activations, biases, token types, pad id, qkv bias, layer scale, the MLP ratio, layer
type. Sizes shrink: 2 layers (a layer period p: p + 1, so global and local layers both
occur), heads of 16 with at most 2 kv heads and 16 query heads (multi-head: 4 heads), vocab
256, 128 positions
(positions that count past the pad id keep that offset), 5 classes. A rope's original
context becomes 32, so llama3's three frequency bands all occur; a sliding window shorter
than the context becomes 8 (a decoder probe has 24 tokens), a local window 6 (a parity
sentence has 12). Images: half the patch on a 4 x 4 grid. ResNet: widths / (first stage's
width / 16), at most 2 layers a stage (every stage keeps a first layer and, where the real
one has them, further ones; stage 0 projects iff the real one does).
Towers with their own widths (Whisper's encoder and decoder, SigLIP's text tower): 2 layers,
4 heads of 16 each, the FFN ratio kept; Whisper's mel bins kept, 50 source positions (a 1 s
window of 100 mel frames); SigLIP's text 16 positions. A VAE decoder: widths / (first
width / 16), 8 groups, at most 2 layers a block. A UNet: widths / (first width / 16), heads
of 8, at most 2 transformer layers a level, 8 groups, text states of 32, time ids of 8, a
pooled text embedding of 16.
"""

from __future__ import annotations

from typing import Any

VOCAB = 256
POSITIONS = 128
LAYERS = 2
HEAD_DIM = 16
MAX_KV = 2
MAX_HEADS = 16
LABELS = 5  # a classifier's classes
ROPE_ORIGINAL = 32
WINDOW = 8
LOCAL_WINDOW = 6
STAGE_WIDTH = 16  # a ResNet's first stage
STAGE_DEPTH = 2
TOWER_HEADS = 4  # Whisper's and SigLIP's towers are multi-head
SOURCE_POSITIONS = 50  # Whisper: 1 s of audio (100 mel frames, halved by the stem)
TEXT_POSITIONS = 16  # SigLIP's text
VAE_WIDTH = 16  # a VAE decoder's first width
VAE_GROUPS = 8
UNET_WIDTH = 16  # a UNet's first level
UNET_HEAD_DIM = 8
UNET_DEPTH = 2  # transformer layers at most, per level
UNET_CROSS = 32  # the text states' width
UNET_TIME_ID = 8  # each time id's embedding
UNET_TEXT = 16  # the pooled text embedding's width
UNET_TIME_IDS = 6  # zoo/unet.linnet's n_time_ids: SDXL's size, crop and target size
#: A tower's heads field -> its width and FFN fields (Whisper's share `dim`).
TOWERS = {
    "enc_heads": ("dim", "enc_ffn"),
    "dec_heads": ("dim", "dec_ffn"),
    "text_heads": ("text_dim", "text_ffn"),
}
#: Whisper's special tokens inside the tiny vocab, laid out as the Hub's checkpoints lay them
#: out at the vocab's end (speech_rules below puts languages, tasks and no-timestamps there).
SPEECH_START = VOCAB - 6

#: Token ids inside the tiny vocab, per kind (a decoder never pads).
SPECIAL_IDS = {
    "decoder": {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": None},
    "encoder": {"bos_token_id": 1, "cls_token_id": 1, "eos_token_id": 2, "sep_token_id": 2},
    "speech": {
        "decoder_start_token_id": SPEECH_START,
        "pad_token_id": SPEECH_START + 1,
        "bos_token_id": SPEECH_START + 1,
        "eos_token_id": SPEECH_START + 2,
        "begin_suppress_tokens": [SPEECH_START + 3, SPEECH_START + 2],
    },
    # SigLIP's text tower: its config's default bos/eos (49406, 49407) lie past the tiny vocab
    "image-text": {"text_config": {"pad_token_id": 1, "bos_token_id": 1, "eos_token_id": 2}},
}


def speech_rules() -> dict:
    """generation_config.json's Whisper rules on the tiny vocab, as the Hub's checkpoints
    state them: three languages (detected), both tasks, no-timestamps, suppressed ids (a
    third of the vocab, so the gate's 32 greedy steps exercise the rule)."""
    start = SPEECH_START
    return dict(
        decoder_start_token_id=start,
        eos_token_id=start + 2,
        pad_token_id=start + 1,
        bos_token_id=start + 1,
        begin_suppress_tokens=[start + 3, start + 2],
        lang_to_id={"<|en|>": start - 6, "<|de|>": start - 5, "<|fr|>": start - 4},
        task_to_id={"translate": start - 3, "transcribe": start - 2},
        no_timestamps_token_id=start - 1,
        # every third id below the special tokens: greedy would pick some within 32 steps,
        # so ignoring the rule changes the tokens (the Hub's lists are ~90 of 51865)
        suppress_tokens=list(range(0, start - 6, 3)),
        is_multilingual=True,
        max_length=POSITIONS,
    )


def scaled_config(entry) -> dict:
    """config.json fields (with model_type and architectures) of a tiny model shaped like
    `entry`'s."""
    weights_map = weights_map_for(entry.architecture)
    real = weights_map.translate_config({**entry.config, "architectures": [entry.architecture]})
    small = shrink(real)
    return tiny_hf_config(weights_map, small, entry.kind, keep=entry.config)


def weights_map_for(architecture: str):
    """The weights map of an HF architecture (weights_maps/*.toml)."""
    from linnet.weights.maps import find_weights_map

    return find_weights_map(architecture)


def tiny_hf_config(weights_map, fields: dict, kind: str, keep: dict | None = None) -> dict:
    """config.json fields for source `fields` through `weights_map`, over the config.json
    fields of `keep` the map does not write, with token ids inside the vocab. Checked: the
    map reads the result back to `fields`."""
    hf = _merged(keep or {}, weights_map.config_to_hf(fields))
    if "vocab" in fields:
        hf = _merged(hf, SPECIAL_IDS.get(kind, {}))
        if "pad_id" in fields:
            hf["pad_token_id"] = fields["pad_id"]
        elif kind == "encoder":
            hf["pad_token_id"] = 0
    again = weights_map.translate_config(hf)
    off = {k: (v, again.get(k)) for k, v in fields.items() if again.get(k) != v}
    if off:
        raise ValueError(f"{weights_map.architecture}: the tiny config.json reads back {off}")
    return hf


def _merged(base: dict, over: dict) -> dict:
    """`over` on `base`, nested tables (SigLIP's text_config, vision_config) merged too."""
    out = dict(base)
    for k, v in over.items():
        both = isinstance(v, dict) and isinstance(out.get(k), dict)
        out[k] = _merged(out[k], v) if both else v
    return out


def shrink(real: dict[str, Any]) -> dict[str, Any]:
    """Source config fields of the tiny model, from the real model's."""
    small = {k: v for k, v in real.items() if k != "act"}  # the tiny checkpoint is f32
    _heads(real, small)
    _towers(real, small)
    _lengths(real, small)
    _image(real, small)
    _vae(real, small)
    _unet(real, small)
    _sam(real, small)
    if "n_labels" in real:
        small["n_labels"] = LABELS
    return small


def _heads(real: dict, small: dict) -> None:
    """Heads of HEAD_DIM, the GQA ratio kept; dim and ffn follow, ffn / dim about kept."""
    if "n_heads" not in real:
        return
    heads = real["n_heads"]
    kv = real.get("n_kv") or heads
    ratio = heads // kv
    # grouped: up to 2 kv heads and 16 query heads (one kv head for larger groups); MHA: 4
    n_kv = max(1, min(kv, MAX_KV, MAX_HEADS // ratio)) if ratio > 1 else 4
    small["n_heads"] = n_kv * ratio
    if "n_kv" in real:
        small["n_kv"] = n_kv
    small["dim"] = small["n_heads"] * HEAD_DIM
    if real.get("head_dim"):  # stated: twice the implied size where the real one differs
        explicit = real["head_dim"] != real["dim"] // heads
        small["head_dim"] = 2 * HEAD_DIM if explicit else HEAD_DIM
    if real.get("ffn"):  # a multiple of HEAD_DIM nearest the real ratio
        units = round(small["dim"] * real["ffn"] / real["dim"] / HEAD_DIM)
        small["ffn"] = max(1, units) * HEAD_DIM


def _towers(real: dict, small: dict) -> None:
    """Whisper's encoder and decoder, SigLIP's text tower: TOWER_HEADS heads of HEAD_DIM,
    the tower's FFN about its real ratio to the width."""
    for heads, (width, ffn) in TOWERS.items():
        if heads not in real or ffn not in real:  # SAM's dec_heads is no Whisper tower
            continue
        small[heads] = TOWER_HEADS
        small[width] = TOWER_HEADS * HEAD_DIM
        units = round(small[width] * real[ffn] / real[width] / HEAD_DIM)
        small[ffn] = max(1, units) * HEAD_DIM


def _vae(real: dict, small: dict) -> None:
    """A VAE decoder: widths / (least width / VAE_WIDTH), VAE_GROUPS groups, <= 2 layers."""
    if not isinstance(real.get("channels"), list) or "groups" not in real:
        return
    scale = max(1, min(real["channels"]) // VAE_WIDTH)
    small["channels"] = [w // scale for w in real["channels"]]
    small["groups"] = VAE_GROUPS
    small["layers"] = min(real["layers"], STAGE_DEPTH)


def _unet(real: dict, small: dict) -> None:
    """A UNet: widths / (first width / UNET_WIDTH), heads of UNET_HEAD_DIM, at most
    UNET_DEPTH transformer layers a level (a level without attention keeps none), VAE_GROUPS
    groups, narrow text states and time ids (the pooled text width is what add_in leaves)."""
    if "head_dims" not in real or "depth" not in real:
        return
    scale = max(1, real["widths"][0] // UNET_WIDTH)
    small["widths"] = [w // scale for w in real["widths"]]
    levels = small["widths"][1:-1]
    small["heads"] = [max(1, w // UNET_HEAD_DIM) for w in levels]
    small["head_dims"] = [w // h for w, h in zip(levels, small["heads"])]
    small["depth"] = [min(d, UNET_DEPTH) for d in real["depth"]]
    small["groups"] = VAE_GROUPS
    small["cross_dim"] = UNET_CROSS
    small["time_id_dim"] = UNET_TIME_ID
    small["add_in"] = UNET_TEXT + UNET_TIME_IDS * UNET_TIME_ID


def _lengths(real: dict, small: dict) -> None:
    """Layers, vocab, positions, rope context and windows."""
    for key in ("enc_layers", "dec_layers", "text_layers"):
        if key in real:
            small[key] = LAYERS
    if "source_positions" in real:
        small["source_positions"] = SOURCE_POSITIONS
    if "text_positions" in real:
        small["text_positions"] = TEXT_POSITIONS
    if "n_layers" in real:
        period = real.get("global_every") or real.get("full_every")  # both kinds of layer
        small["n_layers"] = period + 1 if period else LAYERS
    if "vocab" in real:
        small["vocab"] = VOCAB
    if "max_positions" in real:
        small["max_positions"] = POSITIONS
    if "n_positions" in real:  # positions that count past the pad id keep the offset
        padded = real.get("positions") == "padded"
        small["n_positions"] = POSITIONS + (real.get("pad_id", 0) + 1 if padded else 0)
    if real.get("rope_original_max"):
        small["rope_original_max"] = ROPE_ORIGINAL
    if "window" in real:
        context = real.get("max_positions") or real.get("n_positions")
        windowed = real["window"] and (not context or real["window"] < context)
        small["window"] = WINDOW if windowed else 0
    if "local_window" in real:
        small["local_window"] = LOCAL_WINDOW


def _image(real: dict, small: dict) -> None:
    """A 4 x 4 grid of half-size patches; ResNet's widths and depths."""
    if "patch" in real:
        small["patch"] = real["patch"] // 2
        small["image_size"] = 4 * small["patch"]
    if "widths" in real:
        scale = real["widths"][1] // STAGE_WIDTH
        small["widths"] = [w // scale for w in real["widths"]]
    if "depths" in real:
        small["depths"] = [min(d, STAGE_DEPTH) for d in real["depths"]]


#: SAM (issue 15): a 10 x 10 patch grid in windows of 4 (padded to 12), global attention at
#: layer 2 of 3, a 32-wide neck, prompt encoder and mask decoder.
SAM = dict(image_size=80, patch=8, window=4, n_layers=3, global_every=3, dim=32, n_heads=4,
           mlp_dim=64, out_channels=32, pe_feats=16, prompt_dim=32, dec_dim=32, prompt_size=80,
           embed_size=10, mask_channels=8, dec_layers=2, dec_heads=4, dec_mlp=64,
           iou_hidden=24, iou_depth=3, downsample=2)  # fmt: skip


def _sam(real: dict, small: dict) -> None:
    if "global_every" in real and "mask_channels" in real:
        small.update(SAM)

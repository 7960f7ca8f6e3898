"""Whisper's HF export (issue 14): HF -> Linnet -> HF is bit-exact, and transformers reloads it.

Tiny random WhisperForConditionalGeneration checkpoints of both configurations
(tests/tiny_whisper.py) and the WhisperModel inside each (saved bare: `encoder.`, `decoder.`,
no `proj_out`), exported from the folder and from a loaded model: every tensor `torch.equal`
to the original under the same name, config.json equal, generation_config.json (Whisper's
decoding rules) and preprocessor_config.json (the feature extractor) carried over. transformers
loads the export and gives bit-identical outputs, and `generate` with the rules the export
carries gives the original's tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import load_file  # noqa: E402

import linnet.hf  # noqa: E402
import linnet.torch as lt  # noqa: E402
from tests.tiny_whisper import WHISPER_CONFIGS, build_tiny_whisper, whisper_mel  # noqa: E402

KINDS = ("WhisperForConditionalGeneration", "WhisperModel")


@pytest.fixture(scope="module")
def whisper_root(tmp_path_factory):
    return tmp_path_factory.mktemp("whisper-export")


def build(kind: str, name: str, root: Path) -> Path:
    """The tiny checkpoint; for WhisperModel, its `model` saved on its own (bare names), with
    the companions a Hub repo has beside it."""
    folder = build_tiny_whisper(name, root)
    if kind == "WhisperForConditionalGeneration":
        return folder
    from transformers import WhisperForConditionalGeneration

    bare = root / f"whisper-model-{name}"
    if not (bare / "config.json").exists():
        full = WhisperForConditionalGeneration.from_pretrained(folder, trust_remote_code=False)
        full.model.save_pretrained(bare)
        for companion in ("generation_config.json", "preprocessor_config.json"):
            (bare / companion).write_bytes((folder / companion).read_bytes())
    return bare


def assert_bit_exact(original: Path, export: Path) -> None:
    want = load_file(original / "model.safetensors")
    got = load_file(export / "model.safetensors")
    assert sorted(got) == sorted(want), f"names differ: {set(got) ^ set(want)}"
    for name, t in want.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert torch.equal(got[name], t), f"{name}: max |Δ| {(got[name] - t).abs().max()}"


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.parametrize("how", ["path", "model"])
@pytest.mark.parametrize("name", sorted(WHISPER_CONFIGS))
@pytest.mark.parametrize("kind", KINDS)
def test_export_is_bit_exact_with_its_companions(whisper_root, tmp_path, kind, name, how):
    src = build(kind, name, whisper_root)
    assert _json(src / "config.json")["architectures"] == [kind]
    out = linnet.hf.export(src if how == "path" else lt.load(src), tmp_path / "out", progress=False)
    assert_bit_exact(src, out)
    assert _json(out / "config.json") == _json(src / "config.json")
    assert _json(out / "generation_config.json") == _json(src / "generation_config.json")
    assert (out / "preprocessor_config.json").read_bytes() == (
        src / "preprocessor_config.json"
    ).read_bytes()


@torch.no_grad()
@pytest.mark.parametrize("name", sorted(WHISPER_CONFIGS))
def test_transformers_reloads_the_export(whisper_root, tmp_path, name):
    """Identical logits and encoder output, and `generate` under the exported rules (language
    given: the prompt, suppression and begin-suppression all come from the export's
    generation_config.json) gives the original's tokens."""
    from transformers import WhisperForConditionalGeneration

    src = build("WhisperForConditionalGeneration", name, whisper_root)
    out = linnet.hf.export(lt.load(src), tmp_path / "out", progress=False)
    f32 = torch.float32
    want = WhisperForConditionalGeneration.from_pretrained(
        src, dtype=f32, trust_remote_code=False
    ).eval()
    got = WhisperForConditionalGeneration.from_pretrained(
        out, dtype=f32, trust_remote_code=False
    ).eval()
    mel = whisper_mel(src)
    start = WHISPER_CONFIGS[name]["decoder_start_token_id"]
    prompt = torch.tensor([[start, 4, 5], [start, 6, 7]])
    a = want(input_features=mel, decoder_input_ids=prompt).logits
    b = got(input_features=mel, decoder_input_ids=prompt).logits
    assert torch.equal(a, b), f"max |Δ| {(a - b).abs().max()}"
    gen = dict(input_features=mel, language="de", max_new_tokens=16)
    assert torch.equal(want.generate(**gen), got.generate(**gen))


@torch.no_grad()
def test_transformers_reloads_a_bare_whisper_model(whisper_root, tmp_path):
    from transformers import WhisperModel

    src = build("WhisperModel", "tiny", whisper_root)
    out = linnet.hf.export(lt.load(src), tmp_path / "out", progress=False)
    f32 = torch.float32
    mel = whisper_mel(src)
    ids = torch.tensor([[WHISPER_CONFIGS["tiny"]["decoder_start_token_id"], 4, 5]] * 2)
    want = WhisperModel.from_pretrained(src, dtype=f32, trust_remote_code=False).eval()(
        input_features=mel, decoder_input_ids=ids
    )
    got = WhisperModel.from_pretrained(out, dtype=f32, trust_remote_code=False).eval()(
        input_features=mel, decoder_input_ids=ids
    )
    assert torch.equal(want.last_hidden_state, got.last_hidden_state)
    assert torch.equal(want.encoder_last_hidden_state, got.encoder_last_hidden_state)

"""GPT-OSS configs without YaRN (issue 16): plain rope runs as transformers runs it, a
config.json whose rope_scaling is null is GptOssConfig's default YaRN on both sides, other
rope types are refused naming the key, and a GGUF export of plain rope is refused (llama.cpp's
gpt-oss would read the factor as linear scaling).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from linnet.zoo import source_path

import linnet.gguf
import linnet.torch as lt
from linnet.errors import ConfigError
from tests.numeric import assert_close
from tests.tiny_decoders import probe_ids, reference_logits
from tests.tiny_gpt_oss import GPT_OSS, build_gpt_oss


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt-oss-rope")
    return build_gpt_oss("spread", root, dict(GPT_OSS, rope_scaling="default"))


def _with_config(folder, target, change) -> object:
    shutil.copytree(folder, target)
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (target / "config.json").write_text(json.dumps(config))
    return target


def test_plain_rope_matches_transformers(plain):
    config = json.loads((plain / "config.json").read_text())
    assert config["rope_parameters"]["rope_type"] == "default"
    model = lt.load(plain, dtype="f32", mode="generated")
    assert model.config["rope_scaling"] == "default"
    ids = probe_ids(256)
    want = reference_logits(plain, ids)
    got = model.forward(ids)
    assert_close(got, want, atol=1e-4, what="plain rope logits")
    yarn = lt.load_source(source_path("gpt_oss"), dict(model.config, rope_scaling="yarn"),
                          dict(model.params))  # fmt: skip
    assert float((yarn.forward(ids) - want).abs().max()) > 1e-2  # the rope matters here


def test_null_rope_scaling_is_the_default_yarn(plain, tmp_path):
    def null(config):
        theta = config.pop("rope_parameters")["rope_theta"]
        config.update(rope_scaling=None, rope_theta=theta)

    folder = _with_config(plain, tmp_path / "null", null)
    model = lt.load(folder, dtype="f32")
    from transformers import AutoConfig

    theirs = AutoConfig.from_pretrained(folder, trust_remote_code=False).rope_parameters
    assert theirs["rope_type"] == model.config["rope_scaling"] == "yarn"
    assert theirs["original_max_position_embeddings"] == model.config["rope_original_max"]
    ids = probe_ids(256)
    assert_close(model.forward(ids), reference_logits(folder, ids), atol=1e-4, what="null")


@pytest.mark.parametrize("kind", ["linear", "dynamic", "llama3"])
def test_other_rope_types_are_refused(plain, tmp_path, kind):
    def other(config):
        config["rope_parameters"].update(rope_type=kind, factor=4.0)

    folder = _with_config(plain, tmp_path / kind, other)
    with pytest.raises(ConfigError, match=f"rope_type = '{kind}' is not supported"):
        lt.load(folder, dtype="f32")


def test_gguf_export_of_plain_rope_is_refused(plain, tmp_path):
    out = tmp_path / "plain.gguf"
    with pytest.raises(ConfigError, match="rope_scaling = 'default'"):
        linnet.gguf.export(plain, out, dtype="f32", progress=False)
    assert not out.exists() and not list(tmp_path.iterdir())


def test_gguf_export_of_yarn_is_not_refused(plain, tmp_path):
    """The guard's other side: the same checkpoint with YaRN exports."""

    def yarn(config):
        config["rope_parameters"]["rope_type"] = "yarn"

    folder = _with_config(plain, tmp_path / "yarn", yarn)
    out = linnet.gguf.export(folder, tmp_path / "yarn.gguf", dtype="f32", progress=False)
    back = linnet.gguf.load(out)
    assert back.config["rope_scaling"] == "yarn"
    assert torch.isfinite(back.forward(probe_ids(256))).all()

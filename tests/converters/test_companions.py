"""The files an export copies beside the weights come from inside the checkpoint: a symlink
that leads out of the folder is refused by name (the Hub cache's snapshot -> blob links
keep working), and a JSON companion that is not JSON is named instead of passed on. The
export then leaves nothing at its final path."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from click.testing import CliRunner

from linnet.cli import main

SECRET = {"secret": "a file outside the checkpoint"}


@pytest.fixture
def folder(tiny_checkpoint, tmp_path):
    out = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint("LlamaForCausalLM"), out)
    return out


def export(kind: str, src, out):
    return CliRunner().invoke(main, ["export", kind, str(src), "--out", str(out)])


@pytest.mark.parametrize("kind, out_name", [("hf", "out"), ("onnx", "out"), ("gguf", "out.gguf")])
def test_a_tokenizer_linked_from_outside_is_refused(folder, tmp_path, kind, out_name):
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps(SECRET))
    (folder / "tokenizer.json").symlink_to(outside)
    done = export(kind, folder, tmp_path / out_name)
    assert done.exit_code == 1, done.output
    assert "tokenizer.json" in done.output and "links outside" in done.output
    assert "Traceback" not in done.output
    assert not (tmp_path / out_name).exists()


def test_hub_cache_links_to_blobs_are_followed(folder, tmp_path):
    """models--org--name/snapshots/<commit>/tokenizer_config.json -> ../../blobs/<hash>"""
    repo = tmp_path / "models--org--tiny"
    snapshot = repo / "snapshots" / "0123abc"
    shutil.copytree(folder, snapshot)
    (repo / "blobs").mkdir()
    blob = repo / "blobs" / "5e3f"
    blob.write_text(json.dumps({"model_max_length": 128}))
    os.symlink(os.path.join("..", "..", "blobs", "5e3f"), snapshot / "tokenizer_config.json")
    done = export("hf", snapshot, tmp_path / "out")
    assert done.exit_code == 0, done.output
    copied = tmp_path / "out" / "tokenizer_config.json"
    assert not copied.is_symlink() and json.loads(copied.read_text()) == {"model_max_length": 128}


def test_a_link_inside_the_folder_is_followed(folder, tmp_path):
    (folder / "templates").mkdir()
    (folder / "templates" / "chat_template.jinja").write_text("{{ messages }}")
    (folder / "chat_template.jinja").symlink_to(folder / "templates" / "chat_template.jinja")
    done = export("hf", folder, tmp_path / "out")
    assert done.exit_code == 0, done.output
    assert (tmp_path / "out" / "chat_template.jinja").read_text() == "{{ messages }}"


def test_a_json_companion_that_is_not_json_is_named(folder, tmp_path):
    (folder / "special_tokens_map.json").write_text('{"bos_token": ')
    done = export("hf", folder, tmp_path / "out")
    assert done.exit_code == 1, done.output
    assert "special_tokens_map.json: not a readable JSON file" in done.output
    assert "Traceback" not in done.output and not (tmp_path / "out").exists()

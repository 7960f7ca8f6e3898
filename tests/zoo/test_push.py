"""`linnet push` / `linnet.hub.push` against a local upload endpoint (tests/upload_server.py).

The push runs in a subprocess with HF_ENDPOINT pointing at the local server and
HF_HUB_DISABLE_XET=1 (set before huggingface_hub is imported, so uploads take the LFS
path the server speaks). Every uploaded file's bytes must equal the folder's, and the
model card's front matter must say what the artifact is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import linnet.gguf
import linnet.hf
from tests.upload_server import read_back, serve

REPO = Path(__file__).resolve().parents[2]


def _run(args: list[str], hub) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        HF_ENDPOINT=hub.url,
        HF_HUB_DISABLE_XET="1",
        HF_TOKEN="hf_local_test_token",
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_OFFLINE="0",
    )
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def _front_matter(card: str) -> dict:
    assert card.startswith("---\n"), card[:80]
    head = card[4 : card.index("\n---\n", 4)]
    return yaml.safe_load(head)


@pytest.fixture
def hub():
    """The upload stand-in; a request it does not implement fails the test."""
    with serve() as h:
        yield h
    assert h.unknown == [], f"requests the upload stand-in does not implement: {h.unknown}"


def _assert_uploaded(hub, repo: str, folder: Path) -> None:
    """Every file of `folder` (the card and parity record the push wrote there included),
    and only those, was committed, and reads back over HTTP byte for byte."""
    local = {
        str(p.relative_to(folder)): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and not p.name.startswith(".")
    }
    assert sorted(hub.files[repo]) == sorted(local)
    for name, data in local.items():
        assert read_back(hub, repo, name) == data, f"{name}: uploaded bytes differ"
    assert hub.unknown == [], f"requests the upload stand-in does not implement: {hub.unknown}"


def test_push_hf_export_with_parity(tiny_checkpoint, tmp_path, hub):
    folder = linnet.hf.export(tiny_checkpoint("llama", "tied"), tmp_path / "tiny", progress=False)
    record = {"entry": "tiny-llama", "backend": "torch", "dtype": "f32", "max_abs": 3.2e-5,
              "prompts": [{"first_token": 7, "same": True}]}  # fmt: skip
    (tmp_path / "parity.json").write_text(json.dumps(record))
    r = _run(
        [sys.executable, "-m", "linnet.cli", "push", str(folder), "--repo", "me/tiny-llama",
         "--base-model", "org/tiny-llama", "--parity", str(tmp_path / "parity.json"),
         "--license", "apache-2.0"],
        hub,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "pushed" in r.stdout and "/me/tiny-llama/commit/" in r.stdout
    assert hub.repos["me/tiny-llama"]["name"] == "tiny-llama"
    _assert_uploaded(hub, "me/tiny-llama", folder)
    assert "PUT" in {m for m, _ in hub.calls}, "weights went through LFS"
    meta = _front_matter(hub.files["me/tiny-llama"]["README.md"].decode())
    assert meta["base_model"] == "org/tiny-llama"
    assert meta["library_name"] == "transformers"
    assert meta["license"] == "apache-2.0"
    assert {"linnet", "safetensors", "llama"} <= set(meta["tags"])
    card = hub.files["me/tiny-llama"]["README.md"].decode()
    assert "## How it was made" in card and "## Parity" in card and "3.2e-05" in card
    assert json.loads(hub.files["me/tiny-llama"]["linnet_parity.json"]) == record
    assert len(hub.commits) == 1


def test_push_gguf_through_the_api(tiny_checkpoint, tmp_path, hub):
    folder = tmp_path / "gguf"
    linnet.gguf.export(tiny_checkpoint("qwen2"), folder / "tiny.q8_0.gguf", dtype="q8_0",
                       progress=False)  # fmt: skip
    code = (
        "from linnet.hub import push; "
        f"print(push({str(folder)!r}, 'org/tiny-gguf', private=True, base_model='org/base'))"
    )
    r = _run([sys.executable, "-c", code], hub)
    assert r.returncode == 0, r.stderr
    assert hub.repos["org/tiny-gguf"].get("visibility") == "private"
    _assert_uploaded(hub, "org/tiny-gguf", folder)
    meta = _front_matter(hub.files["org/tiny-gguf"]["README.md"].decode())
    assert meta["library_name"] == "gguf" and "gguf" in meta["tags"]
    assert meta["base_model"] == "org/base" and meta["license"] == "other"
    assert "q8_0" in hub.files["org/tiny-gguf"]["README.md"].decode()


def test_push_keeps_a_foreign_readme_and_refuses_bad_repos(tiny_checkpoint, tmp_path, hub):
    folder = linnet.hf.export(tiny_checkpoint("gpt2"), tmp_path / "g", progress=False)
    (folder / "README.md").write_text("# my own card\n")
    r = _run([sys.executable, "-m", "linnet.cli", "push", str(folder), "--repo", "a/b"], hub)
    assert r.returncode == 0, r.stderr
    assert hub.files["a/b"]["README.md"] == b"# my own card\n"
    _assert_uploaded(hub, "a/b", folder)
    r = _run([sys.executable, "-m", "linnet.cli", "push", str(folder), "--repo", "nope"], hub)
    assert r.returncode == 1 and "expected ORG/NAME" in r.stderr
    r = _run([sys.executable, "-m", "linnet.cli", "push", str(tmp_path / "x"), "--repo",
              "a/b"], hub)  # fmt: skip
    assert r.returncode == 1 and "no such folder" in r.stderr


def test_the_stand_in_records_requests_it_does_not_implement():
    import urllib.error
    import urllib.request

    with serve() as stand_in:
        for method, path in [("GET", "/api/whoami-v2"), ("HEAD", "/a/b/resolve/main/x"),
                             ("DELETE", "/api/repos/delete")]:  # fmt: skip
            request = urllib.request.Request(stand_in.url + path, method=method)
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(request, timeout=10)
            assert err.value.code == 404
        with pytest.raises(urllib.error.HTTPError, match="404"):
            read_back(stand_in, "a/b", "never-committed.json")  # known route, no such file
    assert stand_in.unknown == [
        ("GET", "/api/whoami-v2"),
        ("HEAD", "/a/b/resolve/main/x"),
        ("DELETE", "/api/repos/delete"),
    ]

"""Pulling a checkpoint that is one folder of a repo: a diffusers pipeline's `unet/`
(zoo entry field `subfolder`, e.g. sdxl-base-unet), against the local Hub (olah + git-lfs,
tests/hub_server.py).

The repo is a tiny pipeline: a root model_index.json, a vae/ folder, and unet/ with a tiny
SDXL-shaped UNet2DConditionModel saved by diffusers (config.json, the plain
diffusion_pytorch_model.safetensors and its fp16 variant). A pull fetches unet/'s config and
plain weights alone, at the pinned commit, verified against the Hub's hashes, and hands back
snapshot/unet, which linnet.torch.load runs to diffusers' output.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from linnet.zoo.registry import Entry, Registry, load_registry  # noqa: E402

from linnet.errors import CheckpointError, LinnetError  # noqa: E402
from linnet.hub import IntegrityError, pull  # noqa: E402
from tests.hub_server import LocalHub, free_port, missing_tools, online_against, sha256  # noqa: E402
from tests.models.test_unet import build, inputs, reference  # noqa: E402
from tests.numeric import assert_close  # noqa: E402

PLAIN = "diffusion_pytorch_model.safetensors"
FP16 = "diffusion_pytorch_model.fp16.safetensors"


def pipeline_files(unet: Path, fp16: Path) -> dict[str, Path | bytes]:
    index = {
        "_class_name": "StableDiffusionXLPipeline",
        "unet": ["diffusers", "UNet2DConditionModel"],
    }
    return {
        "model_index.json": json.dumps(index).encode(),
        "vae/config.json": b'{"_class_name": "AutoencoderKL"}\n',
        "unet/config.json": unet / "config.json",
        f"unet/{PLAIN}": unet / PLAIN,
        f"unet/{FP16}": fp16 / FP16,
    }


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    missing = missing_tools()
    if missing:
        pytest.fail(f"the local Hub needs {', '.join(missing)}: run scripts/setup.sh")
    root = tmp_path_factory.mktemp("subfolder-hub")
    work = tmp_path_factory.mktemp("unets")
    h = LocalHub(root)
    v1, v2 = build(work, "sdxl"), build(work, "attend_all")  # two different UNets
    from diffusers import UNet2DConditionModel

    model = UNet2DConditionModel.from_pretrained(v1, trust_remote_code=False)
    model.half().save_pretrained(work / "fp16", variant="fp16")
    ns = SimpleNamespace(hub=h, endpoint=h.endpoint, unet=v1, unet_sha=sha256(v1 / PLAIN))
    ns.v1 = h.commit("test-org/tiny-sdxl", pipeline_files(v1, work / "fp16"), "v1")
    ns.v2 = h.commit("test-org/tiny-sdxl", {"unet/config.json": v2 / "config.json",
                                            f"unet/{PLAIN}": v2 / PLAIN}, "v2")  # fmt: skip
    h.commit("test-org/corrupt-sdxl", pipeline_files(v1, work / "fp16"))
    obj = h.lfs_object("test-org/corrupt-sdxl", f"unet/{PLAIN}")
    data = bytearray(obj.read_bytes())
    data[-16:] = bytes(b ^ 0xFF for b in data[-16:])  # tensor bytes: same size, still parses
    obj.write_bytes(bytes(data))
    # A flat repo: the UNet at the top level, no unet/ folder.
    h.commit("test-org/flat-unet", {"model_index.json": b"{}", "config.json": v1 / "config.json",
                                    PLAIN: v1 / PLAIN})  # fmt: skip
    h.start()
    yield ns
    h.stop()


def entry(name: str, repo: str, revision: str | None) -> Entry:
    return Entry(name, repo, "UNet2DConditionModel", "openrail++", revision=revision,
                 reference="diffusers.UNet2DConditionModel", subfolder="unet")  # fmt: skip


@pytest.fixture
def env(hub, tmp_path, monkeypatch):
    """Online against the local Hub, with a fresh HF cache."""
    cache = online_against(hub.endpoint, tmp_path, monkeypatch)
    reg = Registry(
        [
            entry("tiny-sdxl-unet", "test-org/tiny-sdxl", hub.v1),
            entry("corrupt-sdxl-unet", "test-org/corrupt-sdxl", None),
            entry("flat-unet", "test-org/flat-unet", None),
        ]
    )
    return SimpleNamespace(cache=cache, registry=reg)


def snapshot_of(cache: Path, repo: str, commit: str) -> Path:
    return cache / ("models--" + repo.replace("/", "--")) / "snapshots" / commit


def test_pull_fetches_the_subfolder_at_the_pin_and_it_loads(env, hub):
    import linnet.torch as lt

    got = pull("tiny-sdxl-unet", registry=env.registry)
    snapshot = snapshot_of(env.cache, "test-org/tiny-sdxl", hub.v1)
    assert got.commit == hub.v1 and got.folder == snapshot / "unet"
    assert sorted(got.files) == ["config.json", PLAIN]
    assert sha256(got.folder / PLAIN) == hub.unet_sha  # v1's weights, not v2's
    fetched = sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file())
    assert fetched == ["unet/config.json", f"unet/{PLAIN}"]  # no fp16, no model_index, no vae
    assert not any(FP16 in line for line in hub.hub.requests())
    assert got.plan.architecture == "UNet2DConditionModel"

    args = inputs("sdxl")
    out = lt.load(got.folder).run("forward", *args)
    want = reference(hub.unet, args)
    assert_close(out, want, atol=1e-4, what="pulled unet", dtype=True)


def test_branch_and_offline_pull_of_the_subfolder(env, hub, monkeypatch):
    from huggingface_hub import constants

    main = pull("tiny-sdxl-unet", revision="main", registry=env.registry)
    assert main.commit == hub.v2 and sha256(main.folder / PLAIN) != hub.unet_sha
    served = len(hub.hub.requests())
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing there
    offline = pull("tiny-sdxl-unet", revision="main", registry=env.registry)
    assert offline.offline and offline.folder == main.folder and offline.commit == hub.v2
    assert sorted(offline.files) == ["config.json", PLAIN]
    assert len(hub.hub.requests()) == served


def test_offline_pull_checks_the_cached_subfolder(env, hub, monkeypatch):
    from huggingface_hub import constants

    online = pull("tiny-sdxl-unet", registry=env.registry)
    blob = (online.folder / "config.json").resolve()
    blob.write_bytes(blob.read_bytes() + b" ")  # still JSON, not the Hub's bytes
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(IntegrityError, match="config.json"):
        pull("tiny-sdxl-unet", registry=env.registry)


def test_a_corrupt_subfolder_weight_is_refused(env):
    with pytest.raises(IntegrityError, match=PLAIN):
        pull("corrupt-sdxl-unet", revision="main", registry=env.registry)


def test_a_repo_without_the_subfolder_is_a_clear_error(env, hub):
    with pytest.raises(CheckpointError, match=r"no unet/ folder.*config\.json"):
        pull("flat-unet", revision="main", registry=env.registry)
    assert not any("flat-unet/resolve" in line for line in hub.hub.requests())


def test_registry_reads_subfolder(tmp_path):
    assert load_registry().get("sdxl-base-unet").subfolder == "unet"
    assert load_registry().get("smollm2-135m-instruct").subfolder is None
    bad = tmp_path / "entries.toml"
    bad.write_text(
        '[planned.x]\nrepo = "a/b"\narchitecture = "A"\nlicense = "l"\nsubfolder = "../x"\n'
    )
    with pytest.raises(LinnetError, match="subfolder"):
        load_registry(bad, tmp_path / "none.toml")

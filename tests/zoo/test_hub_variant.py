"""f16 pulls of diffusers checkpoints fetch the `.fp16.` weights variant where the repo has it
(issue 15), against the local Hub (olah + git-lfs, tests/hub_server.py), and never both sets.

The repo holds a tiny AutoencoderKL saved by diffusers twice: the plain f32
diffusion_pytorch_model.safetensors and its fp16 variant (`save_pretrained(variant="fp16")`).
A pull asking for f16 fetches config.json and the fp16 file alone, verified; a default pull the
plain file alone; a repo without the variant gives its plain file to an f16 pull; the cached
f16 pull answers offline. The pulled folder loads and runs against diffusers' own load of the
same variant. The choice between sharded sets (plain and fp16 indexes) is checked on names.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from linnet.zoo.registry import Entry, Registry  # noqa: E402

from linnet.hub import pull  # noqa: E402
from linnet.hub_remote import wanted_files, weight_files  # noqa: E402
from tests.hub_server import LocalHub, free_port, missing_tools, online_against, sha256  # noqa: E402
from tests.models.test_sd_vae import build  # noqa: E402
from tests.numeric import assert_close  # noqa: E402

PLAIN = "diffusion_pytorch_model.safetensors"
FP16 = "diffusion_pytorch_model.fp16.safetensors"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    missing = missing_tools()
    if missing:
        pytest.fail(f"the local Hub needs {', '.join(missing)}: run scripts/setup.sh")
    from diffusers import AutoencoderKL

    root, work = tmp_path_factory.mktemp("variant-hub"), tmp_path_factory.mktemp("vaes")
    plain = build(work, "groups8")
    AutoencoderKL.from_pretrained(plain, trust_remote_code=False).half().save_pretrained(
        work / "fp16", variant="fp16"
    )
    h = LocalHub(root)
    files = {"config.json": plain / "config.json", PLAIN: plain / PLAIN}
    ns = SimpleNamespace(hub=h, plain=plain, fp16=work / "fp16" / FP16)
    ns.both = h.commit("test-org/tiny-vae", {**files, FP16: ns.fp16})
    ns.only_plain = h.commit("test-org/plain-vae", files)
    h.start()
    yield ns
    h.stop()


@pytest.fixture
def env(hub, tmp_path, monkeypatch):
    """Online against the local Hub, with a fresh HF cache."""
    cache = online_against(hub.hub.endpoint, tmp_path, monkeypatch)

    def entry(name, repo, revision):
        return Entry(name, repo, "AutoencoderKL", "mit", revision=revision,
                     reference="diffusers.AutoencoderKL", kind="image-decoder")  # fmt: skip

    reg = Registry(
        [entry("tiny-vae", "test-org/tiny-vae", hub.both),
         entry("plain-vae", "test-org/plain-vae", hub.only_plain)]
    )  # fmt: skip
    return SimpleNamespace(cache=cache, registry=reg)


def fetched(got) -> list[str]:
    return sorted(p.name for p in got.folder.iterdir() if p.is_file())


def requests_during(hub, pull_it) -> tuple:
    """(what pull_it returned, the Hub's request lines it caused): the log is the module's."""
    before = len(hub.hub.requests())
    got = pull_it()
    return got, hub.hub.requests()[before:]


def test_f16_pull_fetches_the_fp16_variant_alone_and_it_runs(env, hub):
    from diffusers import AutoencoderKL

    import linnet.torch as lt

    got, asked = requests_during(hub, lambda: pull("tiny-vae", dtype="f16", registry=env.registry))
    assert got.commit == hub.both and sorted(got.files) == ["config.json", FP16]
    assert fetched(got) == ["config.json", FP16]
    assert sha256(got.folder / FP16) == sha256(hub.fp16)
    assert any(FP16 in line for line in asked)
    assert not any(PLAIN in line for line in asked)  # not even its header
    assert got.plan.architecture == "AutoencoderKL"

    latents = torch.randn(1, 4, 2, 3, generator=torch.Generator().manual_seed(1))
    pixels = torch.randn(1, 3, 16, 24, generator=torch.Generator().manual_seed(2))
    theirs = AutoencoderKL.from_pretrained(
        got.folder, variant="fp16", torch_dtype=torch.float32, trust_remote_code=False
    ).eval()
    model = lt.load(got.folder, dtype="f32")  # the fp16 weights, widened as diffusers does
    with torch.no_grad():
        want_image = theirs.decode(latents).sample
        want_mean = theirs.encode(pixels).latent_dist.mean
    assert_close(model.run("decode", latents), want_image, atol=1e-4, what="decode")
    assert_close(model.run("encode", pixels), want_mean, atol=1e-4, what="encode")


def test_a_default_pull_fetches_the_plain_weights_alone(env, hub):
    got, asked = requests_during(hub, lambda: pull("tiny-vae", registry=env.registry))
    assert sorted(got.files) == ["config.json", PLAIN] and fetched(got) == ["config.json", PLAIN]
    assert sha256(got.folder / PLAIN) == sha256(hub.plain / PLAIN)
    assert any(PLAIN in line for line in asked)
    assert not any(FP16 in line for line in asked)


def test_an_f16_pull_without_the_variant_takes_the_plain_weights(env, hub):
    got = pull("plain-vae", dtype="f16", registry=env.registry)
    assert sorted(got.files) == ["config.json", PLAIN] and fetched(got) == ["config.json", PLAIN]


def test_the_cached_f16_pull_answers_offline(env, hub, monkeypatch):
    from huggingface_hub import constants

    online = pull("tiny-vae", dtype="f16", registry=env.registry)
    served = len(hub.hub.requests())
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing there
    offline = pull("tiny-vae", dtype="f16", registry=env.registry)
    assert offline.offline and offline.folder == online.folder
    assert sorted(offline.files) == ["config.json", FP16]
    assert len(hub.hub.requests()) == served


SHARDED = {
    "config.json",
    "diffusion_pytorch_model.safetensors.index.json",
    "diffusion_pytorch_model-00001-of-00002.safetensors",
    "diffusion_pytorch_model-00002-of-00002.safetensors",
    "diffusion_pytorch_model.safetensors.index.fp16.json",
    "diffusion_pytorch_model.fp16-00001-of-00002.safetensors",
    "diffusion_pytorch_model.fp16-00002-of-00002.safetensors",
}


def index_of(names, variant=None) -> dict:
    prefix = "diffusion_pytorch_model" + (".fp16" if variant else "")
    return {"weight_map": {f"t{i}": f"{prefix}-0000{i}-of-00002.safetensors" for i in (1, 2)}}


@pytest.mark.parametrize("variant", [None, "fp16"])
def test_sharded_sets_one_index_and_its_shards(variant):
    """diffusers' sharded variant (`.safetensors.index.fp16.json` naming `.fp16-0000k-of-...`
    shards) beside the plain set: the pull takes one index and its shards, never the other
    index (Checkpoint would read it first)."""
    from linnet.hub_remote import index_file

    index_name = index_file(SHARDED, variant)
    assert index_name == (
        "diffusion_pytorch_model.safetensors.index" + (".fp16" if variant else "") + ".json"
    )
    files = wanted_files(SHARDED, index_of(SHARDED, variant), variant)
    assert files == sorted(
        {"config.json", index_name, *index_of(SHARDED, variant)["weight_map"].values()}
    )
    assert weight_files(SHARDED, index_of(SHARDED, variant), variant) == sorted(
        index_of(SHARDED, variant)["weight_map"].values()
    )

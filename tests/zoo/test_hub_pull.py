"""`linnet zoo pull` / `linnet.hub.pull` against a real local Hub (olah + git-lfs).

The repos are git work trees built here from transformers-generated tiny checkpoints; olah
serves them on 127.0.0.1 (tests/hub_server.py). Every test pulls into its own HF cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from linnet.zoo.registry import Entry, Registry, load_registry

from linnet.errors import CheckpointError, PickledCheckpoint
from linnet.hub import HubUnreachable, IntegrityError, RepoNotFound, UnpinnedRevision, lock, pull
from tests.hub_server import LocalHub, free_port, missing_tools, online_against, sha256

MISFIT_TENSOR = "model.layers.1.mlp.up_proj.weight"


def tiny_tokenizer(out: Path, vocab: int) -> None:
    """A word-level tokenizer over `vocab` words w0, w1, ... (ids 0-2 are unk, bos, eos)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"w{i}": i for i in range(3, vocab)}
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.save_pretrained(out)


def perturbed(src: Path, out: Path, name: str, fn) -> Path:
    """A copy of a safetensors file with tensor `name` replaced by fn(tensor)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(src)
    tensors[name] = fn(tensors[name]).contiguous()
    save_file(tensors, out, metadata={"format": "pt"})
    return out


def checkpoint_files(folder: Path) -> dict[str, Path]:
    return {p.name: p for p in folder.iterdir() if p.is_file() and p.name != "linnet_tiny.json"}


@pytest.fixture(scope="module")
def hub(tmp_path_factory, tiny_checkpoint):
    missing = missing_tools()
    if missing:
        pytest.fail(f"the local Hub needs {', '.join(missing)}: run scripts/setup.sh")
    root = tmp_path_factory.mktemp("local-hub")
    work = root / "work"
    work.mkdir()
    h = LocalHub(root)
    ns = SimpleNamespace(hub=h, endpoint=h.endpoint)

    tied = tiny_checkpoint("llama", "tied")
    tiny_tokenizer(work / "tok", 256)
    v1 = checkpoint_files(tied) | checkpoint_files(work / "tok")
    v1["pytorch_model.bin"] = os.urandom(4096)  # a pickle the repo also holds
    v1["README.md"] = b"# tiny llama\n"
    ns.v1 = h.commit("test-org/tiny-llama", v1, "v1")
    ns.v1_sha = sha256(tied / "model.safetensors")
    v2 = perturbed(
        tied / "model.safetensors", work / "v2.safetensors", "model.norm.weight", lambda t: t * 1.5
    )
    ns.v2 = h.commit("test-org/tiny-llama", {"model.safetensors": v2}, "v2")
    ns.v2_sha = sha256(v2)
    ns.bin_sha = hashlib.sha256(v1["pytorch_model.bin"]).hexdigest()

    h.commit("test-org/corrupt", checkpoint_files(tied), "weights whose LFS object is damaged")
    obj = h.lfs_object("test-org/corrupt", "model.safetensors")
    data = bytearray(obj.read_bytes())
    data[-16:] = bytes(b ^ 0xFF for b in data[-16:])  # the last tensor's bytes, same size
    obj.write_bytes(bytes(data))

    base = tiny_checkpoint("llama", "base")
    bad = perturbed(base / "model.safetensors", work / "misfit.safetensors", MISFIT_TENSOR,
                    lambda t: t.T)  # fmt: skip
    ns.misfit_sha = sha256(bad)
    h.commit("test-org/misfit", {"config.json": base / "config.json", "model.safetensors": bad})

    from transformers import AutoModelForCausalLM

    qwen3 = AutoModelForCausalLM.from_pretrained(tiny_checkpoint("qwen3"), trust_remote_code=False)
    qwen3.save_pretrained(work / "sharded", max_shard_size="100KB")
    ns.shards = sorted(p.name for p in (work / "sharded").glob("*.safetensors"))
    h.commit("test-org/sharded", checkpoint_files(work / "sharded"))

    pickle = os.urandom(2048)
    ns.pickle_sha = hashlib.sha256(pickle).hexdigest()
    h.commit("test-org/pickle-only", {"config.json": base / "config.json",
                                      "pytorch_model.bin": pickle})  # fmt: skip
    h.start()
    yield ns
    h.stop()


@pytest.fixture
def env(hub, tmp_path, monkeypatch):
    """Online against the local Hub, with a fresh HF cache."""
    cache = online_against(hub.endpoint, tmp_path, monkeypatch)
    reg = Registry(
        [
            Entry("tiny-llama", "test-org/tiny-llama", "LlamaForCausalLM", "apache-2.0",
                  revision=hub.v1, reference="transformers.LlamaForCausalLM"),
            Entry("tiny-llama-unpinned", "test-org/tiny-llama", "LlamaForCausalLM",
                  "apache-2.0", reference="transformers.LlamaForCausalLM"),
        ]
    )  # fmt: skip
    return SimpleNamespace(cache=cache, registry=reg, endpoint=hub.endpoint, hub=hub)


def blobs(cache: Path, repo: str) -> dict[str, int]:
    folder = cache / ("models--" + repo.replace("/", "--")) / "blobs"
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} if folder.is_dir() else {}


def resolves(hub) -> int:
    return sum("/resolve/" in line for line in hub.hub.requests())


# -- revisions ------------------------------------------------------------------------------


def test_pinned_revision_and_branch(env, hub):
    pinned = pull("tiny-llama", registry=env.registry)
    assert pinned.commit == hub.v1 and pinned.folder.name == hub.v1
    assert sha256(pinned.folder / "model.safetensors") == hub.v1_sha
    branch = pull("tiny-llama", revision="main", registry=env.registry)
    assert branch.commit == hub.v2 and branch.folder.name == hub.v2
    assert sha256(branch.folder / "model.safetensors") == hub.v2_sha
    # The pinned snapshot is untouched by the branch pull, in the one shared cache.
    assert sha256(pinned.folder / "model.safetensors") == hub.v1_sha
    assert pinned.folder.parent == branch.folder.parent


def test_unpinned_entry_warns_and_takes_the_default_branch(env, hub):
    with pytest.warns(UnpinnedRevision, match="tiny-llama-unpinned has no pinned revision"):
        result = pull("tiny-llama-unpinned", registry=env.registry)
    assert result.commit == hub.v2


def test_allow_patterns_leave_out_pickles_and_other_files(env, hub):
    result = pull("tiny-llama", registry=env.registry)
    names = sorted(p.name for p in result.folder.iterdir())
    assert names == sorted(result.files)
    assert "pytorch_model.bin" not in names and "README.md" not in names
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(names)
    assert hub.bin_sha not in blobs(env.cache, "test-org/tiny-llama")
    assert not any("pytorch_model.bin" in line for line in hub.hub.requests())


def test_second_pull_downloads_nothing(env, hub):
    first = pull("tiny-llama", registry=env.registry)
    assert first.downloaded > 500_000  # the weights
    before, served = blobs(env.cache, "test-org/tiny-llama"), resolves(hub)
    second = pull("tiny-llama", registry=env.registry)
    assert second.folder == first.folder and second.downloaded == 0
    assert blobs(env.cache, "test-org/tiny-llama") == before  # same blobs, same mtimes
    assert resolves(hub) == served  # no file was fetched again


def test_offline_mode_uses_the_cache(env, hub, monkeypatch):
    from huggingface_hub import constants

    online = pull("tiny-llama", registry=env.registry)
    served = len(hub.hub.requests())
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing there
    offline = pull("tiny-llama", registry=env.registry)
    assert offline.offline and offline.folder == online.folder and offline.commit == hub.v1
    assert offline.downloaded == 0 and len(hub.hub.requests()) == served
    with pytest.raises(HubUnreachable, match="not in the HF cache"):
        pull("tiny-llama", revision="main", registry=env.registry)  # v2 was never pulled


def cached_blob(folder: Path, name: str) -> Path:
    return (folder / name).resolve()


def tamper(blob: Path, name: str) -> None:
    """Change a cached file so that it still parses: flip a safetensors file's last bytes
    (tensor data, same size), append a space to a JSON file."""
    data = bytearray(blob.read_bytes())
    if name.endswith(".safetensors"):
        data[-16:] = bytes(b ^ 0xFF for b in data[-16:])
    else:
        data += b" "
    blob.write_bytes(bytes(data))


def forget_listing(storage: Path, commit: str, monkeypatch) -> None:
    """Drop the tree listing snapshot_download cached (on disk and in this process), so the
    offline pull has only the blob's name, the etag the Hub served, to check against."""
    from huggingface_hub import _tree_cache

    (storage / "trees" / f"{commit}.json").unlink()
    monkeypatch.setattr(_tree_cache, "_IN_MEMORY_TREE_CACHE", {})


@pytest.mark.parametrize("listing", [True, False], ids=["listing", "etag"])
@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_offline_pull_refuses_a_tampered_cached_file(env, hub, monkeypatch, name, listing):
    """The offline pull checks the cache as the online one does: an LFS file against its
    sha256, any other against its git blob sha1, from the cached listing or the blob's name."""
    from huggingface_hub import constants

    online = pull("tiny-llama", registry=env.registry)
    blob = cached_blob(online.folder, name)
    tamper(blob, name)
    if not listing:
        forget_listing(online.folder.parents[1], online.commit, monkeypatch)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing there
    with pytest.raises(IntegrityError, match=f"^{name}: content does not match the Hub") as err:
        pull("tiny-llama", registry=env.registry)
    kind = "sha256" if name.endswith(".safetensors") else "git"  # LFS pointer, or git blob
    assert err.value.exit_code == 5 and f": {kind} " in str(err.value)
    assert not blob.exists() and not (online.folder / name).exists()  # nothing can use it


def test_cli_offline_pull_refuses_a_tampered_cached_file(env, hub):
    first = cli(env, "zoo", "pull", "test-org/tiny-llama", "--revision", "main")
    assert first.returncode == 0, first.stderr
    folder = env.cache / "models--test-org--tiny-llama" / "snapshots" / hub.v2
    tamper(cached_blob(folder, "model.safetensors"), "model.safetensors")
    done = cli(env, "zoo", "pull", "test-org/tiny-llama", "--revision", "main", offline=True,
               endpoint=f"http://127.0.0.1:{free_port()}")  # fmt: skip
    assert done.returncode == 5, done.stderr
    assert "model.safetensors: content does not match the Hub" in done.stderr
    assert "Traceback" not in done.stderr


def test_verified_files_are_not_hashed_again(env, monkeypatch):
    import linnet.hub as hub_module

    monkeypatch.setattr(hub_module, "MARK_VERIFIED_FROM", 0)  # mark every file
    first = pull("tiny-llama", registry=env.registry)
    assert len(list((Path(os.environ["LINNET_CACHE"]) / "verified").iterdir())) == len(first.files)

    def rehash(path):
        raise AssertionError(f"{path} hashed again")

    monkeypatch.setattr(hub_module, "_sha256", rehash)
    monkeypatch.setattr(hub_module, "_git_blob_sha1", rehash)
    assert pull("tiny-llama", registry=env.registry).folder == first.folder


# -- planning before downloading ------------------------------------------------------------


def count_header_bytes(monkeypatch) -> dict[str, int]:
    """Bytes that reach linnet.hub_remote's header reads over the wire, per URL (olah ignores
    Range: only the reader's early stop keeps it from reading a whole file)."""
    import huggingface_hub.utils as hf_utils

    received: dict[str, int] = {}
    real = hf_utils.get_session

    class Counted:
        def __init__(self, response, url):
            self.response, self.url = response, url

        def __getattr__(self, name):
            return getattr(self.response, name)

        def iter_bytes(self):
            for chunk in self.response.iter_bytes():
                received[self.url] = received.get(self.url, 0) + len(chunk)
                yield chunk

    class Session:
        @contextlib.contextmanager
        def stream(self, method, url, **kwargs):
            with real().stream(method, url, **kwargs) as response:
                yield Counted(response, url)

    monkeypatch.setattr(hf_utils, "get_session", Session)
    return received


def test_misfit_repo_fails_before_any_weight_is_downloaded(env, hub, monkeypatch):
    received = count_header_bytes(monkeypatch)
    with pytest.raises(CheckpointError) as err:
        pull("test-org/misfit", registry=env.registry)
    assert err.value.tensor == MISFIT_TENSOR
    assert MISFIT_TENSOR in str(err.value) and "[64, 128]" in str(err.value)
    # The plan read a prefix of the weights (the header), not the file.
    size = hub.hub.lfs_object("test-org/misfit", "model.safetensors").stat().st_size
    assert [u.rsplit("/", 1)[-1] for u in received] == ["model.safetensors"]
    assert 0 < sum(received.values()) < size // 2
    assert hub.misfit_sha not in blobs(env.cache, "test-org/misfit")
    snapshots = env.cache / "models--test-org--misfit" / "snapshots"
    assert not list(snapshots.rglob("*.safetensors"))


def test_sharded_repo_is_planned_from_every_shard(env, hub):
    result = pull("test-org/sharded", registry=env.registry)
    assert len(hub.shards) > 1
    assert set(hub.shards) | {"model.safetensors.index.json"} <= set(result.files)
    assert not result.plan.problems and sum(r.loads for r in result.plan.rows) > len(hub.shards)


def test_pickle_only_repo_is_refused_unopened(env, hub):
    with pytest.raises(PickledCheckpoint, match="only pickled weights"):
        pull("test-org/pickle-only", registry=env.registry)
    assert hub.pickle_sha not in blobs(env.cache, "test-org/pickle-only")


# -- errors ---------------------------------------------------------------------------------


def test_missing_repo(env):
    with pytest.raises(RepoNotFound, match="test-org/nope not found") as err:
        pull("test-org/nope", registry=env.registry)
    assert err.value.exit_code == 3


def test_wrong_revision(env):
    with pytest.raises(RepoNotFound, match="has no revision 'v9'"):
        pull("tiny-llama", revision="v9", registry=env.registry)
    with pytest.raises(RepoNotFound, match="has no revision"):
        pull("tiny-llama", revision="0" * 40, registry=env.registry)


def test_content_that_does_not_match_its_sha256(env):
    with pytest.raises(IntegrityError, match="model.safetensors: content does not match") as err:
        pull("test-org/corrupt", registry=env.registry)
    assert err.value.exit_code == 5
    snapshot = next((env.cache / "models--test-org--corrupt" / "snapshots").iterdir())
    assert not (snapshot / "model.safetensors").exists()  # removed, so nothing uses it


def test_network_failure(env, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(HubUnreachable, match="cannot reach the Hub") as err:
        pull("tiny-llama", registry=env.registry)
    assert err.value.exit_code == 4


def test_lock_pins_unpinned_entries(env, hub, tmp_path):
    path = tmp_path / "revisions.toml"
    path.write_text('# pins\n"test-org/other" = "' + "a" * 40 + '"\n')
    done = lock(registry=env.registry, revisions_file=path)
    assert done == {"tiny-llama-unpinned": hub.v2}
    entries = tmp_path / "entries.toml"
    entries.write_text(
        '[entries.t]\nrepo = "test-org/tiny-llama"\narchitecture = "LlamaForCausalLM"\n'
        'license = "x"\nreference = "transformers.LlamaForCausalLM"\nprompts = ["p"]\n'
    )
    reg = load_registry(entries, path)
    assert reg.get("t").revision == hub.v2 and path.read_text().startswith("# pins\n")


# -- the command line -----------------------------------------------------------------------


def cli(env, *args, offline=False, endpoint=None):
    e = {
        **os.environ,
        "HF_HUB_OFFLINE": "1" if offline else "0",
        "HF_ENDPOINT": endpoint or env.endpoint,
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }
    return subprocess.run(
        [sys.executable, "-m", "linnet.cli", *args], env=e, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def test_cli_pull_then_offline(env, hub):
    first = cli(env, "zoo", "pull", "smollm2-135m-instruct", "--repo", "test-org/tiny-llama",
                "--revision", "main")  # fmt: skip
    assert first.returncode == 0, first.stderr
    assert hub.v2 in first.stdout and "sha256 verified" in first.stdout
    assert "tensors -> LlamaForCausalLM on zoo/llama.linnet" in first.stdout
    again = cli(env, "zoo", "pull", "test-org/tiny-llama", "--revision", "main", offline=True,
                endpoint=f"http://127.0.0.1:{free_port()}")  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "0.0 MB downloaded" in again.stdout and "the Hub was not used" in again.stdout


@pytest.mark.parametrize(
    "args, code, message",
    [
        (("test-org/nope",), 3, "test-org/nope not found"),
        (("test-org/tiny-llama", "--revision", "nobranch"), 3, "has no revision 'nobranch'"),
        (("test-org/misfit",), 1, MISFIT_TENSOR),
        (("test-org/corrupt",), 5, "content does not match the Hub"),
        (("no-such-model",), 1, "is not a zoo entry"),
    ]
    # a planned entry, while the zoo has one (SAM, the last, became ready in issue 15)
    + [((e.name,), 1, "planned, not ready") for e in load_registry().planned()[:1]],
)
def test_cli_pull_errors(env, args, code, message):
    done = cli(env, "zoo", "pull", *args)
    assert done.returncode == code, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


def test_cli_pull_unreachable_hub(env):
    done = cli(
        env, "zoo", "pull", "test-org/tiny-llama", endpoint=f"http://127.0.0.1:{free_port()}"
    )
    assert done.returncode == 4 and "cannot reach the Hub" in done.stderr


def test_cli_run_on_a_pulled_repo_matches_transformers(env, hub):
    """`linnet run ORG/NAME` finds the pulled snapshot (offline) and generates what
    transformers' generate does with the same tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = pull("test-org/tiny-llama", revision="main", registry=env.registry).folder
    prompt = "w5 w17 w99 w3 w42"
    done = cli(env, "run", "test-org/tiny-llama", "--revision", "main", "--prompt", prompt,
               "--max-new-tokens", "12", offline=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    ids = torch.tensor([tok(prompt)["input_ids"]])
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, trust_remote_code=False)
    out = ref.generate(ids, max_new_tokens=12, do_sample=False)
    want = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert done.stdout.strip() == want.strip() and len(want.split()) >= 1
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]


def test_gated_repo_gets_a_message_that_says_what_to_do():
    """Olah cannot gate a repo; the Hub answers GatedRepoError, which the pull maps so."""
    import httpx2
    from huggingface_hub.errors import GatedRepoError

    from linnet.hub import _hub_errors

    request = httpx2.Request("GET", "https://hub.invalid/api/models/org/gated/revision/main")
    response = httpx2.Response(401, request=request)
    with pytest.raises(RepoNotFound, match="org/gated is gated: accept its license") as err:
        with _hub_errors(None, "org/gated", "main", "https://hub.invalid"):
            raise GatedRepoError("gated", response=response)
    assert "HF_TOKEN" in str(err.value) and err.value.exit_code == 3

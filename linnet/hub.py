"""Pull checkpoints from the Hugging Face Hub into the shared HF cache, planned before they land.

    from linnet.hub import pull
    result = pull("smollm2-135m-instruct")      # pinned revision, verified, planned
    result.folder                                # the snapshot folder transformers also finds

Order of work, so that a repo that cannot run fails in seconds:
1. resolve the revision to a commit and list the repo's files (with their LFS sha256);
2. fetch config.json (and the shard index), then only the *headers* of the safetensors files
   (a streamed, ranged GET that stops after the header), and run the weights-map plan: a
   missing, extra or misshapen tensor fails here, naming it, before any weight is fetched;
3. `snapshot_download` of exactly the files Linnet uses (safetensors weights, JSON, tokenizer
   files; never pickles), with progress bars; a second pull downloads nothing;
4. check every file against the hash the Hub gave for it (the sha256 of LFS files, the git
   blob sha1 of the others) before it is used.

With HF_HUB_OFFLINE=1 (or when the Hub cannot be reached) the same pull is answered from the
cache, still planned and verified. Errors: `RepoNotFound` (missing, private or gated repo, or
a wrong revision: exit 3), `HubUnreachable` (exit 4), `IntegrityError` (exit 5), and the
plan's `CheckpointError` (exit 1).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from linnet.errors import CheckpointError, LinnetError
from linnet.hub_files import RepoScope
from linnet.hub_files import blob_sizes as _blob_sizes
from linnet.hub_files import read_json as _read_json
from linnet.hub_remote import (  # noqa: F401  (hub_remote's names, as linnet.hub had them)
    HEADER_PROBE,
    TOKENIZER_FILES,
    VARIANT_OF_DTYPE,
    RemoteCheckpoint,
    RemoteFile,
    _remote_files,
    index_file,
    plan_for,
    remote_header,
    wanted_files,
    weight_files,
)
from linnet.weights.safetensors_io import Checkpoint, TensorInfo
from linnet.zoo import registry as zoo_registry  # the hub uses the zoo, never the reverse

#: Files at least this large are hashed once; a marker remembers the result.
MARK_VERIFIED_FROM = 16 << 20


class HubError(LinnetError):
    exit_code = 1


class RepoNotFound(HubError):
    """Missing, private or gated repo, or a revision the repo does not have."""

    exit_code = 3


class HubUnreachable(HubError):
    """No connection to the Hub (or offline mode) and nothing usable in the cache."""

    exit_code = 4


class IntegrityError(HubError):
    """A downloaded file does not match the hash the Hub gave for it."""

    exit_code = 5


class UnpinnedRevision(UserWarning):
    """A zoo entry without a pinned commit was pulled from its default branch."""


@dataclass
class PullResult:
    folder: Path
    repo: str
    revision: str  # as asked: a branch, tag or commit
    commit: str
    files: list[str]
    downloaded: int  # bytes that were not in the cache before
    seconds: float
    plan: object = field(repr=False, default=None)
    entry: object = field(repr=False, default=None)
    offline: bool = False


# -- where things are ---------------------------------------------------------------------


def _constants():
    from huggingface_hub import constants

    return constants


def hub_cache(cache_dir: str | os.PathLike | None = None) -> Path:
    return Path(cache_dir or os.environ.get("HF_HUB_CACHE") or _constants().HF_HUB_CACHE)


def _endpoint(endpoint: str | None) -> str:
    return (endpoint or os.environ.get("HF_ENDPOINT") or _constants().ENDPOINT).rstrip("/")


def _offline() -> bool:
    return _constants().is_offline_mode()  # HF_HUB_OFFLINE, as huggingface_hub read it


def _storage(cache: Path, repo: str) -> Path:
    from huggingface_hub.file_download import repo_folder_name

    return cache / repo_folder_name(repo_id=repo, repo_type="model")


def linnet_cache() -> Path:
    env = os.environ.get("LINNET_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "linnet"


# -- errors -------------------------------------------------------------------------------


def _network_errors() -> tuple[type[BaseException], ...]:
    import httpx2
    from huggingface_hub.errors import OfflineModeIsEnabled

    return (httpx2.TransportError, OfflineModeIsEnabled)


def _status(err: BaseException) -> int | None:
    response = getattr(err, "response", None)
    return getattr(response, "status_code", None)


@contextlib.contextmanager
def _hub_errors(api, repo: str, revision: str, endpoint: str):
    """Turn huggingface_hub's exceptions into Linnet's, with what to do about them.

    The Hub (and olah) answer 401 "repository not found" for missing, private and gated repos
    and often for a revision the repo lacks: a second look at the default branch tells a
    missing repo from a wrong revision."""
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError

    try:
        yield
    except _network_errors() as e:
        raise HubUnreachable(
            f"cannot reach the Hub at {endpoint} ({type(e).__name__}: {e}); check the "
            "connection or HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to use what is cached"
        ) from e
    except GatedRepoError as e:
        raise RepoNotFound(
            f"{repo} is gated: accept its license at {endpoint}/{repo} with your account, "
            "then set HF_TOKEN (or run `hf auth login`)"
        ) from e
    except HfHubHTTPError as e:
        status = _status(e)
        if revision != "main" and _exists(api, repo, "main"):
            raise RepoNotFound(
                f"{repo} has no revision {revision!r} (the repo exists; check the branch, "
                "tag or commit hash)"
            ) from e
        if status is not None and status >= 500:
            raise HubUnreachable(f"the Hub at {endpoint} failed (HTTP {status}): {e}") from e
        raise RepoNotFound(
            f"{repo} not found at {endpoint} (HTTP {status}): the repo does not exist, or it "
            "is private or gated (set HF_TOKEN to a token that can read it)"
        ) from e


def _exists(api, repo: str, revision: str) -> bool:
    """Whether `repo` has `revision`. Tried twice: after a 5xx, a server may drop the
    connection the next request would reuse (olah does)."""
    for _ in range(2):
        try:
            api.repo_info(repo, revision=revision)
            return True
        except _network_errors():
            continue
        except Exception:
            return False
    return False


# -- verification -------------------------------------------------------------------------


def _git_blob_sha1(path: Path) -> str:
    h = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _marker(blob: Path) -> tuple[Path, str]:
    st = blob.stat()
    key = hashlib.sha1(str(blob).encode()).hexdigest()
    return linnet_cache() / "verified" / key, f"{blob}\t{st.st_size}\t{st.st_mtime_ns}\n"


def _expected(etag: str, remote: RemoteFile | None) -> tuple[str, str] | None:
    """(kind, hash) a cached file must have: from the Hub's listing when known, else from
    the blob's name (the etag the Hub served: sha256 for LFS files, git sha1 for others)."""
    if remote is not None:
        return ("sha256", remote.sha256) if remote.sha256 else ("git", remote.blob_id)
    if len(etag) in (40, 64):
        return ("sha256" if len(etag) == 64 else "git", etag)
    return None  # a hand-placed file: no hash to hold it to


def verify_file(snapshot: Path, name: str, remote: RemoteFile | None) -> None:
    """Check one cached file against the Hub's hash; a mismatch removes it from the cache."""
    link = snapshot / name
    blob = link.resolve()
    want = _expected(blob.name, remote)
    if want is None:
        return
    size = blob.stat().st_size
    marker, stamp = _marker(blob) if size >= MARK_VERIFIED_FROM else (None, "")
    if marker is not None and marker.is_file() and marker.read_text() == stamp:
        return
    kind, expected = want
    got = _sha256(blob) if kind == "sha256" else _git_blob_sha1(blob)
    if got != expected:
        _reject(link, blob, f"{kind} {got}, but the Hub's is {expected}")
    if marker is not None:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(stamp)


def _reject(link: Path, blob: Path, why: str) -> None:
    for p in (link, blob):
        with contextlib.suppress(OSError):
            p.unlink()
    raise IntegrityError(
        f"{link.name}: content does not match the Hub: {why}; removed it from the cache "
        "(pull again to fetch it anew)"
    )


# -- pull ---------------------------------------------------------------------------------


def _resolve_entry(name: str, registry):
    """(entry or None, repo) for a zoo name or alias, or an HF repo id."""
    if registry is None:
        registry = zoo_registry.registry()
    if name in registry:
        entry = registry.get(name)
        if not entry.ready:
            raise HubError(
                f"{entry.name} is planned, not ready: Linnet has no source for "
                f"{entry.architecture} yet ({entry.needs})"
            )
        return entry, entry.repo
    if "/" in name:
        return registry.by_repo(name), name
    registry.get(name)  # raises UnknownEntry with suggestions
    raise AssertionError("unreachable")


def _revision(entry, repo: str, revision: str | None) -> str:
    """The revision asked for, else the entry's pin, else the default branch (warned)."""
    if revision is None and entry is not None and repo == entry.repo:
        revision = entry.revision
    if revision is None:
        if entry is not None:
            warnings.warn(
                UnpinnedRevision(
                    f"{entry.name} has no pinned revision: pulling {repo} at its default branch "
                    "(run `linnet zoo lock` to pin it)"
                ),
                stacklevel=3,
            )
        revision = "main"
    return revision


def pull(
    name: str,
    *,
    revision: str | None = None,
    repo: str | None = None,
    dtype: str | None = None,
    endpoint: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
    registry=None,
) -> PullResult:
    """Pull a zoo entry (or an HF repo id) at its pinned revision into the HF cache.

    revision: a branch, tag or commit instead of the entry's pin; repo: another repo (a
    mirror or fork) for the entry; dtype: the dtype the plan checks for (default the
    checkpoint's); endpoint: the Hub (default HF_ENDPOINT); cache_dir: default HF_HUB_CACHE.
    """
    t0 = time.perf_counter()
    entry, default_repo = _resolve_entry(name, registry)
    repo = repo or default_repo
    revision = _revision(entry, repo, revision)
    endpoint = _endpoint(endpoint)
    cache = hub_cache(cache_dir)
    storage = _storage(cache, repo)
    before = _blob_sizes(storage)
    scope = RepoScope(entry.subfolder if entry is not None else None)  # e.g. a pipeline's unet/
    ask = dict(
        repo=repo, revision=revision, dtype=dtype, endpoint=endpoint, cache=cache, scope=scope
    )
    ask["variant"] = VARIANT_OF_DTYPE.get(dtype or "")  # f16: a diffusers .fp16. file, if any

    offline = _offline()
    if offline:
        folder, commit, files, plan = _pull_cached(**ask)
    else:
        try:
            folder, commit, files, plan = _pull_online(**ask, token=token)
        except HubUnreachable as err:
            try:
                folder, commit, files, plan = _pull_cached(**ask)
            except HubUnreachable:
                raise err from None
            offline = True
    after = _blob_sizes(storage)
    downloaded = sum(size for blob, size in after.items() if blob not in before)
    return PullResult(
        folder=folder,
        repo=repo,
        revision=revision,
        commit=commit,
        files=files,
        downloaded=downloaded,
        seconds=time.perf_counter() - t0,
        plan=plan,
        entry=entry,
        offline=offline,
    )


def _pull_online(*, repo, revision, dtype, endpoint, cache, scope, token, variant=None):
    from huggingface_hub import HfApi, hf_hub_download, hf_hub_url, snapshot_download
    from huggingface_hub.utils import build_hf_headers

    api = HfApi(endpoint=endpoint, token=token)
    with _hub_errors(api, repo, revision, endpoint):
        commit = api.repo_info(repo, revision=revision).sha
        listing = _remote_files(api.list_repo_tree(repo, revision=commit, recursive=True))
    label = f"{repo}@{commit[:12]}"
    remote = scope.files(listing, label)  # named within the checkpoint folder

    def fetch(filename: str) -> Path:
        with _hub_errors(api, repo, revision, endpoint):
            return Path(
                hf_hub_download(
                    repo, scope.path(filename), revision=commit, cache_dir=cache,
                    endpoint=endpoint, token=token,
                )
            )  # fmt: skip

    if "config.json" not in remote:
        raise CheckpointError(f"{label}: no {scope.path('config.json')}", file="config.json")
    config = _read_json(fetch("config.json"), f"{repo}/{scope.path('config.json')}")
    shards = index_file(remote, variant)
    index = _read_json(fetch(shards), f"{repo}/{scope.path(shards)}") if shards else None
    files = wanted_files(set(remote), index, variant)
    weights = weight_files(set(remote), index, variant)

    # The plan, from the headers alone, before any weight is downloaded.
    snapshot = scope.folder(_storage(cache, repo) / "snapshots" / commit)
    if all((snapshot / w).is_file() for w in weights):
        plan = plan_for(Checkpoint(snapshot), dtype)
    else:
        auth = build_hf_headers(token=token)
        headers: dict[str, TensorInfo] = {}
        with _hub_errors(api, repo, revision, endpoint):
            for w in weights:
                url = hf_hub_url(repo, scope.path(w), revision=commit, endpoint=endpoint)
                got = remote_header(url, auth, w, remote[w].size)
                if index is not None:
                    got = {k: v for k, v in got.items() if index["weight_map"].get(k) == w}
                headers.update(got)
        plan = plan_for(RemoteCheckpoint(label, config, headers, weights), dtype)
    plan.check()

    with _hub_errors(api, repo, revision, endpoint):
        downloaded = snapshot_download(
            repo, revision=commit, allow_patterns=[scope.path(f) for f in files],
            cache_dir=cache, endpoint=endpoint, token=token,
        )  # fmt: skip
    folder = scope.folder(Path(downloaded))
    for f in files:
        verify_file(folder, f, remote.get(f))
    # Remember what the branch or tag pointed at, as hf_hub_download does, so that an
    # offline pull of the same revision finds this snapshot.
    from huggingface_hub.file_download import _cache_commit_hash_for_specific_revision

    _cache_commit_hash_for_specific_revision(str(_storage(cache, repo)), revision, commit)
    return folder, commit, files, plan_for(Checkpoint(folder), dtype).check()


def _pull_cached(*, repo, revision, dtype, endpoint, cache, scope, variant=None):
    """The same pull from the cache alone: the snapshot must hold every file a pull fetches."""
    storage = _storage(cache, repo)
    commit = revision
    ref = storage / "refs" / revision
    if ref.is_file():
        commit = ref.read_text().strip()
    snapshot = storage / "snapshots" / commit
    if not snapshot.is_dir():
        raise HubUnreachable(
            f"{repo} at {revision} is not in the HF cache ({cache}) and the Hub is not used "
            "(HF_HUB_OFFLINE is set or the Hub is unreachable): pull it once with the Hub reachable"
        )
    # The listing snapshot_download cached (get_cached_repo_tree drops its LFS hashes).
    from huggingface_hub._tree_cache import read_tree_cache

    listing = read_tree_cache(str(storage), commit) or {}
    everything = {
        path: RemoteFile(path, t.lfs_size or t.size, t.lfs_sha256, t.blob_id)
        for path, t in listing.items()
    } or {str(p.relative_to(snapshot)): None for p in snapshot.rglob("*") if not p.is_dir()}
    remote = scope.files(everything, f"{repo}@{commit[:12]} (cached)")
    folder = scope.folder(snapshot)
    shards = index_file(remote, variant)
    index = _read_json(folder / shards, scope.path(shards)) if shards else None
    files = wanted_files(set(remote), index, variant)
    missing = [scope.path(f) for f in files if not (folder / f).exists()]
    if missing:
        raise HubUnreachable(
            f"{repo} at {revision}: the cached snapshot lacks {', '.join(missing[:3])} and the "
            "Hub is not used: pull it again with the Hub reachable"
        )
    for f in files:
        verify_file(folder, f, remote.get(f))
    return folder, commit, files, plan_for(Checkpoint(folder), dtype).check()


# -- lock ---------------------------------------------------------------------------------


def lock(
    names=None,
    *,
    endpoint: str | None = None,
    token: str | bool | None = None,
    registry=None,
    revisions_file: Path | None = None,
) -> dict[str, str]:
    """Resolve the default branch of every unpinned entry (or those named) to a commit and
    record it in revisions.toml. Returns {entry name: commit}."""
    from huggingface_hub import HfApi

    zoo = zoo_registry
    reg = registry or zoo.registry()
    path = revisions_file or zoo.REVISIONS_FILE
    endpoint = _endpoint(endpoint)
    api = HfApi(endpoint=endpoint, token=token)
    chosen = [reg.get(n) for n in names] if names else [e for e in reg if not e.pinned]
    done = {}
    for entry in chosen:
        with _hub_errors(api, entry.repo, "main", endpoint):
            commit = api.repo_info(entry.repo, revision="main").sha
        zoo.write_revision(entry.repo, commit, path)
        done[entry.name] = commit
    if reg is zoo.registry():
        zoo.registry.cache_clear()
    return done


from linnet.hub_push import push  # noqa: E402, F401  (push to the Hub: linnet/hub_push.py)

"""A real local Hugging Face Hub for the pull tests: olah serving git repos with git-lfs.

    hub = LocalHub(tmp_dir)
    commit = hub.commit("test-org/tiny", {"config.json": path, "model.safetensors": path})
    hub.start()              # olah-cli on 127.0.0.1 and a free port, offline upstream
    hub.endpoint             # http://127.0.0.1:PORT, for HF_ENDPOINT or endpoint=
    hub.requests()           # the access log: what was served
    hub.stop()

Each repo is an ordinary git work tree under mirrors/models/<org>/<name>; safetensors and
pickles are LFS objects in .git/lfs/objects, so the Hub API reports their sha256 as it does
for real repos. The upstream is a dead port: nothing can reach the internet
(docs/zoo.md says how the pull tests use it).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

READY_REPO = "linnet-test/ready"
LFS_PATTERNS = ("*.safetensors", "*.bin")


def missing_tools() -> list[str]:
    """What the local Hub needs and this machine lacks (scripts/setup.sh installs both)."""
    missing = []
    if not _olah_cli():
        missing.append("olah (pip install olah)")
    lfs = subprocess.run(["git", "lfs", "version"], capture_output=True)
    if lfs.returncode != 0:
        missing.append("git-lfs (apt-get install git-lfs)")
    return missing


def _olah_cli() -> str | None:
    beside = Path(sys.executable).with_name("olah-cli")
    return str(beside) if beside.exists() else shutil.which("olah-cli")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "linnet-tests",
        "GIT_AUTHOR_EMAIL": "tests@linnet.invalid",
        "GIT_COMMITTER_NAME": "linnet-tests",
        "GIT_COMMITTER_EMAIL": "tests@linnet.invalid",
    }
    done = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} in {repo}: {done.stderr.strip()}")
    return done.stdout.strip()


class LocalHub:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.mirrors = self.root / "mirrors"
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log = self.root / "olah.out"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def repo_dir(self, repo_id: str) -> Path:
        return self.mirrors / "models" / repo_id

    # -- repos ------------------------------------------------------------------------------

    def commit(self, repo_id: str, files: dict[str, Path | bytes], message: str = "update") -> str:
        """Write `files` (name -> source path or bytes) into the repo, commit, return the sha.
        The first commit creates the repo, with LFS tracking of safetensors and pickles."""
        repo = self.repo_dir(repo_id)
        if not (repo / ".git").is_dir():
            repo.mkdir(parents=True, exist_ok=True)
            _git(repo, "init", "-q", "-b", "main")
            _git(repo, "lfs", "install", "--local")
            _git(repo, "lfs", "track", *LFS_PATTERNS)
        for name, content in files.items():
            target = repo / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                target.write_bytes(content)
            else:
                shutil.copyfile(content, target)
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", message)
        return _git(repo, "rev-parse", "HEAD")

    def lfs_object(self, repo_id: str, name: str) -> Path:
        """The LFS object that olah serves for `name` at the repo's HEAD."""
        repo = self.repo_dir(repo_id)
        oid = None
        for line in _git(repo, "lfs", "ls-files", "-l").splitlines():
            parts = line.split()
            if parts[-1] == name:
                oid = parts[0]
        if oid is None:
            raise KeyError(f"{name} is not an LFS file of {repo_id}")
        return repo / ".git" / "lfs" / "objects" / oid[:2] / oid[2:4] / oid

    # -- server -----------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> None:
        if not self.repo_dir(READY_REPO).is_dir():
            self.commit(READY_REPO, {"README.md": b"readiness probe\n"})
        config = self.root / "olah.toml"
        config.write_text(
            "[basic]\n"
            'host = "127.0.0.1"\n'
            f"port = {self.port}\n"
            f'repos-path = "{self.root / "olah-cache"}"\n'
            f'mirrors-path = ["{self.mirrors}"]\n'
            f'mirror-netloc = "127.0.0.1:{self.port}"\n'
            f'mirror-lfs-netloc = "127.0.0.1:{self.port}"\n'
            'hf-scheme = "http"\n'
            'hf-netloc = "127.0.0.1:9"\n'  # a dead upstream: nothing leaks to the internet
            'hf-lfs-netloc = "127.0.0.1:9"\n'
            "[accessibility]\n"
            "offline = true\n"  # required: without it olah answers 504 to everything
        )
        (self.root / "logs").mkdir(exist_ok=True)
        out = open(self.log, "ab")  # noqa: SIM115 (kept open for the server's life)
        self.proc = subprocess.Popen(
            [_olah_cli(), "-c", str(config), "--log-path", str(self.root / "logs")],
            cwd=self.root,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        out.close()
        probe = f"{self.endpoint}/api/models/{READY_REPO}/revision/main"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"olah exited with {self.proc.returncode}: {self.tail()}")
            try:
                with urllib.request.urlopen(probe, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"olah did not answer {probe} within {timeout} s: {self.tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def tail(self, n: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

    def requests(self) -> list[str]:
        """Access-log lines ("GET /org/name/resolve/... HTTP/1.1" 200) served so far."""
        if not self.log.exists():
            return []
        return [ln for ln in self.log.read_text(errors="replace").splitlines() if '"GET ' in ln]


def online_against(endpoint: str, tmp_path: Path, monkeypatch) -> Path:
    """Point huggingface_hub and Linnet at the local Hub `endpoint`, online (conftest sets
    HF_HUB_OFFLINE), with a fresh HF cache and Linnet cache under `tmp_path`; the HF cache."""
    from huggingface_hub import constants

    cache = tmp_path / "hf"
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    for k, v in {
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_DISABLE_XET": "1",
        "HF_ENDPOINT": endpoint,
        "HF_HUB_CACHE": str(cache),
        "LINNET_CACHE": str(tmp_path / "linnet"),
    }.items():
        monkeypatch.setenv(k, v)
    return cache


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()

"""A local HTTP endpoint (127.0.0.1) speaking the upload protocol huggingface_hub uses.

    with serve() as hub:                  # hub.url: "http://127.0.0.1:PORT"
        ... run `linnet push` with HF_ENDPOINT=hub.url and HF_HUB_DISABLE_XET=1 ...
        hub.files["org/name"]["README.md"]   # the bytes committed under that path
        hub.calls                             # (method, path) of every request

The calls `create_repo` + `upload_folder` make, without Xet:
  POST /api/repos/create                           -> {"url"}
  POST /api/validate-yaml                          -> {"errors": [], "warnings": []}
  POST /api/models/ORG/NAME/preupload/REV          -> uploadMode per file (lfs: weights)
  POST /ORG/NAME.git/info/lfs/objects/batch        -> an upload href per object
  PUT  /lfs/OID                                    <- the object's bytes (sha256 checked)
  POST /api/models/ORG/NAME/commit/REV (ndjson)    -> {"commitUrl", "commitOid"}
Anything else answers 404 and is recorded in `unknown` (tests fail if it is not empty:
the stand-in is only as good as the protocol it implements). What was committed reads back
as the Hub serves it:
  GET  /ORG/NAME/resolve/REV/PATH                  -> the file's bytes (404: never committed)
Run it alone with `python tests/upload_server.py [PORT]`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import sys
import threading
import urllib.parse
import urllib.request
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LFS_SUFFIXES = (".safetensors", ".gguf", ".onnx", ".bin", ".onnx_data")
LFS_MIN_BYTES = 1 << 20


class Hub:
    def __init__(self) -> None:
        self.url = ""
        self.repos: dict[str, dict] = {}  # repo -> create_repo body
        self.files: dict[str, dict[str, bytes]] = {}  # repo -> path -> bytes
        self.lfs: dict[str, bytes] = {}  # oid -> bytes
        self.commits: list[dict] = []  # {"repo", "header", "paths"}
        self.calls: list[tuple[str, str]] = []
        self.unknown: list[tuple[str, str]] = []
        self.lock = threading.Lock()


def _upload_mode(f: dict) -> str:
    return "lfs" if f["path"].endswith(LFS_SUFFIXES) or f["size"] >= LFS_MIN_BYTES else "regular"


class Handler(BaseHTTPRequestHandler):
    """One request; `hub` is set on a subclass per server (see `_handler`)."""

    protocol_version = "HTTP/1.1"
    hub: Hub

    def log_message(self, *args) -> None:  # quiet
        pass

    def _body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _reply(self, status: int, payload=None, ctype="application/json") -> None:
        raw = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _unknown(self) -> None:
        self.hub.unknown.append((self.command, self.path))
        self._reply(404, {"error": f"not implemented: {self.command} {self.path}"})

    def __getattr__(self, name: str):
        if name.startswith("do_"):  # HEAD, DELETE, ...: a method the stand-in does not speak
            return self._unknown_method
        raise AttributeError(name)

    def _unknown_method(self) -> None:
        self.hub.calls.append((self.command, self.path))
        self.hub.unknown.append((self.command, self.path))
        self.close_connection = True  # no body for HEAD: end the exchange here
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        self.hub.calls.append(("GET", self.path))
        self._body()
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", self.path.split("?")[0])
        if not m:
            return self._unknown()
        repo, _revision, path = m.groups()  # one branch: every revision is the last commit
        with self.hub.lock:
            data = self.hub.files.get(repo, {}).get(urllib.parse.unquote(path))
        if data is None:
            return self._reply(404, {"error": f"{repo} has no {path}"})
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:
        self.hub.calls.append(("PUT", self.path))
        body = self._body()
        m = re.fullmatch(r"/lfs/([0-9a-f]{64})", self.path)
        if not m:
            return self._unknown()
        if hashlib.sha256(body).hexdigest() != m.group(1):
            return self._reply(400, {"error": "sha256 mismatch"})
        with self.hub.lock:
            self.hub.lfs[m.group(1)] = body
        self._reply(200, {})

    def do_POST(self) -> None:
        self.hub.calls.append(("POST", self.path))
        body = self._body()
        path = self.path.split("?")[0]
        for pattern, name in POST_ROUTES:
            m = re.fullmatch(pattern, path)
            if m:
                return getattr(self, name)(body, *m.groups())
        self._unknown()

    def _create(self, body: bytes) -> None:
        req = json.loads(body)
        repo = f"{req.get('organization') or 'user'}/{req['name']}"
        with self.hub.lock:
            self.hub.repos.setdefault(repo, req)
            self.hub.files.setdefault(repo, {})
        self._reply(200, {"url": f"{self.hub.url}/{repo}"})

    def _validate_yaml(self, body: bytes) -> None:
        self._reply(200, {"errors": [], "warnings": []})

    def _preupload(self, body: bytes, repo: str, revision: str) -> None:
        files = json.loads(body)["files"]
        out = [
            {"path": f["path"], "uploadMode": _upload_mode(f), "shouldIgnore": False, "oid": None}
            for f in files
        ]
        self._reply(200, {"files": out})

    def _lfs_batch(self, body: bytes, repo: str) -> None:
        objects = []
        for o in json.loads(body)["objects"]:
            entry = {"oid": o["oid"], "size": o["size"]}
            if o["oid"] not in self.hub.lfs:
                entry["actions"] = {"upload": {"href": f"{self.hub.url}/lfs/{o['oid']}"}}
            objects.append(entry)
        payload = {"transfer": "basic", "objects": objects}
        self._reply(200, payload, "application/vnd.git-lfs+json")

    def _commit(self, body: bytes, repo: str, revision: str) -> None:
        header, paths = {}, []
        with self.hub.lock:
            files = self.hub.files.setdefault(repo, {})
            for line in body.decode().splitlines():
                if not line.strip():
                    continue
                item = json.loads(line)
                key, value = item["key"], item["value"]
                if key == "header":
                    header = value
                elif key == "lfsFile" and value["oid"] not in self.hub.lfs:
                    return self._reply(422, {"error": f"unknown LFS object {value}"})
                elif key in ("file", "lfsFile"):
                    files[value["path"]] = self._content(key, value)
                    paths.append(value["path"])
                elif key in ("deletedFile", "deletedFolder"):
                    files.pop(value["path"], None)
            oid = hashlib.sha1(body).hexdigest()
            self.hub.commits.append({"repo": repo, "header": header, "paths": paths})
        url = f"{self.hub.url}/{repo}/commit/{oid}"
        self._reply(200, {"commitUrl": url, "commitOid": oid, "pullRequestUrl": None})

    def _content(self, key: str, value: dict) -> bytes:
        if key == "file":
            return base64.b64decode(value["content"])
        return self.hub.lfs[value["oid"]]


# POST paths and the Handler method that answers each (the path's groups are its arguments).
POST_ROUTES = (
    (r"/api/repos/create", "_create"),
    (r"/api/validate-yaml", "_validate_yaml"),
    (r"/api/models/([^/]+/[^/]+)/preupload/([^/]+)", "_preupload"),
    (r"/([^/]+/[^/]+)\.git/info/lfs/objects/batch", "_lfs_batch"),
    (r"/api/models/([^/]+/[^/]+)/commit/([^/]+)", "_commit"),
)


def read_back(hub: Hub, repo: str, path: str, revision: str = "main") -> bytes:
    """A committed file, fetched over HTTP as a pull would fetch it."""
    quoted = urllib.parse.quote(path)
    with urllib.request.urlopen(f"{hub.url}/{repo}/resolve/{revision}/{quoted}", timeout=30) as r:
        return r.read()


def _handler(hub: Hub) -> type[Handler]:
    return type("BoundHandler", (Handler,), {"hub": hub})


@contextmanager
def serve(port: int = 0):
    hub = Hub()
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(hub))
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


if __name__ == "__main__":
    with serve(int(sys.argv[1]) if len(sys.argv) > 1 else 0) as h:
        print(h.url, flush=True)
        threading.Event().wait()

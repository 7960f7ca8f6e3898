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
Anything else answers 404 and is recorded in `unknown`. Run it alone with
`python tests/upload_server.py [PORT]`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import sys
import threading
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


def _handler(hub: Hub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

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
            hub.unknown.append((self.command, self.path))
            self._reply(404, {"error": f"not implemented: {self.command} {self.path}"})

        def do_GET(self) -> None:
            hub.calls.append(("GET", self.path))
            self._body()
            self._unknown()

        def do_PUT(self) -> None:
            hub.calls.append(("PUT", self.path))
            body = self._body()
            m = re.fullmatch(r"/lfs/([0-9a-f]{64})", self.path)
            if not m:
                return self._unknown()
            if hashlib.sha256(body).hexdigest() != m.group(1):
                return self._reply(400, {"error": "sha256 mismatch"})
            with hub.lock:
                hub.lfs[m.group(1)] = body
            self._reply(200, {})

        def do_POST(self) -> None:
            hub.calls.append(("POST", self.path))
            body = self._body()
            path = self.path.split("?")[0]
            if path == "/api/repos/create":
                req = json.loads(body)
                org = req.get("organization") or "user"
                repo = f"{org}/{req['name']}"
                with hub.lock:
                    hub.repos.setdefault(repo, req)
                    hub.files.setdefault(repo, {})
                return self._reply(200, {"url": f"{hub.url}/{repo}"})
            if path == "/api/validate-yaml":
                return self._reply(200, {"errors": [], "warnings": []})
            m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/preupload/([^/]+)", path)
            if m:
                files = json.loads(body)["files"]
                out = [
                    {
                        "path": f["path"],
                        "uploadMode": "lfs"
                        if f["path"].endswith(LFS_SUFFIXES) or f["size"] >= LFS_MIN_BYTES
                        else "regular",
                        "shouldIgnore": False,
                        "oid": None,
                    }
                    for f in files
                ]
                return self._reply(200, {"files": out})
            m = re.fullmatch(r"/([^/]+/[^/]+)\.git/info/lfs/objects/batch", path)
            if m:
                req = json.loads(body)
                objects = []
                for o in req["objects"]:
                    entry = {"oid": o["oid"], "size": o["size"]}
                    if o["oid"] not in hub.lfs:
                        entry["actions"] = {"upload": {"href": f"{hub.url}/lfs/{o['oid']}"}}
                    objects.append(entry)
                return self._reply(
                    200, {"transfer": "basic", "objects": objects}, "application/vnd.git-lfs+json"
                )
            m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/commit/([^/]+)", path)
            if m:
                return self._commit(m.group(1), body)
            self._unknown()

        def _commit(self, repo: str, body: bytes) -> None:
            header, paths = {}, []
            with hub.lock:
                files = hub.files.setdefault(repo, {})
                for line in body.decode().splitlines():
                    if not line.strip():
                        continue
                    item = json.loads(line)
                    key, value = item["key"], item["value"]
                    if key == "header":
                        header = value
                    elif key == "file":
                        files[value["path"]] = base64.b64decode(value["content"])
                        paths.append(value["path"])
                    elif key == "lfsFile":
                        if value["oid"] not in hub.lfs:
                            return self._reply(422, {"error": f"unknown LFS object {value}"})
                        files[value["path"]] = hub.lfs[value["oid"]]
                        paths.append(value["path"])
                    elif key in ("deletedFile", "deletedFolder"):
                        files.pop(value["path"], None)
                oid = hashlib.sha1(body).hexdigest()
                hub.commits.append({"repo": repo, "header": header, "paths": paths})
            self._reply(
                200,
                {
                    "commitUrl": f"{hub.url}/{repo}/commit/{oid}",
                    "commitOid": oid,
                    "pullRequestUrl": None,
                },
            )

    return Handler


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

"""A small DevTools-protocol client for headless Chromium: open a page, collect its console
errors, evaluate an expression, take a screenshot.

    with Browser.start() as browser:
        result = browser.visit("file:///.../index.html")   # errors, and the page's facts
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import websocket

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
    "--disable-extensions", "--remote-allow-origins=*", "--window-size=1280,1000",
]  # fmt: skip


def chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)


class Browser:
    def __init__(self, proc: subprocess.Popen, profile: tempfile.TemporaryDirectory, ws):
        self.proc, self.profile, self.ws = proc, profile, ws
        self.next_id = 0
        self.events: list[dict] = []

    @classmethod
    def start(cls, binary: str, extra: tuple[str, ...] = ()) -> Browser:
        profile = tempfile.TemporaryDirectory(prefix="linnet-chromium-")
        args = [binary, *FLAGS, *extra, f"--user-data-dir={profile.name}"]
        proc = subprocess.Popen(
            [*args, "--remote-debugging-port=0", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its helper processes share its group: close() ends all
        )
        port = cls._port(Path(profile.name) / "DevToolsActivePort", proc)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as r:
            page = next(t for t in json.load(r) if t["type"] == "page")
        ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60)
        browser = cls(proc, profile, ws)
        for domain in ("Page", "Runtime", "Log"):
            browser.call(f"{domain}.enable")
        return browser

    @staticmethod
    def _port(path: Path, proc: subprocess.Popen) -> int:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if path.is_file() and path.read_text().strip():
                return int(path.read_text().split()[0])
            if proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {proc.returncode} before listening")
            time.sleep(0.1)
        raise RuntimeError("chromium did not open its DevTools port within 60 s")

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """End chromium and every helper of its group, then remove its profile. A helper
        still writing into the profile after the main process exited made the removal fail
        once ("Directory not empty: 'Default'", 2026-12-03): the group is killed, and the
        removal retried for up to 5 s."""
        self.ws.close()
        self.proc.terminate()
        self.proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for _ in range(49):
            try:
                self.profile.cleanup()
                return
            except OSError:
                time.sleep(0.1)
        self.profile.cleanup()

    def call(self, method: str, **params) -> dict:
        """Send one command and wait for its answer; events meanwhile are kept."""
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_for(self, method: str) -> dict:
        for i, event in enumerate(self.events):
            if event.get("method") == method:
                return self.events.pop(i)
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("method") == method:
                return msg
            self.events.append(msg)

    def open(self, url: str) -> list[str]:
        """Load `url`; returns the console errors, exceptions and failed loads it caused."""
        self.events.clear()
        self.call("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")
        self.evaluate("1")  # let pending console and log events arrive
        return errors(self.events)

    def html(self, url: str) -> str:
        """The DOM of `url` after load, read through the DOM domain (no script runs)."""
        self.call("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")
        root = self.call("DOM.getDocument", depth=-1)["root"]
        return self.call("DOM.getOuterHTML", nodeId=root["nodeId"])["outerHTML"]

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:60]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self) -> bytes:
        return base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])


def errors(events: list[dict]) -> list[str]:
    out = []
    for e in events:
        method, p = e.get("method"), e.get("params", {})
        if method == "Runtime.exceptionThrown":
            out.append(f"exception: {p['exceptionDetails'].get('text')}")
        elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append(f"console.{p['type']}: {[a.get('value') for a in p.get('args', [])]}")
        elif method == "Log.entryAdded" and p["entry"].get("level") == "error":
            out.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
    return out

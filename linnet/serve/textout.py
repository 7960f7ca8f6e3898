"""A request's generated text as its client may see it, token by token.

The text is always decoded from all the tokens so far (a token's text can depend on its
neighbours); it ends before the first stop string; and text is released only once it can no
longer change: not while its end could be the start of a stop string, nor while it ends in
an unfinished UTF-8 character (U+FFFD), nor while decoding rewrote text already released."""

from __future__ import annotations

from collections.abc import Callable


class TextOut:
    def __init__(self, decode: Callable[[list[int]], str], stops: list[str]):
        self.decode = decode
        self.stops = stops
        self.ids: list[int] = []
        self.text = ""  # the whole text so far, cut before a stop string once one appears
        self.sent = ""  # what was released
        self.stopped = False

    def add(self, token: int) -> str:
        """Take one generated token; return the text it releases (maybe empty)."""
        self.ids.append(token)
        text = self.decode(self.ids)
        cut = self._first_stop(text)
        if cut is not None:
            self.text, self.stopped = text[:cut], True
            return self.flush()
        self.text = text
        safe = len(text) - self._held(text)
        return self._release(text[:safe])

    def flush(self) -> str:
        """Release all that is left (the request is over)."""
        rest = self.text[len(self.sent) :] if self.text.startswith(self.sent) else ""
        self.sent = self.text
        return rest

    def _release(self, ready: str) -> str:
        if not ready.startswith(self.sent) or len(ready) <= len(self.sent):
            return ""
        new = ready[len(self.sent) :]
        self.sent = ready
        return new

    def _first_stop(self, text: str) -> int | None:
        found = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        return min(found) if found else None

    def _held(self, text: str) -> int:
        """Characters at the end that must wait: a possible start of a stop string, or an
        unfinished character."""
        held = len(text) - len(text.rstrip("\ufffd"))
        tail = text[: len(text) - held]
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(tail)), 0, -1):
                if stop.startswith(tail[-k:]):
                    held = max(held, len(text) - len(tail) + k)
                    break
        return held

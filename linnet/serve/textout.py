"""A request's generated text as its client may see it, token by token.

The text is the decoding of all the tokens so far, built incrementally: each token decodes
a window of the last few tokens (those since the text last grew, and the ones before them
for context), and what that window adds past its first part is appended; where the window
cannot say (its text does not extend its first part's), all the tokens are decoded again.
So a step costs a few tokens' decoding, not the whole answer's (tests/serve/test_units.py:
the text equals the decoding of all tokens, multi-byte characters and stop strings
included). The text ends before the first stop string, and is released only once it can
no longer change: not while its end could be the start of a stop string, nor while it ends
in an unfinished UTF-8 character (U+FFFD), nor while decoding rewrote text already
released."""

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
        self._settled = ""  # the text of ids[: self._read], which later tokens keep
        self._prefix = 0  # the window's first token (context for the tokens after it)
        self._read = 0  # the first token whose text is not settled

    def add(self, token: int) -> str:
        """Take one generated token; return the text it releases (maybe empty)."""
        self.ids.append(token)
        text = self._decoded()
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

    def _decoded(self) -> str:
        """The decoding of every token so far, from the window's decoding."""
        head = self.decode(self.ids[self._prefix : self._read])
        window = self.decode(self.ids[self._prefix :])
        if not window.startswith(head):  # the new tokens rewrote the window's context
            return self.decode(self.ids)
        new = window[len(head) :]
        if new and not new.endswith("\ufffd"):  # whole characters: they stay
            self._settled += new
            self._prefix, self._read = self._read, len(self.ids)
            return self._settled
        return self._settled + new

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

"""Incremental detokenization with stop strings, shared by the policy backends.

Turns sampled token ids into text deltas as they arrive: a delta never ends inside a multi-byte
character (the decoder shows an incomplete one as U+FFFD, which is held back), never contains the
start of a stop string that may still complete, and the final text is cut before the first stop
string (OpenAI semantics). The end-of-turn token ends the text and adds nothing to it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

_INCOMPLETE = "\ufffd"


class IncrementalDecoder:
    """Feed token ids one by one; read `text` and `stopped` at the end."""

    def __init__(
        self,
        decode: Callable[[list[int]], str],
        stop: tuple[str, ...] = (),
        eos_ids: Collection[int] = (),
    ) -> None:
        self._decode = decode
        self._stop = tuple(s for s in stop if s)
        self._eos_ids = frozenset(eos_ids)
        self._ids: list[int] = []
        self._text = ""
        self._emitted = 0
        self.stopped = False

    @property
    def text(self) -> str:
        """The response text so far (cut before a stop string once one matched)."""
        return self._text

    def add(self, token_id: int) -> str:
        """Take one sampled token; return the text that became safe to show."""
        if self.stopped:
            return ""
        if token_id in self._eos_ids:
            self.stopped = True
            return self._flush()
        self._ids.append(token_id)
        text = self._decode(self._ids)
        cut = self._first_stop(text)
        if cut is not None:
            self._text = text[:cut]
            self.stopped = True
            return self._flush()
        self._text = text
        safe = self._safe_length(text)
        delta = text[self._emitted : safe] if safe > self._emitted else ""
        self._emitted = max(self._emitted, safe)
        return delta

    def finish(self) -> str:
        """Flush what was held back (the response ended for another reason)."""
        return self._flush()

    def _flush(self) -> str:
        delta = self._text[self._emitted :]
        self._emitted = len(self._text)
        return delta

    def _first_stop(self, text: str) -> int | None:
        hits = [i for i in (text.find(s) for s in self._stop) if i >= 0]
        return min(hits) if hits else None

    def _safe_length(self, text: str) -> int:
        safe = len(text.rstrip(_INCOMPLETE)) if text.endswith(_INCOMPLETE) else len(text)
        for stop in self._stop:
            for k in range(min(len(stop) - 1, safe), 0, -1):
                if text[:safe].endswith(stop[:k]):
                    safe = min(safe, safe - k)
                    break
        return safe

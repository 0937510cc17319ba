"""uvicorn's HTTP/1.1 protocol with a deadline on request headers, which uvicorn itself lacks.

uvicorn 0.55 closes an idle keep-alive connection after `timeout_keep_alive`, but a connection that
sends part of a request's headers and then trickles the rest (or nothing) is held open forever, with
its socket and buffers: a slowloris. Here a connection waiting for a request must complete the
request's headers within `--header-timeout-s` of opening, or of the first byte after a response;
otherwise it gets an OpenAI-shaped 408 and is closed. The request body has its own deadline
(`--body-timeout-s`, serving/request_guards.py). Reads and writes only its own connection.
"""

from __future__ import annotations

import asyncio
import json

from orl.serving.openai_api import error_body
from uvicorn.protocols.http.h11_impl import H11Protocol


class HeaderDeadlineProtocol(H11Protocol):
    header_timeout_s: float = 10.0
    _header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_deadline()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._awaiting_request():
            if (
                self._header_deadline is None
            ):  # the first bytes of the next request on a kept-alive connection
                self._arm_header_deadline()
        else:
            self._disarm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def _awaiting_request(self) -> bool:
        """No request in progress: none yet, or the last one answered."""
        return self.cycle is None or self.cycle.response_complete

    def _arm_header_deadline(self) -> None:
        self._header_deadline = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _disarm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        if not self._awaiting_request() or self.transport.is_closing():
            return
        message = f"the request's headers did not arrive within {self.header_timeout_s:g} s"
        body = json.dumps(error_body(message, "request_timeout", code="header_timeout")).encode()
        head = (
            "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        self.transport.write(head.encode() + body)
        self.transport.close()


def header_deadline_protocol(header_timeout_s: float) -> type[HeaderDeadlineProtocol]:
    """The protocol class for uvicorn.Config(http=...) with this deadline."""
    return type("HeaderDeadlineProtocol", (HeaderDeadlineProtocol,), {"header_timeout_s": header_timeout_s})

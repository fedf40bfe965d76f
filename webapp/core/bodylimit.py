"""Request bodies are refused at their size limit as they arrive, before Django (and so before the
login and CSRF checks) reads any of them.

Two layers, because Daphne reads a request's whole body (into a temporary file, then into the
application's queue) before it starts the application:

- `DaphneBodyLimit`: Daphne's request class, which counts the body as the socket delivers it and,
  past the path's limit, answers 413 and closes the connection: a declared `Content-Length` over the
  limit is refused before a byte of the body is read, a chunked body once it passes the limit.
  `webapp.asgi` installs it in the Daphne process (`install_daphne_limit`).
- `BodyLimit`: an ASGI wrapper in front of Django doing the same on `http.request` messages, for
  any other ASGI server, and as a second line under Daphne.

The limit depends on the path (`limit_for`): dataset uploads may be as large as
`TROUPE_UPLOAD_MAX_BYTES` (plus the multipart envelope), everything else `TROUPE_REQUEST_MAX_BYTES`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

UPLOAD_PATHS = ("/datasets/upload/", "/api/v1/datasets/")
"""Where a dataset file is posted (the upload page and the API)."""

MULTIPART_ENVELOPE = 1024 * 1024
"""Room for an upload's form fields and multipart boundaries beside the file itself."""


def limit_for(path: str) -> int:
    """The largest body a request to `path` may send."""
    if path in UPLOAD_PATHS:
        return settings.TROUPE_UPLOAD_MAX_BYTES + MULTIPART_ENVELOPE
    return settings.TROUPE_REQUEST_MAX_BYTES


def too_large_text(limit: int) -> bytes:
    return f"Request body too large: the limit here is {limit:,} bytes.\n".encode()


class BodyLimit:
    """ASGI wrapper: a body over the path's limit is answered 413 and never reaches the app whole.

    A `Content-Length` over the limit is answered at once, without reading the body or calling the
    app. Otherwise the app reads through a counter: when the bytes received pass the limit, the 413
    is sent, the app is told the client went away (`http.disconnect`: Django stops reading and
    answers nothing) and anything it still sends is dropped."""

    def __init__(self, app: ASGIApp, *, limit: Callable[[str], int] = limit_for):
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit(scope.get("path", ""))
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _refuse(send, limit)
            return
        received = 0
        refused = False

        async def counted_receive() -> Message:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    refused = True
                    await _refuse(send, limit)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            if not refused:
                await send(message)

        await self.app(scope, counted_receive, guarded_send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isascii() and text.isdigit() else None
    return None


async def _refuse(send: Send, limit: int) -> None:
    body = too_large_text(limit)
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


# == Daphne ===========================================================================================


def install_daphne_limit() -> None:
    """Make the Daphne server in this process refuse oversized bodies while they stream (Daphne
    builds each connection's request from `daphne.http_protocol.WebRequest`)."""
    from daphne import http_protocol

    if not getattr(http_protocol.WebRequest, "troupe_body_limit", False):
        http_protocol.WebRequest = daphne_request_class(http_protocol.WebRequest)


def daphne_request_class(base: type, limit: Callable[[str], int] = limit_for) -> type:
    """`base` (Daphne's WebRequest, a Twisted request) counting its body as it arrives."""

    class LimitedRequest(base):  # type: ignore[misc, valid-type]
        troupe_body_limit = True
        _limit = 0
        _received = 0
        _refused = False

        def gotLength(self, length: int | None) -> None:  # noqa: N802 (Twisted's name)
            target = getattr(self.channel, "_path", b"/") or b"/"
            self._limit = limit(urlsplit(target.decode("latin-1")).path or "/")
            if length is not None and length > self._limit:
                super().gotLength(0)
                self._refuse()
                return
            super().gotLength(length)

        def handleContentChunk(self, data: bytes) -> None:  # noqa: N802
            if self._refused:
                return
            self._received += len(data)
            if self._received > self._limit:
                self._refuse()
                return
            super().handleContentChunk(data)

        def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:  # noqa: N802
            if not self._refused:  # the whole body came before the connection closed: still refused
                super().requestReceived(command, path, version)

        def _refuse(self) -> None:
            self._refused = True
            body = too_large_text(self._limit)
            transport = self.channel.transport
            transport.write(b"HTTP/1.1 413 Request Entity Too Large\r\nContent-Type: text/plain; charset=utf-8\r\n"
                            b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
            transport.loseConnection()

    return LimitedRequest

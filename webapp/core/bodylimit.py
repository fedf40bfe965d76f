"""Request bodies are refused at their size limit as they arrive, before Django (and so before the
login and CSRF checks) reads any of them, and before anything parses them.

Who may send how much is decided from the request line and headers, before a byte of the body
beyond the smallest limit is read:

- a request without credentials (no session cookie, no `Authorization` header) gets the
  smallest limit, `TROUPE_ANONYMOUS_REQUEST_MAX_BYTES` (the login, password-reset and invitation
  forms are a few hundred bytes);
- a request with credentials whose body may be larger than that is held (nothing more is read
  from its socket) while its credentials are checked off the event loop (`signed_in`, a database
  read in a worker thread); a live session or API token then gets the path's limit, anything else
  the anonymous one;
- the path's limit for a signed-in request: `TROUPE_UPLOAD_MAX_BYTES` plus the multipart
  envelope for the views that take a file (declared with `upload_view`), `TROUPE_REQUEST_MAX_BYTES`
  for the rest.

Two layers, because Daphne reads a request's whole body (into a temporary file, then into the
application's queue) before it starts the application:

- `daphne_request_class`: Daphne's request class, which decides the limit when the headers are in,
  counts the body as the socket delivers it and, past the limit, answers 413 and closes the
  connection: a declared `Content-Length` over the limit is refused before a byte of the body is
  read, a chunked body once it passes the limit. It also turns off Twisted's own parsing of
  urlencoded and multipart bodies (`parsePOSTFormSubmission=False`): Twisted would parse them on
  the event loop, whole, before the application starts, and Django parses them again itself.
  `webapp.asgi` installs it in the Daphne process (`install_daphne_limit`).
- `BodyLimit`: an ASGI wrapper in front of Django doing the same on `http.request` messages, for
  any other ASGI server, and as a second line under Daphne.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

from django.conf import settings
from django.http.cookie import parse_cookie

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MULTIPART_ENVELOPE = 1024 * 1024
"""Room for an upload's form fields and multipart boundaries beside the file itself."""

log = logging.getLogger(__name__)

V = TypeVar("V", bound=Callable[..., Any])


def upload_view(view: V) -> V:
    """Declare `view` one that takes a file upload: a signed-in request to it may send a body as
    large as `TROUPE_UPLOAD_MAX_BYTES` plus the multipart envelope. Put it outermost (above
    `endpoint` and the like), on the function the URL map names."""
    view.takes_upload = True  # type: ignore[attr-defined]
    return view


@lru_cache(maxsize=1024)
def takes_upload(path: str) -> bool:
    """Whether the view `path` resolves to was declared with `upload_view` (the URL map is the
    one list of where files are posted)."""
    from django.urls import Resolver404, resolve

    try:
        match = resolve(path)
    except Resolver404:
        return False
    return bool(getattr(match.func, "takes_upload", False))


def limit_for(path: str, *, signed_in: bool) -> int:
    """The largest body a request to `path` may send: the smallest limit for a request that is not
    signed in, the upload limit for a view that takes files, `TROUPE_REQUEST_MAX_BYTES` otherwise."""
    if not signed_in:
        return int(settings.TROUPE_ANONYMOUS_REQUEST_MAX_BYTES)
    if takes_upload(path):
        return int(settings.TROUPE_UPLOAD_MAX_BYTES) + MULTIPART_ENVELOPE
    return int(settings.TROUPE_REQUEST_MAX_BYTES)


def too_large_text(limit: int, *, signed_in: bool = True) -> bytes:
    who = "" if signed_in else " for a request that is not signed in"
    return f"Request body too large: the limit here is {limit:,} bytes{who}.\n".encode()


@dataclass(frozen=True)
class Credentials:
    """What a request presents to say who sends it, as read from its headers (not yet checked)."""

    session_key: str | None
    authorization: str


def credentials(headers: Iterable[tuple[bytes, bytes]]) -> Credentials | None:
    """The session cookie and `Authorization` header of a request's headers; None when it has
    neither (an anonymous request). Cookies are read as Django reads them."""
    cookies: list[str] = []
    authorization = ""
    for name, value in headers:
        lowered = name.lower()
        if lowered == b"cookie":
            cookies.append(value.decode("latin-1"))
        elif lowered == b"authorization":
            authorization = value.decode("latin-1").strip()
    session_key = (parse_cookie("; ".join(cookies)).get(settings.SESSION_COOKIE_NAME) or None) if cookies else None
    if not session_key and not authorization:
        return None
    return Credentials(session_key=session_key, authorization=authorization)


SignedIn = Callable[[Credentials], bool]
"""Whether credentials name a signed-in user (a live session or API token): a database read, so
never called on the event loop (`webapp.teams.access.credentials_signed_in`)."""


def off_the_loop(signed_in: SignedIn) -> Callable[[Credentials], Awaitable[bool]]:
    """`signed_in` run in a worker thread of the event loop's pool, with the database connection
    handling Channels gives consumers (old connections closed before and after). Not the thread
    Django's synchronous views share: a slow view must not hold up the decision."""
    from channels.db import DatabaseSyncToAsync

    return DatabaseSyncToAsync(signed_in, thread_sensitive=False)  # type: ignore[no-any-return]


class BodyLimit:
    """ASGI wrapper: a body over its limit is answered 413 and never reaches the app whole.

    The limit is decided before the body is read (`limit_for`; credentials are checked only when
    the body may be larger than the anonymous limit). A `Content-Length` over it is answered at
    once, without reading the body or calling the app. Otherwise the app reads through a counter:
    when the bytes received pass the limit, the 413 is sent, the app is told the client went away
    (`http.disconnect`: Django stops reading and answers nothing) and anything it still sends is
    dropped."""

    def __init__(self, app: ASGIApp, *, signed_in: SignedIn, limit: Callable[..., int] = limit_for):
        self.app, self.limit = app, limit
        self.signed_in = off_the_loop(signed_in)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        declared = _content_length(scope)
        limit = self.limit(path, signed_in=False)
        signed_in = False
        found = credentials(scope.get("headers", []))
        if found is not None and (declared is None or declared > limit):
            most = self.limit(path, signed_in=True)
            if declared is not None and declared > most:
                await _refuse(send, most, signed_in=True)
                return
            signed_in = await self.signed_in(found)
            limit = most if signed_in else limit
        if declared is not None and declared > limit:
            await _refuse(send, limit, signed_in=signed_in)
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
                    await _refuse(send, limit, signed_in=signed_in)
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


async def _refuse(send: Send, limit: int, *, signed_in: bool) -> None:
    body = too_large_text(limit, signed_in=signed_in)
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


# == Daphne ===========================================================================================


def install_daphne_limit(*, signed_in: SignedIn) -> None:
    """Make the Daphne server in this process decide each body's limit from its headers, refuse
    oversized bodies while they stream, and leave parsing them to Django (Daphne builds each
    connection's request from `daphne.http_protocol.WebRequest`)."""
    from daphne import http_protocol
    from twisted.web import http

    if "parsePOSTFormSubmission" not in inspect.signature(http.Request.__init__).parameters:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured("Twisted 25.5 or later is needed (Request(parsePOSTFormSubmission=...)): pip install -r requirements.txt")
    takes_upload("/")  # load the URL map now, not on the event loop during the first request
    if not getattr(http_protocol.WebRequest, "troupe_body_limit", False):
        check = off_the_loop(signed_in)

        def deferred_check(found: Credentials) -> Any:
            from twisted.internet.defer import Deferred

            return Deferred.fromFuture(asyncio.ensure_future(check(found)))

        http_protocol.WebRequest = daphne_request_class(http_protocol.WebRequest, signed_in=deferred_check)


def _target_path(target: bytes) -> str:
    """The path of a request line's target, as Daphne gives it to the application."""
    return unquote(urlsplit(target.decode("latin-1")).path or "/")


def daphne_request_class(base: type, *, signed_in: Callable[[Credentials], Any], limit: Callable[..., int] = limit_for) -> type:
    """`base` (Daphne's WebRequest, a Twisted request) deciding its body's limit from its headers
    and counting its body as it arrives. `signed_in(credentials)` answers whether they name a
    signed-in user, as a bool or a Deferred firing with one (it must not block the event loop)."""
    from twisted.protocols.basic import LineReceiver
    from twisted.python.failure import Failure

    class LimitedRequest(base):  # type: ignore[misc, valid-type]
        troupe_body_limit = True
        _limit: int | None = None
        """None while the request's credentials are being checked."""
        _anonymous = 0
        _signed_in = False
        _received = 0
        _refused = False
        _length: int | None = None

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            # Twisted would parse an urlencoded or multipart body whole, on the event loop, before
            # the application starts (and Daphne never reads what it parsed): Django parses bodies.
            kwargs["parsePOSTFormSubmission"] = False
            super().__init__(*args, **kwargs)

        def gotLength(self, length: int | None) -> None:  # noqa: N802 (Twisted's name)
            path = _target_path(getattr(self.channel, "_path", b"/") or b"/")
            self._anonymous = limit(path, signed_in=False)
            found = credentials((name, value) for name, values in self.requestHeaders.getAllRawHeaders() for value in values)
            if found is None or (length is not None and length <= self._anonymous):
                self._decide(length, self._anonymous, signed_in=False)
                return
            most = limit(path, signed_in=True)
            if length is not None and length > most:
                self._decide(length, most, signed_in=True)
                return
            if not isinstance(self.channel, LineReceiver):  # an HTTP/2 stream (Twisted with h2): it cannot be held
                self._decide(length, self._anonymous, signed_in=False)
                return
            # Credentials, and a body that may pass the anonymous limit: read no more of it until
            # they are checked (the socket is paused; what it already delivered waits in the buffer).
            super().gotLength(length)
            self._length = length
            LineReceiver.pauseProducing(self.channel)
            answer = signed_in(found)
            if hasattr(answer, "addBoth"):
                answer.addBoth(lambda result: self._checked(result, most))
            else:
                self._checked(answer, most)

        def _checked(self, result: Any, most: int) -> None:
            if isinstance(result, Failure):
                log.warning("could not check a request's credentials: %s", result.getErrorMessage())
                result = False
            if self.channel is None or self._refused:  # the client went away meanwhile
                return
            self._signed_in = bool(result)
            self._limit = most if self._signed_in else self._anonymous
            if self._length is not None and self._length > self._limit:
                self._refuse()
                return
            LineReceiver.resumeProducing(self.channel)

        def _decide(self, length: int | None, limit_: int, *, signed_in: bool) -> None:
            self._limit, self._signed_in = limit_, signed_in
            if length is not None and length > limit_:
                super().gotLength(0)
                self._refuse()
                return
            super().gotLength(length)

        def handleContentChunk(self, data: bytes) -> None:  # noqa: N802
            if self._refused:
                return
            self._received += len(data)
            if self._received > (self._limit if self._limit is not None else self._anonymous):
                self._refuse()
                return
            super().handleContentChunk(data)

        def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:  # noqa: N802
            if not self._refused:  # the whole body came before the connection closed: still refused
                super().requestReceived(command, path, version)

        def _refuse(self) -> None:
            self._refused = True
            shown = self._limit if self._limit is not None else self._anonymous
            body = too_large_text(shown, signed_in=self._signed_in)
            transport = self.channel.transport
            transport.write(b"HTTP/1.1 413 Request Entity Too Large\r\nContent-Type: text/plain; charset=utf-8\r\n"
                            b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
            transport.loseConnection()

    return LimitedRequest

"""One request cannot stall the server (issue 31, class 3): an anonymous chunked 2,000 MB POST to
/healthz was read whole before its 403, and a 50 MiB upload of one row and 52 million newlines
was walked line by line in the web process.

Bodies are refused at the size limit as they stream, before login or CSRF are checked: by the ASGI
wrapper in front of Django, and by Daphne's request class (Daphne reads a whole body before the
application starts). A dataset's reader stops at its blank-line and line-length caps.

Issue 45, class 1 (bodies parsed before any limit) is in test_body_limit_before_parsing.py."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from daphne import http_protocol
from twisted.internet.testing import StringTransport
from twisted.web.http import HTTPChannel

from training.data import MAX_BLANK_LINES, MAX_LINE_CHARS, DataError, read_rows
from webapp.asgi import application
from webapp.core.bodylimit import MULTIPART_ENVELOPE, BodyLimit, daphne_request_class, limit_for

CHUNK = 64 * 1024
LIMIT = 256 * 1024


@pytest.fixture
def small_limit(settings: Any) -> int:
    settings.TROUPE_REQUEST_MAX_BYTES = settings.TROUPE_ANONYMOUS_REQUEST_MAX_BYTES = LIMIT
    return LIMIT


def _never_signed_in(found: Any) -> bool:
    return False


def _scope(path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
            "headers": [(b"host", b"127.0.0.1"), *headers], "client": ("203.0.113.5", 4000), "server": ("127.0.0.1", 8000)}


def _endless_body() -> tuple[Any, dict[str, int]]:
    """A receive() that would send 64 MiB in 64 KiB chunks; it counts what was pulled."""
    pulled = {"chunks": 0}

    async def receive() -> dict[str, Any]:
        pulled["chunks"] += 1
        if pulled["chunks"] > 1024:  # 64 MiB: on the old code, Django read it all
            return {"type": "http.request", "body": b"", "more_body": False}
        return {"type": "http.request", "body": b"x" * CHUNK, "more_body": True}

    return receive, pulled


def _call(app: Any, scope: dict[str, Any], receive: Any) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async_to_sync(app)(scope, receive, send)
    return sent


def test_a_huge_chunked_post_to_healthz_is_refused_once_it_passes_the_limit(small_limit, db):
    receive, pulled = _endless_body()
    sent = _call(application, _scope("/healthz", [(b"transfer-encoding", b"chunked")]), receive)
    starts = [m for m in sent if m["type"] == "http.response.start"]
    assert [m["status"] for m in starts] == [413]  # one answer: the limit's, not Django's 403 or 405
    assert b"limit here is 262,144 bytes" in b"".join(m.get("body", b"") for m in sent)
    assert pulled["chunks"] == LIMIT // CHUNK + 1  # it stopped reading at the first chunk past the limit


def test_a_declared_length_over_the_limit_is_refused_without_reading_or_calling_the_app(small_limit):
    called = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        called.append(scope)

    receive, pulled = _endless_body()
    sent = _call(BodyLimit(app, signed_in=_never_signed_in), _scope("/login/", [(b"content-length", str(2_000 * 1024 * 1024).encode())]),
                 receive)
    assert sent[0]["status"] == 413 and pulled["chunks"] == 0 and called == []


def test_a_body_within_the_limit_reaches_the_app_whole(small_limit):
    got = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            got.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    chunks = [b"y" * CHUNK] * (LIMIT // CHUNK)

    async def receive() -> dict[str, Any]:
        body = chunks.pop()
        return {"type": "http.request", "body": body, "more_body": bool(chunks)}

    sent = _call(BodyLimit(app, signed_in=_never_signed_in), _scope("/runs/new/", []), receive)
    assert sent[0]["status"] == 200 and sum(map(len, got)) == LIMIT


def test_uploads_have_their_own_larger_limit(settings, small_limit):
    settings.TROUPE_UPLOAD_MAX_BYTES = 5 * 1024 * 1024
    for path in ("/datasets/upload/", "/api/v1/datasets/", "/datasets/upload-conversations/"):
        assert limit_for(path, signed_in=True) == 5 * 1024 * 1024 + MULTIPART_ENVELOPE, path
    assert limit_for("/healthz", signed_in=True) == limit_for("/api/v1/runs/", signed_in=True) == LIMIT


# == Daphne: the body is counted as the socket delivers it ==========================================


class _Server:
    """What Daphne's request asks of its server before it starts the application."""

    request_buffer_size = 8192

    def __init__(self) -> None:
        self.applications: list[Any] = []

    def protocol_connected(self, protocol: Any) -> None:
        pass

    def protocol_disconnected(self, protocol: Any) -> None:
        pass



DAPHNE_REQUEST = next(c for c in http_protocol.WebRequest.__mro__ if c.__module__ == "daphne.http_protocol")
"""Daphne's own request class (importing webapp.asgi installed the limit on the module's name)."""


class _Recording(DAPHNE_REQUEST):  # type: ignore[misc, valid-type]
    """Daphne's request, where starting the application records the body it would be given."""

    def process(self) -> None:
        self.content.seek(0)
        self.server.applications.append(self.content.read())


def _daphne_connection() -> tuple[HTTPChannel, StringTransport, _Server]:
    server = _Server()
    channel = HTTPChannel()
    channel.factory = type("Factory", (), {"server": server})()
    channel.requestFactory = daphne_request_class(_Recording, signed_in=lambda found: False,
                                                  limit=lambda path, signed_in: LIMIT if path == "/healthz" else 10 * LIMIT)
    transport = StringTransport()
    channel.makeConnection(transport)
    return channel, transport, server


def test_daphne_refuses_a_chunked_body_as_it_streams():
    channel, transport, server = _daphne_connection()
    channel.dataReceived(b"POST /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n")
    sent = 0
    while not transport.disconnecting:
        channel.dataReceived(b"%x\r\n" % CHUNK + b"x" * CHUNK + b"\r\n")
        sent += CHUNK
        assert sent <= 2_000 * 1024 * 1024
    assert sent == LIMIT + CHUNK  # refused with the first chunk past the limit, not at the end
    assert transport.value().startswith(b"HTTP/1.1 413 ")
    request = channel.requests[0] if channel.requests else None
    assert request is None or request.content.tell() <= LIMIT  # nothing past the limit was kept
    assert server.applications == []


def test_daphne_refuses_a_declared_length_before_reading_the_body():
    channel, transport, server = _daphne_connection()
    channel.dataReceived(b"POST /healthz?x=1 HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2097152000\r\n\r\n")
    assert transport.value().startswith(b"HTTP/1.1 413 ") and transport.disconnecting and server.applications == []


def test_daphne_lets_a_body_within_its_paths_limit_through():
    channel, transport, server = _daphne_connection()
    body = b"z" * (2 * LIMIT)  # over /healthz's limit, within this path's
    channel.dataReceived(b"POST /datasets/upload/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    assert not transport.value().startswith(b"HTTP/1.1 413") and server.applications == [body]


def test_install_replaces_daphnes_request_class_once(monkeypatch):
    from webapp.core import bodylimit

    monkeypatch.setattr(http_protocol, "WebRequest", http_protocol.WebRequest)
    bodylimit.install_daphne_limit(signed_in=_never_signed_in)
    first = http_protocol.WebRequest
    bodylimit.install_daphne_limit(signed_in=_never_signed_in)
    assert first.troupe_body_limit and http_protocol.WebRequest is first


# == heavy parsing stops at its caps =================================================================


def test_a_file_of_one_row_and_millions_of_newlines_is_refused_at_the_blank_line_cap(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"question": "1+1?", "answer": "2"}' + "\n" * 5_000_000)
    with pytest.raises(DataError) as caught:
        read_rows(path, required_fields=("question", "answer"), max_rows=10)
    assert caught.value.line == MAX_BLANK_LINES + 2  # stopped there, not at line 5,000,001
    assert "blank lines" in caught.value.message


def test_csv_blank_rows_stop_at_the_same_cap(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("question,answer\n1+1?,2\n" + ",\n" * (MAX_BLANK_LINES + 50))
    with pytest.raises(DataError) as caught:
        read_rows(path, required_fields=("question", "answer"))
    assert caught.value.line == MAX_BLANK_LINES + 3 and "blank lines" in caught.value.message


def test_an_overlong_line_is_refused_before_it_is_parsed(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"question": "' + "a" * MAX_LINE_CHARS + '", "answer": "2"}\n')
    with pytest.raises(DataError, match="the limit is") as caught:
        read_rows(path, required_fields=("question", "answer"))
    assert caught.value.line == 1 and "line is" in caught.value.message

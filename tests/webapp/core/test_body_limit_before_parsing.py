"""Bodies are limited before anything parses them, and a request that is not signed in gets the
smallest limit (issue 45, class 1).

Daphne's HTTP layer (Twisted) parsed urlencoded and multipart bodies on its event loop, whole,
before Troupe's limit, login or CSRF check: an anonymous 50 MiB multipart body of newlines to
/api/v1/datasets/ held every request for about 30 s and grew the web process by 0.8 GB; 2.4 MiB of
`&` to /login/ held everyone for 2-3 s. Now Twisted parses nothing (Django does, after the limit),
the limit is decided from the request line and headers, a request without credentials gets
`TROUPE_ANONYMOUS_REQUEST_MAX_BYTES`, and one with credentials whose body may be larger is held —
its socket paused, no more of its body read — while they are checked off the event loop."""

from __future__ import annotations

import ast
import asyncio
import inspect
import socket
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from daphne import http_protocol
from django.contrib.auth.models import User
from django.urls import URLPattern, URLResolver, get_resolver
from twisted.internet.defer import Deferred
from twisted.internet.testing import StringTransport
from twisted.web import http
from twisted.web.http import HTTPChannel

import webapp
from webapp.core import bodylimit
from webapp.core.bodylimit import BodyLimit, Credentials, credentials, daphne_request_class, limit_for
from webapp.models import ApiToken, Membership
from webapp.teams import services as teams
from webapp.teams.access import credentials_signed_in

ANONYMOUS = 64 * 1024
SIGNED_IN = 1024 * 1024
UPLOAD = 4 * 1024 * 1024


@pytest.fixture(autouse=True)
def limits(settings: Any) -> None:
    settings.TROUPE_ANONYMOUS_REQUEST_MAX_BYTES = ANONYMOUS
    settings.TROUPE_REQUEST_MAX_BYTES = SIGNED_IN
    settings.TROUPE_UPLOAD_MAX_BYTES = UPLOAD


# == Daphne: what the event loop does with a body =====================================================


class _Server:
    request_buffer_size = 8192

    def __init__(self) -> None:
        self.applications: list[tuple[bytes, Any]] = []

    def protocol_connected(self, protocol: Any) -> None:
        pass

    def protocol_disconnected(self, protocol: Any) -> None:
        pass


DAPHNE_REQUEST = next(c for c in http_protocol.WebRequest.__mro__ if c.__module__ == "daphne.http_protocol")


class _Recording(DAPHNE_REQUEST):  # type: ignore[misc, valid-type]
    """Daphne's request, where starting the application records the body it would be given and
    what Twisted made of it (`args`)."""

    def process(self) -> None:
        self.content.seek(0)
        self.server.applications.append((self.content.read(), self.args))


class _Checks:
    """The credential checks a connection asked for, each answered when the test says so."""

    def __init__(self) -> None:
        self.asked: list[tuple[Credentials, Deferred[bool]]] = []

    def __call__(self, found: Credentials) -> Deferred[bool]:
        answer: Deferred[bool] = Deferred()
        self.asked.append((found, answer))
        return answer


def _connection(checks: Any = None) -> tuple[HTTPChannel, StringTransport, _Server]:
    server = _Server()
    channel = HTTPChannel()
    channel.factory = type("Factory", (), {"server": server})()
    channel.requestFactory = daphne_request_class(_Recording, signed_in=checks or (lambda found: False))
    transport = StringTransport()
    channel.makeConnection(transport)
    return channel, transport, server


def _head(path: str, length: int, *headers: str, content_type: str = "application/x-www-form-urlencoded") -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Type: {content_type}", f"Content-Length: {length}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_twisted_parses_no_form_body_on_the_event_loop(monkeypatch):
    parsed = []
    real = http._getMultiPartArgs
    monkeypatch.setattr(http, "_getMultiPartArgs", lambda *a: parsed.append(a) or real(*a))
    form = b"username=alice&password=" + b"&" * 30_000
    boundary = "b0undary"
    multipart = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x.jsonl\"\r\n\r\n" + "\n" * 40_000
                 + f"\r\n--{boundary}--\r\n").encode()
    for body, content_type in ((form, "application/x-www-form-urlencoded"), (multipart, f"multipart/form-data; boundary={boundary}")):
        channel, transport, server = _connection()
        channel.dataReceived(_head("/login/", len(body), content_type=content_type) + body)
        assert server.applications == [(body, {})]  # the body reaches the application untouched, and Twisted made nothing of it
    assert parsed == []


@pytest.mark.parametrize(("path", "length"), [
    ("/login/", 2_400_000),                      # 2.4 MiB of `&` held everyone for 2-3 s
    ("/api/v1/datasets/", 50 * 1024 * 1024),     # 50 MiB of newlines held everyone for 30 s
    ("/datasets/upload/", 3 * 1024 * 1024),
    ("/password-reset/", ANONYMOUS + 1),
    ("/healthz", ANONYMOUS + 1),
])
def test_a_request_without_credentials_gets_the_smallest_limit_before_its_body_is_read(path, length):
    checks = _Checks()
    channel, transport, server = _connection(checks)
    channel.dataReceived(_head(path, length) + b"&" * 1000)
    assert transport.value().startswith(b"HTTP/1.1 413 ") and transport.disconnecting
    assert b"65,536 bytes for a request that is not signed in" in transport.value()
    assert checks.asked == [] and server.applications == []  # nothing to check: refused on its headers


def test_a_small_body_needs_no_check_whoever_sends_it():
    checks = _Checks()
    channel, transport, server = _connection(checks)
    body = b"notes=" + b"x" * 1000
    channel.dataReceived(_head("/runs/1/notes/", len(body), "Cookie: sessionid=whatever") + body)
    assert checks.asked == [] and [b for b, _ in server.applications] == [body]


def test_credentials_are_checked_before_more_than_the_anonymous_limit_is_read():
    checks = _Checks()
    channel, transport, server = _connection(checks)
    body = b"y" * (ANONYMOUS * 4)
    channel.dataReceived(_head("/datasets/upload/", len(body), "Cookie: theme=dark; sessionid=abc123") + body[:ANONYMOUS // 2])
    (found, answer), = checks.asked
    assert found == Credentials(session_key="abc123", authorization="")
    assert transport.producerState == "paused"  # no more is read from the socket while they are checked
    assert channel.requests[0].content.tell() == 0 and server.applications == []  # what came with the headers waits unread
    answer.callback(True)
    assert transport.producerState == "producing"
    channel.dataReceived(body[ANONYMOUS // 2:])
    assert [b for b, _ in server.applications] == [body] and not transport.disconnecting


@pytest.mark.parametrize("result", [False, RuntimeError("database down")])
def test_credentials_that_name_nobody_get_the_anonymous_limit(result):
    checks = _Checks()
    channel, transport, server = _connection(checks)
    channel.dataReceived(_head("/api/v1/datasets/", 3 * 1024 * 1024, "Authorization: Bearer trp_forged") + b"z" * 1000)
    (found, answer), = checks.asked
    assert found.authorization == "Bearer trp_forged" and transport.value() == b""
    if isinstance(result, Exception):
        answer.errback(result)
    else:
        answer.callback(result)
    assert transport.value().startswith(b"HTTP/1.1 413 ") and transport.disconnecting and server.applications == []


def test_a_chunked_body_with_credentials_waits_for_the_check_too():
    checks = _Checks()
    channel, transport, server = _connection(checks)
    channel.dataReceived(b"POST /runs/new/ HTTP/1.1\r\nHost: 127.0.0.1\r\nCookie: sessionid=forged\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert transport.producerState == "paused" and len(checks.asked) == 1
    checks.asked[0][1].callback(False)
    sent = 0
    while not transport.disconnecting:
        channel.dataReceived(b"%x\r\n" % 16384 + b"c" * 16384 + b"\r\n")
        sent += 16384
        assert sent <= SIGNED_IN
    assert sent == ANONYMOUS + 16384 and transport.value().startswith(b"HTTP/1.1 413 ")


def test_a_declared_length_over_the_signed_in_limit_is_refused_without_a_check():
    checks = _Checks()
    channel, transport, server = _connection(checks)
    channel.dataReceived(_head("/runs/new/", SIGNED_IN + 1, "Cookie: sessionid=abc"))
    assert transport.value().startswith(b"HTTP/1.1 413 ") and checks.asked == []
    assert b"1,048,576 bytes." in transport.value()


def test_a_client_that_leaves_during_the_check_is_let_go():
    checks = _Checks()
    channel, transport, server = _connection(checks)
    channel.dataReceived(_head("/datasets/upload/", 2 * ANONYMOUS, "Cookie: sessionid=abc"))
    channel.connectionLost(Exception("gone"))
    checks.asked[0][1].callback(True)  # nothing to resume, nothing raised
    assert server.applications == []


def test_the_installed_request_class_turns_twisted_parsing_off():
    import webapp.asgi  # noqa: F401 (installs it, as Daphne loading the application does)

    request = http_protocol.WebRequest(_connection()[0])
    assert request.troupe_body_limit and request._parsePOSTFormSubmission is False


# == the ASGI wrapper decides the same way ===============================================================


def _scope(path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
            "headers": [(b"host", b"127.0.0.1"), *headers], "client": ("203.0.113.5", 4000), "server": ("127.0.0.1", 8000)}


def _run(signed_in: Any, scope: dict[str, Any], body: bytes) -> tuple[list[dict[str, Any]], list[bytes]]:
    """`scope` with `body` through the wrapper in front of an app that reads the whole body."""
    sent: list[dict[str, Any]] = []
    got: list[bytes] = []
    chunks = [body[i:i + 65536] for i in range(0, len(body), 65536)] or [b""]

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": chunks.pop(0), "more_body": bool(chunks)}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            got.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async_to_sync(BodyLimit(app, signed_in=signed_in))(scope, receive, send)
    return sent, got


@pytest.mark.parametrize(("headers", "answer", "status"), [
    ([], None, 413),                                                            # anonymous: refused on its headers
    ([(b"cookie", b"sessionid=forged")], False, 413),                           # credentials that name nobody
    ([(b"authorization", b"Bearer trp_live")], True, 200),                      # a live token: the upload limit
])
def test_the_asgi_wrapper_checks_credentials_before_reading_a_larger_body(headers, answer, status):
    asked: list[Credentials] = []

    def signed_in(found: Credentials) -> bool:
        asked.append(found)
        return bool(answer)

    body = b"u" * (2 * ANONYMOUS)
    sent, got = _run(signed_in, _scope("/api/v1/datasets/", [*headers, (b"content-length", str(len(body)).encode())]), body)
    assert sent[0]["status"] == status
    assert got == [] if status == 413 else b"".join(got) == body  # a refused body is not read at all
    assert len(asked) == (0 if answer is None else 1)


# == who is signed in ======================================================================================


def test_credentials_are_read_from_the_headers_as_django_reads_them(settings):
    assert credentials([(b"Host", b"x")]) is None
    assert credentials([(b"Cookie", b"csrftoken=a; sessionid=k1")]) == Credentials("k1", "")
    assert credentials([(b"cookie", b"a=b"), (b"cookie", b"sessionid=k2")]) == Credentials("k2", "")
    assert credentials([(b"Authorization", b" Bearer t ")]) == Credentials(None, "Bearer t")
    assert credentials([(b"Cookie", b"csrftoken=a")]) is None  # no session cookie: anonymous


def test_a_live_session_or_token_is_signed_in_and_nothing_else_is(alice):
    session_key = alice.client.cookies["sessionid"].value
    token = teams.api_token_create(user=alice.user, team=alice.team, name="notebook")[1]
    assert credentials_signed_in(Credentials(session_key, ""))
    assert credentials_signed_in(Credentials(None, f"Bearer {token}"))
    assert ApiToken.objects.get(user=alice.user).last_used is None  # a check, not a use: it writes nothing
    assert not credentials_signed_in(Credentials("no-such-session", ""))
    assert not credentials_signed_in(Credentials(None, "Bearer trp_forged"))
    assert not credentials_signed_in(Credentials(None, f"Basic {token}"))
    User.objects.filter(pk=alice.user.pk).update(is_active=False)
    assert not credentials_signed_in(Credentials(session_key, ""))  # a deactivated account
    User.objects.filter(pk=alice.user.pk).update(is_active=True)
    alice.user.set_password("a different passphrase 99")
    alice.user.save()
    assert not credentials_signed_in(Credentials(session_key, ""))  # the password changed: that session ended
    Membership.objects.filter(user=alice.user).delete()
    assert not credentials_signed_in(Credentials(None, f"Bearer {token}"))  # a token of someone no longer in its team


# == where files are posted: one list, the URL map =========================================================


def _views() -> list[Any]:
    out: list[Any] = []

    def walk(patterns: list[Any]) -> None:
        for p in patterns:
            if isinstance(p, URLResolver):
                walk(p.url_patterns)
            elif isinstance(p, URLPattern):
                out.append(p.callback)

    walk(get_resolver().url_patterns)
    return out


def test_every_view_that_reads_files_has_the_upload_limit():
    """A function of the web app that reads `request.FILES` is a view declared `upload_view`, or
    a helper that only such a view of its module calls (the conversations page was left out, so a
    2.6 MiB conversations file got a 413 although uploads go to 50 MiB)."""
    marked = {(inspect.unwrap(v).__module__, inspect.unwrap(v).__name__) for v in _views() if getattr(v, "takes_upload", False)}
    assert {name for _, name in marked} >= {"dataset_upload", "dataset_upload_conversations", "datasets"}
    root = Path(webapp.__file__).parent
    unmarked = []
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module = ".".join(("webapp", *path.relative_to(root).with_suffix("").parts))
        functions = {f.name: f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)}
        for name, function in functions.items():
            if "request.FILES" not in ast.unparse(function):
                continue
            callers = {caller for caller, f in functions.items() if caller != name and any(
                isinstance(n, ast.Name) and n.id == name for n in ast.walk(f))}
            if (module, name) not in marked and not any((module, caller) in marked for caller in callers):
                unmarked.append(f"{module}.{name}")
    assert unmarked == [], f"these read uploaded files but their URL has the small limit: {unmarked}"


def test_an_upload_path_of_a_signed_in_user_gets_the_upload_limit():
    for path in ("/datasets/upload/", "/datasets/upload-conversations/", "/api/v1/datasets/"):
        assert limit_for(path, signed_in=True) == UPLOAD + bodylimit.MULTIPART_ENVELOPE
        assert limit_for(path, signed_in=False) == ANONYMOUS
    assert limit_for("/datasets/upload-conversations/x", signed_in=True) == SIGNED_IN  # no such page
    assert limit_for("/nowhere/", signed_in=True) == SIGNED_IN


@pytest.mark.django_db(transaction=True)
def test_a_signed_in_conversations_upload_over_the_request_limit_goes_through_the_whole_stack(alice, data_dir):
    """Through `webapp.asgi.application` (the wrapper, then Django): the conversations page takes
    files as large as the dataset pages do (its 2.6 MiB files got a 413); the same body without
    a session is refused before it is read."""
    from webapp.asgi import application
    from webapp.models import Dataset

    line = '{"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "%s"}]}\n' % ("4" * 2000)
    content = line.encode() * (3 * SIGNED_IN // 2 // len(line))
    token = "a" * 32
    parts = [(b"csrfmiddlewaretoken", token.encode()), (b"name", b"demos"), (b"environment", b"math_tool")]
    body = b"".join(b'--B\r\nContent-Disposition: form-data; name="%s"\r\n\r\n%s\r\n' % part for part in parts)
    body += b'--B\r\nContent-Disposition: form-data; name="file"; filename="demos.jsonl"\r\n\r\n' + content + b"\r\n--B--\r\n"
    assert SIGNED_IN < len(body) < UPLOAD

    def post(cookie: bytes) -> int:
        scope = _scope("/datasets/upload-conversations/", [
            (b"content-type", b"multipart/form-data; boundary=B"), (b"content-length", str(len(body)).encode()), (b"cookie", cookie)])
        scope["method"] = "POST"
        sent: list[dict[str, Any]] = []
        chunks = [body[i:i + 65536] for i in range(0, len(body), 65536)]

        async def receive() -> dict[str, Any]:
            if not chunks:
                await asyncio.Event().wait()  # the client stays until the answer (Django stops listening then)
            return {"type": "http.request", "body": chunks.pop(0), "more_body": bool(chunks)}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        async_to_sync(application)(scope, receive, send)
        return next(m["status"] for m in sent if m["type"] == "http.response.start")

    session = alice.client.cookies["sessionid"].value
    assert post(f"csrftoken={token}; sessionid=forged".encode()) == 413
    assert post(f"csrftoken={token}; sessionid={session}".encode()) == 302
    assert Dataset.objects.get(team=alice.team, name="demos").row_count == len(content) // len(line)


# == a real Daphne ==========================================================================================


def _answer(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_daphne_refuses_on_the_headers_and_lets_a_signed_in_upload_through(alice, tmp_path):
    """Daphne as `manage.py troupe` runs it: a body nobody signed in may send is refused before a
    byte of it is sent (the client never sends it, and the answer comes), credentials are checked
    off the event loop, and a signed-in member's conversations file over 2.5 MiB is stored."""
    from tests.processes import Processes

    stack = Processes(data_dir=tmp_path / "data", log_dir=tmp_path, env={
        "TROUPE_ANONYMOUS_REQUEST_MAX_BYTES": str(ANONYMOUS), "TROUPE_REQUEST_MAX_BYTES": str(SIGNED_IN),
        "TROUPE_UPLOAD_MAX_BYTES": str(UPLOAD)})
    (tmp_path / "data").mkdir()
    try:
        stack.start(worker=False)
        held = []
        for path, length, extra in (
            ("/api/v1/datasets/", 50 * 1024 * 1024, ""), ("/login/", 2_400_000, ""),
            ("/datasets/upload/", 3 * 1024 * 1024, "Cookie: sessionid=forged\r\n"),              # checked off the loop, then refused
            ("/api/v1/datasets/", 3 * 1024 * 1024, "Authorization: Bearer trp_forged\r\n"),
        ):
            sock = socket.create_connection(("127.0.0.1", stack.port), timeout=60)  # the timeout only bounds a hang
            held.append(sock)
            sock.sendall((f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multipart/form-data; boundary=x\r\n"
                          f"Content-Length: {length}\r\n{extra}\r\n").encode())
            assert _answer(sock).startswith(b"HTTP/1.1 413 "), (path, extra)  # answered with no body sent
        with socket.create_connection(("127.0.0.1", stack.port), timeout=60) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            assert _answer(sock).startswith(b"HTTP/1.1 200 ")
        for sock in held:
            sock.close()

        import http.client

        token = "c" * 32  # a CSRF secret of our choosing, as cookie and field (Django compares them)
        cookie = f"sessionid={alice.client.cookies['sessionid'].value}; csrftoken={token}"
        line = ('{"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "%s"}], "agent": "reasoner"}\n'
                % ("4" * 1000))
        content = (line * (3 * 1024 * 1024 // len(line) + 1)).encode()
        assert SIGNED_IN < len(content) < UPLOAD
        fields = [(b"csrfmiddlewaretoken", token.encode()), (b"name", b"demos"), (b"environment", b"math_tool")]
        body = b"".join(b'--B\r\nContent-Disposition: form-data; name="%s"\r\n\r\n%s\r\n' % field for field in fields)
        body += b'--B\r\nContent-Disposition: form-data; name="file"; filename="demos.jsonl"\r\n\r\n' + content + b"\r\n--B--\r\n"
        web = http.client.HTTPConnection("127.0.0.1", stack.port, timeout=120)
        web.request("POST", "/datasets/upload-conversations/", body=body,
                    headers={"Cookie": cookie, "Content-Type": "multipart/form-data; boundary=B"})
        response = web.getresponse()
        assert response.status == 302, (response.status, response.read()[:500], stack.logs())
    finally:
        stack.stop()

"""Sockets close with codes the websocket library sends, and a client's bad frames are ignored
(issue 45, class 11).

The reconnect close code was 1012: Autobahn (under Daphne) lets an application close only with
1000 or 3000-4999 and raised on it, so each role change wrote a 45-line traceback per open socket
and the socket was not closed. A binary frame or text that is not JSON made the consumer raise: a
traceback for each frame a client sent. The in-process tests check the codes against Autobahn's
own rule and the consumer's handling of bad frames; the integration test runs Daphne."""

from __future__ import annotations

import base64
import os
import socket as sockets_
import struct
from typing import Any

import pytest
from autobahn.twisted.websocket import WebSocketServerProtocol
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from tests.webapp.streams import TRANSACTIONAL, receive_backlog, receive_until, run, socket
from webapp.core import sockets
from webapp.models import Membership
from webapp.runs.consumers import MAX_PING_CHARS, REFUSED

PASSWORD = "carols long passphrase 1"


class _Open(WebSocketServerProtocol):
    """Autobahn's protocol, open, recording the close frame it would send."""

    def __init__(self) -> None:
        super().__init__()
        self.state = WebSocketServerProtocol.STATE_OPEN
        self.sent: list[int | None] = []

    def sendCloseFrame(self, code: int | None = None, reasonUtf8: bytes | None = None, isReply: bool = False) -> None:  # noqa: N802
        self.sent.append(code)


@pytest.mark.parametrize("code", [sockets.GONE, sockets.RECONNECT, REFUSED])
def test_every_close_code_troupe_uses_is_one_the_websocket_library_sends(code):
    protocol = _Open()
    protocol.sendClose(code=code)  # Daphne's serverClose(code) calls this; 1012 raised here
    assert protocol.sent == [code]


@pytest.mark.parametrize("code", [1012, 1001, 1006, 999, 5000, "4401", None])
def test_a_code_the_library_refuses_becomes_reconnect(code):
    protocol = _Open()
    protocol.sendClose(code=sockets.close_code(code))
    assert protocol.sent == [sockets.RECONNECT]
    assert sockets.close_code(sockets.GONE) == sockets.GONE and sockets.close_code(1000) == 1000


@pytest.fixture
def carol(alice):
    user = User.objects.create_user("carol", password=PASSWORD)
    membership = Membership.objects.create(team=alice.team, user=user, role=Membership.Role.MEMBER)
    client = Client()
    client.force_login(user)
    return user, membership, client


@TRANSACTIONAL
def test_bad_frames_are_ignored_and_the_socket_goes_on(alice_world, carol):
    _, _, client = carol

    async def scenario() -> None:
        ws = socket(alice_world.run.pk, client)
        assert (await ws.connect())[0]
        await receive_backlog(ws)
        for frame in ({"bytes_data": b"\x00\xff binary"}, {"text_data": "not json"}, {"text_data": "{\"t\": "},
                      {"text_data": "[" * 100_000}, {"text_data": "1" * 5_000}, {"text_data": " " * (MAX_PING_CHARS + 1)},
                      {"text_data": "\"just a string\""}, {"text_data": "[1, 2]"}, {"text_data": "{\"t\": \"nope\"}"}):
            await ws.send_to(**frame)
        await ws.send_json_to({"t": "ping"})
        assert (await receive_until(ws, "pong"))[-1] == {"t": "pong"}  # every bad frame passed without a trace; the socket still answers
        await ws.disconnect()

    run(scenario)


# == Daphne ===================================================================================================


class _Client:
    """A websocket client speaking the wire protocol directly (it can send what a browser never would)."""

    def __init__(self, port: int, path: str, cookie: str) -> None:
        self.sock = sockets_.create_connection(("127.0.0.1", port), timeout=60)  # the timeout only bounds a hang
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                           f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nOrigin: http://127.0.0.1:{port}\r\n"
                           f"Cookie: sessionid={cookie}\r\n\r\n").encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            self.buf += self.sock.recv(65536)
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        assert b" 101 " in head.split(b"\r\n")[0], head

    def send(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        size = len(payload)
        header = struct.pack("!B", 0x80 | opcode)
        header += struct.pack("!B", 0x80 | size) if size < 126 else (
            struct.pack("!BH", 0x80 | 126, size) if size < 65536 else struct.pack("!BQ", 0x80 | 127, size))
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed without a close frame")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def frame(self) -> tuple[int, bytes]:
        first, second = self._read(2)
        size = second & 0x7F
        if size == 126:
            size = struct.unpack("!H", self._read(2))[0]
        elif size == 127:
            size = struct.unpack("!Q", self._read(8))[0]
        return first & 0x0F, self._read(size)

    def until(self, wanted: Any) -> tuple[int, bytes]:
        while True:
            opcode, payload = self.frame()
            if wanted(opcode, payload):
                return opcode, payload


@pytest.mark.integration
@TRANSACTIONAL
def test_daphne_closes_with_reconnect_on_a_role_change_and_logs_no_traceback(alice, alice_world, carol, tmp_path):
    from tests.processes import Processes

    user, membership, client = carol
    stack = Processes(data_dir=tmp_path / "data", log_dir=tmp_path)
    (tmp_path / "data").mkdir()
    try:
        stack.start(worker=False)
        ws = _Client(stack.port, f"/ws/runs/{alice_world.run.pk}/", client.cookies["sessionid"].value)
        ws.send(0x2, b"\x00\x01binary")               # a binary frame
        ws.send(0x1, b"not json")                     # text that is not JSON
        ws.send(0x1, b"[" * 900)                      # nesting
        ws.send(0x1, b'{"t": "ping"}')
        ws.until(lambda op, data: op == 0x1 and b'"pong"' in data)  # the socket still answers after them
        for opcode, payload in ((0x1, b"\xff\xfe not UTF-8"), (0x3, b"a reserved opcode")):  # what the library itself refuses
            bad = _Client(stack.port, f"/ws/runs/{alice_world.run.pk}/", client.cookies["sessionid"].value)
            bad.send(opcode, payload)
            try:
                bad.until(lambda op, data: op == 0x8)  # closed (1007, 1002), or dropped
            except ConnectionError:
                pass
            bad.sock.close()
        import http.client

        token = "c" * 32  # alice, in her browser: the role change is made by the server the socket is on
        web = http.client.HTTPConnection("127.0.0.1", stack.port, timeout=60)
        web.request("POST", reverse("team_member_role", args=[membership.pk]), body=f"role=admin&csrfmiddlewaretoken={token}",
                    headers={"Cookie": f"sessionid={alice.client.cookies['sessionid'].value}; csrftoken={token}",
                             "Content-Type": "application/x-www-form-urlencoded"})
        response = web.getresponse()
        assert response.status == 302, response.read()[:500]
        opcode, payload = ws.until(lambda op, data: op == 0x8)  # the role change reaches Daphne through Redis
        assert struct.unpack("!H", payload[:2])[0] == sockets.RECONNECT
        ws.sock.close()
        with sockets_.create_connection(("127.0.0.1", stack.port), timeout=60) as probe:  # the server is still well
            probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            assert probe.recv(64).startswith(b"HTTP/1.1 200 ")
    finally:
        stack.stop()
    log = stack.logs()
    assert "Traceback" not in log and "invalid close code" not in log, log

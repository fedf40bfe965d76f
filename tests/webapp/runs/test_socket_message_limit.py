"""Daphne refuses a websocket message larger than any page sends, before Troupe's code runs
(issue 45, leftover of class 11): Autobahn buffers a whole message (1 MiB by default) before the
consumer sees it, so the limit is Daphne's `--websocket-max-message-size`, passed by every start."""

from __future__ import annotations

import re
import shlex
import struct
from pathlib import Path

import pytest
import yaml

from tests.webapp.runs.test_socket_close_codes_and_bad_frames import _Client, carol  # noqa: F401 - carol is a fixture
from tests.webapp.streams import TRANSACTIONAL
from webapp.core import sockets
from webapp.runs.consumers import MAX_PING_CHARS

REPO = Path(__file__).resolve().parents[3]


def _flags(argv: list[str]) -> dict[str, str]:
    return {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--websocket-max-")}


def test_the_limit_holds_the_largest_message_a_page_sends():
    assert sockets.MAX_MESSAGE_BYTES >= 4 * MAX_PING_CHARS  # 1,024 characters of UTF-8
    assert _flags(list(sockets.DAPHNE_ARGS)) == {"--websocket-max-message-size": "1048576", "--websocket-max-frame-size": "1048576"}


def test_every_start_of_daphne_passes_the_limit():
    wanted = _flags(list(sockets.DAPHNE_ARGS))
    compose = yaml.safe_load((REPO / "docker" / "compose.yaml").read_text())
    starts = {"compose": [c for s in compose["services"].values() if "daphne" in (c := [str(x) for x in s.get("command") or []])]}
    cmd = re.search(r'^CMD (\[.*\])$', (REPO / "docker" / "Dockerfile").read_text(), re.M)
    assert cmd is not None
    starts["Dockerfile"] = [yaml.safe_load(cmd.group(1))]
    assert all(starts.values()), starts
    for where, argvs in starts.items():
        for argv in argvs:
            assert _flags(argv) == wanted, (where, shlex.join(argv))
    for path in ("webapp/management/commands/troupe.py", "tests/processes.py"):
        source = (REPO / path).read_text()
        assert source.count('"-m", "daphne"') == source.count("*sockets.DAPHNE_ARGS") == 1, path


@pytest.mark.integration
@TRANSACTIONAL
def test_daphne_closes_a_socket_sent_a_larger_message_and_serves_the_rest(alice_world, carol, tmp_path):  # noqa: F811
    from tests.processes import Processes

    _, _, client = carol
    stack = Processes(data_dir=tmp_path / "data", log_dir=tmp_path)
    (tmp_path / "data").mkdir()
    try:
        stack.start(worker=False)
        path, cookie = f"/ws/runs/{alice_world.run.pk}/", client.cookies["sessionid"].value
        big = _Client(stack.port, path, cookie)
        big.send(0x1, b'{"t": "ping", "pad": "' + b"x" * (sockets.MAX_MESSAGE_BYTES + 65536) + b'"}')
        try:
            opcode, payload = big.until(lambda op, data: op == 0x8)
            assert struct.unpack("!H", payload[:2])[0] == 1009  # "message too big"
        except ConnectionError:  # dropped without a close frame: refused all the same
            pass
        big.sock.close()
        ws = _Client(stack.port, path, cookie)  # the largest message a page sends still goes through
        ws.send(0x1, b'{"t": "ping", "pad": "' + b"x" * (4 * MAX_PING_CHARS - 64) + b'"}')
        ws.send(0x1, b'{"t": "ping"}')
        ws.until(lambda op, data: op == 0x1 and b'"pong"' in data)
        ws.sock.close()
    finally:
        stack.stop()

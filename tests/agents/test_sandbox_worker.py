"""`agents.sandbox.SandboxWorker`: a sandboxed process kept running and fed requests over a pipe
gets the layers a `run_python` run gets, answers each request under its own timer and output cap,
and is killed with the reason past them."""

from __future__ import annotations

import pytest

from agents.sandbox import SandboxWorker, SandboxWorkerError, run_python
from tests.agents.sandbox_procs import gone

ECHO = ("import sys, os\n"
        "while True:\n"
        "    line = sys.stdin.readline()\n"
        "    if not line:\n"
        "        break\n"
        "    cmd = line.strip()\n"
        "    if cmd == 'flood':\n"
        "        os.write(1, b'x' * 100_000)\n"
        "    elif cmd == 'hang':\n"
        "        while True: pass\n"
        "    elif cmd == 'die':\n"
        "        sys.stderr.write('ValueError: gave up\\n'); sys.exit(1)\n"
        "    print('chatter')\n"
        "    print('@' + cmd[::-1], flush=True)\n")


def test_a_worker_has_the_layers_of_a_run_and_answers_request_after_request(spawned):
    worker = SandboxWorker(ECHO, cpu_s=10, reply_prefix="@")
    try:
        assert [worker.request(word, timeout_s=10) for word in ("abc", "xy", "")] == ["cba", "yx", ""]
        assert len(spawned) == 1 and worker.alive
        assert set(worker.isolation) == set(run_python("pass").isolation) and worker.isolation
    finally:
        worker.close()
    assert not worker.alive and gone(spawned[0])


@pytest.mark.parametrize(("cmd", "reason"), [("flood", "output limit"), ("hang", "timeout"), ("die", "exited with status 1: ValueError: gave up")])
def test_a_request_past_a_limit_kills_the_worker_with_the_reason(spawned, cmd, reason):
    worker = SandboxWorker(ECHO, cpu_s=10, reply_prefix="@", max_reply_bytes=4096)
    assert worker.request("ok", timeout_s=10) == "ko"
    with pytest.raises(SandboxWorkerError) as caught:
        worker.request(cmd, timeout_s=0.5)
    assert caught.value.reason == reason and not worker.alive and gone(spawned[0])
    with pytest.raises(SandboxWorkerError):
        worker.request("again", timeout_s=1)

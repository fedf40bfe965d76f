"""More escapes tried against the sandbox, beyond test_sandbox.py: unbounded output on stderr,
loops that ignore signals or spin inside C, the parent's environment (where secrets live), the
data directory, UDP, shared memory, and the memory limit without the audit hook. As in
test_sandbox.py, kernel-only checks (`_run(audit_hook=False)`) skip when the layer they rely on
could not be set up on this machine; as root here, every layer takes hold. The attacks on other
processes, tried as root and as an ordinary user, are in test_sandbox_attacks.py."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from agents import sandbox
from agents.sandbox import SandboxResult, run_python


def kernel_only(code: str, **kw: object) -> SandboxResult:
    args: dict = {"timeout_s": 2.0, "memory_mb": 256, "max_output_bytes": 16_384, "files": {}, "stdin": ""}
    args.update(kw)
    return sandbox._run(code, audit_hook=False, **args)


def blocked(r: SandboxResult) -> bool:
    return r.exit_code != 0 and "blocked in the sandbox" in r.stderr


def test_it_has_every_layer_as_root():
    if os.geteuid() != 0:
        pytest.skip("the full set of layers needs root (as in the worker images' CI)")
    r = run_python("print(1)")
    assert {"pidns", "netns", "mountns", "readonly-fs", "masked-paths", "private-proc", "private-tmpfs", "nobody", "no-caps",
            "no-new-privs", "rlimits", "landlock", "seccomp", "audit"} <= set(r.isolation), r.isolation
    assert set(sandbox.EXPECTED_LAYERS) <= set(r.isolation)


def test_it_caps_unbounded_stderr_too():
    start = time.monotonic()
    r = run_python("import sys\nwhile True:\n    sys.stderr.write('e' * 4096)", max_output_bytes=8192, timeout_s=5)
    assert r.output_truncated and r.error == "output limit" and len(r.stderr) == 8192
    assert time.monotonic() - start < 2.0


def test_it_kills_a_loop_that_ignores_signals():
    code = "import signal\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass"
    r = run_python(code, timeout_s=1.0)
    assert r.timed_out and r.error == "timeout" and r.duration_s < 2.5


def test_it_kills_a_loop_spinning_inside_c():
    r = run_python("import re\nre.match(r'(a+)+$', 'a' * 64 + 'b')", timeout_s=1.0)  # catastrophic backtracking
    assert r.timed_out and r.duration_s < 2.5


def test_it_hides_the_parents_environment(monkeypatch):
    monkeypatch.setenv("TROUPE_FAKE_SECRET", "s3cr3t-" + uuid.uuid4().hex)
    code = "import os\nprint(open(f'/proc/{os.getppid()}/environ', 'rb').read())"
    r = run_python(code)
    assert blocked(r) and "s3cr3t" not in r.stdout
    r = kernel_only(code)
    if "nobody" not in r.isolation:
        pytest.skip("no uid switch here")
    assert r.exit_code != 0 and "s3cr3t" not in r.stdout + r.stderr


def test_it_hides_the_data_dir(monkeypatch, tmp_path: Path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "troupe.sqlite3").write_text("the database")
    monkeypatch.setenv("TROUPE_SANDBOX_HIDE", str(data))
    code = f"print(open({str(data / 'troupe.sqlite3')!r}).read())"
    assert blocked(run_python(code))
    r = kernel_only(code)
    if "masked-paths" not in r.isolation:
        pytest.skip("no private mount namespace here")
    assert r.exit_code != 0 and "the database" not in r.stdout


def test_it_blocks_udp():
    code = "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.sendto(b'x', ('8.8.8.8', 53))\nprint('sent')"
    assert blocked(run_python(code))
    r = kernel_only(code)
    if "netns" not in r.isolation:
        pytest.skip("no network namespace here")
    assert r.exit_code != 0 and "sent" not in r.stdout


def test_it_blocks_writing_to_shared_memory():
    name = f"/dev/shm/troupe-escape-{uuid.uuid4().hex}"
    assert blocked(run_python(f"open({name!r}, 'w').write('x')"))
    r = kernel_only(f"open({name!r}, 'w').write('x')")
    assert not Path(name).exists()
    if {"masked-paths", "nobody"} & set(r.isolation):
        assert r.exit_code != 0


def test_the_memory_limit_holds_without_the_audit_hook():
    r = kernel_only("x = bytearray(2 * 10**9)", memory_mb=128)
    assert r.error == "memory limit" and "MemoryError" in r.stderr

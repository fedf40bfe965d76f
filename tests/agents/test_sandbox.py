"""The sandbox: limits, isolation and output handling for model-written code.

Each escape is tried twice where the machine allows: through `run_python` (every layer), and
with the Python audit hook switched off (`_run(audit_hook=False)`) to show that the kernel
layers (namespaces, uid switch, rlimits, Landlock, seccomp) hold on their own. Kernel-only checks skip when the
layer they rely on could not be set up here (for example in a container without namespaces).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from agents import sandbox
from agents.sandbox import SandboxResult, run_python

REPO = Path(sandbox.__file__).resolve().parent.parent
PG_SOCKET = "/var/run/postgresql/.s.PGSQL.5432"


def kernel_only(code: str, **kw: object) -> SandboxResult:
    args: dict = {"timeout_s": 2.0, "memory_mb": 256, "max_output_bytes": 16_384, "files": {}, "stdin": ""}
    args.update(kw)
    return sandbox._run(code, audit_hook=False, **args)


def blocked(r: SandboxResult) -> bool:
    return r.exit_code != 0 and "blocked in the sandbox" in r.stderr


def test_it_runs_simple_code() -> None:
    r = run_python("print('hello')")
    assert r.ok and r.stdout == "hello\n" and r.stderr == ""
    assert r.error is None and not r.timed_out and not r.output_truncated
    assert {"audit", "rlimits"} <= set(r.isolation)


def test_it_reports_exceptions_with_a_clean_traceback() -> None:
    r = run_python("x = 1\nraise ValueError('nope')")
    assert not r.ok and r.exit_code == 1 and r.error is None
    assert 'File "main.py", line 2' in r.stderr and "ValueError: nope" in r.stderr
    assert "_sandbox_child" not in r.stderr


def test_it_passes_stdin_and_files_and_imports_the_stdlib() -> None:
    code = "import json, math\nfrom helper import double\nn = int(input())\nprint(double(n), open('data.txt').read(), math.gcd(12, 18))"
    r = run_python(code, stdin="21\n", files={"data.txt": "hi", "helper.py": "def double(x):\n    return 2 * x\n"})
    assert r.ok, r.stderr
    assert r.stdout.split() == ["42", "hi", "6"]


def test_it_rejects_file_names_outside_the_workdir() -> None:
    for name in ["/etc/x", "../x", "a/../../x"]:
        with pytest.raises(ValueError):
            run_python("pass", files={name: ""})


def test_it_stops_an_infinite_loop_at_the_timeout() -> None:
    r = run_python("while True:\n    pass", timeout_s=1.0)
    assert r.timed_out and r.error == "timeout" and not r.ok
    assert r.duration_s < 2.0


def test_it_keeps_output_printed_before_a_timeout() -> None:
    r = run_python("print('partial')\nwhile True:\n    pass", timeout_s=1.0)
    assert r.timed_out and r.stdout == "partial\n"


def test_it_stops_a_memory_bomb() -> None:
    r = run_python("x = bytearray(10**9)", memory_mb=128)
    assert r.error == "memory limit" and "MemoryError" in r.stderr
    r = run_python("chunks = []\nwhile True:\n    chunks.append(bytearray(10**6))", memory_mb=128, timeout_s=3)
    assert r.error == "memory limit"


def test_it_blocks_a_fork_bomb() -> None:
    r = run_python("import os\nwhile True:\n    os.fork()")
    assert blocked(r)
    # a generous wall clock: on a loaded machine the child's start alone can take seconds
    r = run_python("import subprocess\nsubprocess.run(['echo', 'escaped'])", timeout_s=60)
    assert blocked(r) and "escaped" not in r.stdout
    r = run_python("import os\nos.system('echo escaped')", timeout_s=60)
    assert blocked(r) and "escaped" not in r.stdout


def test_it_blocks_forking_without_the_audit_hook() -> None:
    r = kernel_only("import os\nos.fork()\nprint('forked')")
    if "seccomp" not in r.isolation and os.geteuid() == 0 and "nobody" not in r.isolation:
        pytest.skip("no seccomp, and root could not switch to an unprivileged uid here, so RLIMIT_NPROC does not apply")
    assert r.exit_code != 0 and "forked" not in r.stdout
    # seccomp refuses clone with EPERM; without it, RLIMIT_NPROC makes fork fail with EAGAIN
    refusal = "PermissionError: [Errno 1]" if "seccomp" in r.isolation else "BlockingIOError"
    assert refusal in r.stderr, r.stderr


def test_it_blocks_threads() -> None:
    r = run_python("import threading\nt = threading.Thread(target=print)\nt.start()")
    assert r.exit_code != 0 and "can't start new thread" in r.stderr


def test_it_blocks_writing_outside_its_directory() -> None:
    target = Path(f"/tmp/troupe-sandbox-escape-{uuid.uuid4().hex}")
    r = run_python(f"open({str(target)!r}, 'w').write('x')")
    assert blocked(r) and not target.exists()
    r = run_python("import os\nprint(os.getcwd())\nopen('../escape-up', 'w').write('x')")
    assert blocked(r)
    workdir = Path(r.stdout.strip())
    assert not (workdir.parent / "escape-up").exists()
    assert not workdir.exists()  # the throwaway directory is gone


def test_it_blocks_writing_outside_its_directory_without_the_audit_hook() -> None:
    target = Path(f"/tmp/troupe-sandbox-escape-{uuid.uuid4().hex}")
    r = kernel_only(f"open({str(target)!r}, 'w').write('x')")
    if not {"readonly-fs", "nobody"} & set(r.isolation) and os.geteuid() == 0:
        pytest.skip("no read-only mounts and no uid switch here")
    assert r.exit_code != 0 and not target.exists()


def test_it_allows_writing_inside_its_directory() -> None:
    r = run_python("import os\nos.makedirs('sub', exist_ok=True)\nopen('sub/a.txt', 'w').write('ok')\nprint(open('sub/a.txt').read())")
    assert r.ok and r.stdout == "ok\n", r.stderr


def test_it_blocks_reading_the_project() -> None:
    for path in [REPO / "agents" / "base.py", REPO / "agents" / "sandbox.py", Path("/etc/passwd")]:
        r = run_python(f"print(open({str(path)!r}).read()[:50])")
        assert blocked(r) and r.stdout == "", path
    r = run_python(f"import os\nprint(os.listdir({str(REPO)!r}))")
    assert blocked(r)


def test_it_blocks_reading_through_a_symlink() -> None:
    r = run_python(f"import os\nos.symlink({str(REPO / 'agents' / 'base.py')!r}, 'link')\nprint(open('link').read())")
    assert blocked(r) and r.stdout == ""


def test_it_hides_the_project_without_the_audit_hook() -> None:
    r = kernel_only(f"print(open({str(REPO / 'agents' / 'base.py')!r}).read()[:50])")
    if "masked-paths" not in r.isolation:
        pytest.skip("no private mount namespace here")
    assert r.exit_code != 0 and "FileNotFoundError" in r.stderr and r.stdout == ""


@pytest.mark.parametrize("address", [("127.0.0.1", 5432), ("1.1.1.1", 53)])
def test_it_blocks_the_network(address: tuple[str, int]) -> None:
    code = f"import socket\ns = socket.socket()\ns.settimeout(1)\ns.connect({address!r})\nprint('connected')"
    r = run_python(code)
    assert blocked(r) and "connected" not in r.stdout


@pytest.mark.parametrize("address", [("127.0.0.1", 5432), ("1.1.1.1", 53)])
def test_it_blocks_the_network_without_the_audit_hook(address: tuple[str, int]) -> None:
    code = f"import socket\ns = socket.socket()\ns.settimeout(1)\ns.connect({address!r})\nprint('connected')"
    r = kernel_only(code)
    if not {"netns", "seccomp"} & set(r.isolation):
        pytest.skip("no network namespace and no seccomp here")
    assert r.exit_code != 0 and "connected" not in r.stdout
    # seccomp refuses the socket itself; a network namespace alone has no route anywhere
    refusal = "PermissionError: [Errno 1]" if "seccomp" in r.isolation else "Network is unreachable"
    assert refusal in r.stderr, r.stderr


def test_it_blocks_local_unix_sockets() -> None:
    if not os.path.exists(PG_SOCKET):
        pytest.skip("no PostgreSQL unix socket on this machine")
    code = f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({PG_SOCKET!r})\nprint('connected')"
    assert blocked(run_python(code))
    r = kernel_only(code)
    if "masked-paths" in r.isolation:
        assert r.exit_code != 0 and "connected" not in r.stdout


def test_it_blocks_ctypes() -> None:
    r = run_python("import ctypes\nctypes.CDLL(None).unshare(0)")
    assert blocked(r)


def test_it_truncates_huge_output_and_stops_the_program() -> None:
    r = run_python("while True:\n    print('x' * 1000)", max_output_bytes=16_384, timeout_s=5)
    assert r.output_truncated and r.error == "output limit" and not r.timed_out  # stopped at the cap, not at the timeout
    assert len(r.stdout) == 16_384


def test_it_does_not_flag_output_under_the_cap() -> None:
    r = run_python("print('y' * 999)", max_output_bytes=1000)
    assert r.ok and not r.output_truncated and len(r.stdout) == 1000


def test_it_gives_the_child_a_clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TROUPE_TEST_SECRET", "s3cret")
    r = run_python("import os\nprint(sorted(os.environ))")
    assert r.ok and "TROUPE_TEST_SECRET" not in r.stdout and "s3cret" not in r.stdout


def test_it_hashes_strings_reproducibly() -> None:
    code = "print(list({'alpha', 'beta', 'gamma', 'delta'}))"
    assert run_python(code).stdout == run_python(code).stdout


def test_it_runs_under_the_private_umask_of_the_web_and_the_workers() -> None:
    """The web process and the workers run with umask 077 (webapp/core/private.py); the mount
    points the sandbox makes on the way to the interpreter must still let the code's user through."""
    old = os.umask(0o077)
    try:
        r = run_python("import threading, json\nprint(json.dumps(threading.active_count()))")
    finally:
        os.umask(old)
    assert r.ok and r.stdout.strip() == "1", r.stderr[-500:]

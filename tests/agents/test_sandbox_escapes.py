"""More escapes tried against the sandbox, beyond test_sandbox.py: unbounded output on stderr,
loops that ignore signals or spin inside C, the parent's environment (where secrets live), the
data directory, UDP, shared memory, and the memory limit without the audit hook. As in
test_sandbox.py, kernel-only checks (`_run(audit_hook=False)`) skip when the layer they rely on
could not be set up on this machine; as root here, every layer takes hold. The attacks on other
processes, tried as root and as an ordinary user, are in test_sandbox_attacks.py."""

from __future__ import annotations

import os
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
    r = run_python("import sys\nwhile True:\n    sys.stderr.write('e' * 4096)", max_output_bytes=8192, timeout_s=5)
    assert r.output_truncated and r.error == "output limit" and len(r.stderr) == 8192
    assert not r.timed_out  # stopped at the cap, not at the timeout


def test_it_kills_a_loop_that_ignores_signals():
    code = "import signal\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass"
    r = run_python(code, timeout_s=1.0)
    assert r.timed_out and r.error == "timeout" and r.duration_s < 2.5


@pytest.mark.parametrize("namespaces", [True, False])
def test_a_program_that_hangs_is_killed_at_its_timeout(namespaces: bool):
    # Issue 45, class 5: a child asleep forever, deaf to SIGTERM, using no CPU (so no CPU limit
    # ends it); the worker must not wait on it past the deadline, whether the code runs as pid 2
    # of its own namespace (the started process then waits on it) or directly. (A child that
    # stops itself is woken by the disk budget's SIGCONT and goes on.)
    code = ("import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('waiting', flush=True)\n"
            "while True:\n    signal.pause()")
    r = sandbox._run(code, audit_hook=True, namespaces=namespaces, timeout_s=1.0, memory_mb=256, max_output_bytes=4096, files={},
                     stdin="")
    if r.error == "sandbox setup failed":
        pytest.skip(r.stderr.strip())
    assert r.timed_out and r.error == "timeout" and r.stdout == "waiting\n" and r.duration_s < 10, r


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


FILL_DISK = """i = 0
while True:
    with open(f"f{i}", "wb") as f:
        f.write(b"x" * (8 * 1024 * 1024 - 1))  # under RLIMIT_FSIZE, so only the total can stop it
    i += 1
    print(i, flush=True)
"""


@pytest.mark.parametrize("namespaces", [True, False])
def test_one_call_cannot_fill_the_disk(namespaces: bool):
    # Without a mount namespace the working directory is on the host's /tmp: the parent's byte
    # budget ends the run; with one, the private tmpfs is full at DISK_MB (ENOSPC).
    r = sandbox._run(FILL_DISK, audit_hook=False, namespaces=namespaces, timeout_s=60.0, memory_mb=256,
                     max_output_bytes=4096, files={}, stdin="")
    assert r.error == "disk limit" and not r.timed_out, (r.error, r.stderr[-300:])
    files = int(r.stdout.split()[-1]) if r.stdout.strip() else 0
    # Past the budget by what the code writes before the parent's next walk (every 10 ms, when it gets
    # the CPU; the code is stopped while the walk runs): measured at most 1.75 budgets with 4 busy
    # processes on 2 cores. A bound of a few budgets, never gigabytes.
    assert files * 8 <= 4 * sandbox.DISK_MB


def test_closing_its_output_does_not_escape_the_disk_budget():
    code = "import os\nos.close(1)\nos.close(2)\n" + FILL_DISK.replace("    print(i, flush=True)\n", "")
    r = sandbox._run(code, audit_hook=False, namespaces=False, timeout_s=60.0, memory_mb=256, max_output_bytes=4096,
                     files={}, stdin="")
    assert r.error == "disk limit" and not r.timed_out


def test_many_small_files_or_a_hidden_directory_end_the_run(monkeypatch):
    monkeypatch.setattr(sandbox, "DISK_FILES", 500)  # the same check as at 10,000 files, in less time
    r = sandbox._run("i = 0\nwhile True:\n    open(f'f{i}', 'w').close()\n    i += 1", audit_hook=False, namespaces=False,
                     timeout_s=60.0, memory_mb=256, max_output_bytes=4096, files={}, stdin="")
    assert r.error == "disk limit"
    code = "import os\nos.makedirs('d/e')\nos.chmod('d', 0)\nwhile True:\n    pass"
    if os.geteuid() == 0:  # root reads a mode-0 directory: nothing is hidden from it, and the run goes on
        code = code.replace("while True:\n    pass", "print('made')")
        r = sandbox._run(code, audit_hook=False, namespaces=False, timeout_s=20.0, memory_mb=256, max_output_bytes=4096,
                         files={}, stdin="")
        assert r.ok and r.stdout == "made\n", r.stderr
    else:  # the same uid cannot read it: the walk cannot count what is inside, so the run ends
        r = sandbox._run(code, audit_hook=False, namespaces=False, timeout_s=60.0, memory_mb=256, max_output_bytes=4096,
                         files={}, stdin="")
        assert r.error == "disk limit" and not r.timed_out


# The audit hook is a first line only. These go around it; the kernel layers must answer. The
# attempts only the hook refuses run with the hook on, and name files that do not exist.
HOOK_BYPASSES = """import os, sys
def attempt(name, fn):
    try:
        fn()
    except OSError as e:
        print(name, "refused", e.errno)
    else:
        print(name, "ESCAPED")
lib = os.path.dirname(os.__file__)
fd = os.open(lib, os.O_RDONLY)  # a directory the hook lets it read
attempt("create by dir_fd", lambda: os.open("troupe-planted.py", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
if HOOK:
    attempt("unlink by dir_fd", lambda: os.unlink("troupe-no-such-file.py", dir_fd=fd))
    attempt("mkdir by dir_fd", lambda: os.mkdir("troupe-planted", dir_fd=fd))
    attempt("replace out", lambda: os.replace("a", "/tmp/troupe-replaced-" + TAG))
    attempt("code object", lambda: (lambda: 0).__code__.replace(co_consts=(1,)))
frame = sys._getframe()
while frame.f_back is not None:
    frame = frame.f_back
print("libc reachable", "_libc" in frame.f_globals or "ctypes" in frame.f_globals)
import tempfile, shutil
with tempfile.TemporaryDirectory(dir=".") as d:  # rmtree inside the workdir still works (path-based in the sandbox)
    os.makedirs(os.path.join(d, "x", "y"))
    open(os.path.join(d, "x", "y", "z"), "w").close()
    shutil.rmtree(os.path.join(d, "x"))
print("cleaned", sorted(os.listdir(".")))
"""


@pytest.mark.parametrize("audit_hook", [True, False])
def test_the_audit_hooks_blind_spots_are_closed_without_landlock(audit_hook: bool):
    # dir_fd paths: the hook cannot see the fd the kernel resolves against; seccomp refuses a
    # write-open by dir_fd, and the hook checks the dir_fd of the events that carry one. The
    # bootstrap's frame, reachable below the model's code, holds no libc handle any more.
    tag = uuid.uuid4().hex
    code = f"HOOK = {audit_hook}\nTAG = {tag!r}\n" + HOOK_BYPASSES
    r = sandbox._run(code, audit_hook=audit_hook, namespaces=False, landlock_abi=0, timeout_s=20.0, memory_mb=256,
                     max_output_bytes=8192, files={"a": "x"}, stdin="")
    if r.error == "sandbox setup failed":
        # root, and the sandbox user cannot reach this interpreter's library: it must refuse to
        # run the code as uid 0 with neither read-only mounts nor Landlock
        assert os.geteuid() == 0 and "would run as root" in r.stderr, r.stderr
        return
    assert r.ok, r.stderr
    assert "ESCAPED" not in r.stdout and "libc reachable False" in r.stdout and "cleaned ['a']" in r.stdout, r.stdout
    assert "landlock" not in r.isolation and "seccomp" in r.isolation
    assert "create by dir_fd refused 1\n" in r.stdout  # seccomp's EPERM, before the hook or file modes
    if audit_hook:
        for name in ("unlink by dir_fd", "mkdir by dir_fd", "replace out", "code object"):
            assert f"{name} refused None" in r.stdout, r.stdout
    assert not Path(f"/tmp/troupe-replaced-{tag}").exists()


def test_it_never_runs_code_as_root_without_a_filesystem_layer():
    if os.geteuid() != 0:
        pytest.skip("the suite does not run as root")
    r = sandbox._run("import os\nprint(os.geteuid())", audit_hook=True, namespaces=False, landlock_abi=0, timeout_s=20.0,
                     memory_mb=256, max_output_bytes=4096, files={}, stdin="")
    # either it switched to nobody, or it refused to start
    assert (r.ok and r.stdout == "65534\n" and "nobody" in r.isolation) or (
        r.error == "sandbox setup failed" and "would run as root" in r.stderr), (r.stdout, r.stderr)


@pytest.mark.parametrize("kernel, abi", [("5.15", 1), ("6.1", 2), ("6.8", 4), ("no landlock", 0)])
def test_the_standard_library_works_on_older_kernels(kernel: str, abi: int):
    code = """import fcntl, hashlib, os, select, shutil, sqlite3, tempfile, termios
db = sqlite3.connect("t.db")
db.execute("create table t (x)")
db.execute("insert into t values (42)")
db.commit()
with tempfile.TemporaryDirectory() as d:
    open(os.path.join(d, "a"), "w").write("x")
    shutil.move(os.path.join(d, "a"), "b")  # across directories: Landlock ABI 1 refuses rename there, move copies
r, w = os.pipe()
os.set_blocking(r, False)
print(db.execute("select x from t").fetchone()[0], open("b").read(), os.isatty(0), os.get_blocking(r), sorted(os.listdir(".")))
"""
    r = sandbox._run(code, audit_hook=True, namespaces=False, landlock_abi=abi, timeout_s=20.0, memory_mb=256,
                     max_output_bytes=4096, files={}, stdin="")
    if abi == 0 and os.geteuid() == 0 and r.error == "sandbox setup failed":
        pytest.skip("as root, with nobody unable to reach this interpreter, no Landlock means no run (see the test above)")
    assert r.ok, (kernel, r.stderr)
    assert r.stdout == "42 x False False ['b', 't.db']\n", (kernel, r.stdout)

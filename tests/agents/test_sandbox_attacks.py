"""Attacks from model-written code on the processes around it, tried as each user a worker runs as.

Every test runs once per `user`:

- "root": as CI and a root worker run (the code itself then runs as nobody);
- "uid 1000": an ordinary user, as the Docker image runs (here it may get a user namespace);
- "uid 1000, no namespaces": the same user on a host that grants it none (a container's default
  seccomp profile, say): seccomp, Landlock and rlimits on their own (`_run(namespaces=False)`).

The sandbox is called from a helper process started as that user (with `setpriv` when the suite
runs as root). The helper stands in for the worker: it is the parent the attacks aim at, and a
test fails if it does not come back with its result. The "other process" is a decoy `sleep` of
the sandboxed code's own uid (nobody for root, as another sandbox would be), which the test ends
itself with SIGTERM afterwards: had an attack killed it, its exit status would say SIGKILL.

Attacks through `os` run with the audit hook on and off; those through ctypes with it off, so
that only the kernel layers stand in the way. The attacks whose answer depends on the kernel also
run with Landlock held to the ABI of each kernel teams run (`KERNELS`: 5.15, 6.1, 6.8, 6.12) and
with no Landlock at all, so that what only the newest kernel provides is never load-bearing. Each attack prints "<name> refused <errno>" or
"<name> ESCAPED"; where seccomp took hold, the calls it filters must fail with EPERM (1).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agents import sandbox
from agents.sandbox import SandboxResult

AGENTS = Path(sandbox.__file__).resolve().parent
UNPRIVILEGED = 1000
NOBODY = 65534

# Independent of the filter's own table: the syscall numbers an attacker would type.
SYS = {
    "x86_64": {"tkill": 200, "rt_tgsigqueueinfo": 297, "kcmp": 312, "clone": 56, "clone3": 435, "bpf": 321,
               "perf_event_open": 298, "userfaultfd": 323, "keyctl": 250, "io_uring_setup": 425, "pidfd_getfd": 438},
    "aarch64": {"tkill": 130, "rt_tgsigqueueinfo": 240, "kcmp": 272, "clone": 220, "clone3": 435, "bpf": 280,
                "perf_event_open": 241, "userfaultfd": 282, "keyctl": 219, "io_uring_setup": 425, "pidfd_getfd": 438},
}.get(os.uname().machine, {})

ATTEMPT = """
import os, signal, sys
def attempt(name, fn):
    try:
        fn()
    except OSError as e:
        print(name, "refused", e.errno)
    except Exception as e:
        print(name, "refused", type(e).__name__)
    else:
        print(name, "ESCAPED")
"""

CTYPES = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
def ok(ret):
    if ret == -1:
        raise OSError(ctypes.get_errno(), "failed")
    return ret
def syscall(nr, *args):
    return ok(libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args]))
"""

# The helper: run as the user under test, it calls the sandbox (it is the sandboxed code's parent)
# and prints the results as JSON. Before that it opens an inheritable file (FD) that must not reach
# the child, and keeps a secret in its memory at ADDR that the child must not read.
HELPER = """
import dataclasses, json, os, resource, sys
sys.path.insert(0, sys.argv[1])
from agents import sandbox
secret = ("troupe-parent-secret-" + os.environ["TROUPE_MARKER"]).encode()
fd = os.open(os.environ["TROUPE_DECOY_FILE"], os.O_RDONLY)
os.set_inheritable(fd, True)
data_fd = -1
if os.environ.get("TROUPE_SECRET_DIR"):  # a worker's data dir, held open as a directory descriptor
    data_fd = os.open(os.environ["TROUPE_SECRET_DIR"], os.O_RDONLY | os.O_DIRECTORY)
    os.set_inheritable(data_fd, True)
before = [resource.getrlimit(resource.RLIMIT_NOFILE), os.getpriority(os.PRIO_PROCESS, 0), sorted(os.sched_getaffinity(0))]
prelude = f"PARENT = {os.getpid()}\\nFD = {fd}\\nDATAFD = {data_fd}\\nADDR = {id(secret)}\\nSECRET_LEN = {len(secret) + 64}\\n"
results = []
for run in json.loads(sys.argv[2]):
    r = sandbox._run(prelude + run["code"], audit_hook=run["audit_hook"], namespaces=run["namespaces"], timeout_s=20.0,
                     memory_mb=256, max_output_bytes=65536, files={}, stdin="", landlock_abi=run.get("landlock_abi"))
    results.append(dataclasses.asdict(r))
after = [resource.getrlimit(resource.RLIMIT_NOFILE), os.getpriority(os.PRIO_PROCESS, 0), sorted(os.sched_getaffinity(0))]
caps = sandbox.capabilities() if len(sys.argv) > 3 else None
print(json.dumps({"results": results, "unchanged": before == after, "capabilities": caps}))
"""


@dataclass(frozen=True)
class Attempt:
    """One sandboxed run, and what became of the helper (its parent) around it."""

    result: SandboxResult
    parent_unchanged: bool
    """The helper's own rlimits, priority and CPU affinity were the same after the run."""

    @property
    def out(self) -> str:
        return self.result.stdout

    def kernel_refused(self, *names: str) -> bool:
        """Each named attack ran and failed with EPERM, as the seccomp filter answers."""
        return all(f"{name} refused 1\n" in self.out for name in names)


@dataclass(frozen=True)
class User:
    """Who runs the sandbox, and how the tests start processes as them."""

    name: str
    as_user: tuple[str, ...]
    """The command prefix that runs a program as this user (empty: as the suite itself)."""
    code_uid: int
    """The uid the sandboxed code ends up with, and that decoys get."""
    as_code_uid: tuple[str, ...]
    python: str
    namespaces: bool
    code_dir: Path
    """Where the helper imports `agents.sandbox` from."""

    def run_helper(self, runs: list[dict], *, capabilities: bool = False, env: dict[str, str] | None = None,
                   cwd: str = "/") -> dict:
        """`env` is added to the helper's environment (TROUPE_SECRET_DIR: a directory it holds open)."""
        with tempfile.NamedTemporaryFile("w", prefix="troupe-decoy-fd-") as decoy_file:
            decoy_file.write("troupe-parent-file")
            decoy_file.flush()
            os.chmod(decoy_file.name, 0o644)
            env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "TROUPE_MARKER": uuid.uuid4().hex,
                   "TROUPE_DECOY_FILE": decoy_file.name, **(env or {})}
            argv = [*self.as_user, self.python, "-s", "-B", "-c", HELPER, str(self.code_dir), json.dumps(runs)]
            proc = subprocess.run(argv + (["capabilities"] if capabilities else []), env=env, cwd=cwd,
                                  capture_output=True, text=True, timeout=120)
        # The parent survived and was not disturbed: it came back and printed its report.
        assert proc.returncode == 0, f"the sandbox's parent did not come back ({proc.returncode}): {proc.stderr[-2000:]}"
        return json.loads(proc.stdout.strip().rsplit("\n", 1)[-1])

    def run_all(self, code: str, *, audit_hooks: tuple[bool, ...] = (True, False), landlock_abis: tuple[int | None, ...] = (None,)
                ) -> list[Attempt]:
        """Run `code` once per (audit hook, Landlock ABI) pair, in that order, in one helper."""
        runs = [{"code": ATTEMPT + code, "audit_hook": hook, "namespaces": self.namespaces, "landlock_abi": abi}
                for hook in audit_hooks for abi in landlock_abis]
        report = self.run_helper(runs)
        attempts = []
        for r in report["results"]:
            result = SandboxResult(**{**r, "isolation": tuple(r["isolation"])})
            assert result.exit_code == 0 and result.error is None, result
            assert "ESCAPED" not in result.stdout, result.stdout
            attempts.append(Attempt(result, report["unchanged"]))
        return attempts

    def start_decoy(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen([*self.as_code_uid, "sleep", "600"], env={"PATH": "/usr/bin:/bin"}, start_new_session=True)


def _as(uid: int) -> tuple[str, ...]:
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is needed to run the sandbox as another uid")
    return (setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups")


@pytest.fixture(scope="session")
def code_dir() -> Iterator[Path]:
    """A copy of the sandbox's two modules (standard library only) that any uid can read, so
    that the tests do not depend on the checkout being readable by uid 1000."""
    root = Path(tempfile.mkdtemp(prefix="troupe-sandbox-code-"))
    try:
        root.chmod(0o755)
        (root / "agents").mkdir()
        (root / "agents").chmod(0o755)  # not mkdir's mode, which the umask masks: a test that imported webapp.asgi set it to 077
        (root / "agents" / "__init__.py").write_text("")
        for name in ("sandbox.py", "_sandbox_child.py"):
            shutil.copy(AGENTS / name, root / "agents" / name)
        for path in (root / "agents").iterdir():
            path.chmod(0o644)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@functools.cache
def _python_for(as_user: tuple[str, ...], code_dir: Path) -> str | None:
    """An interpreter (3.11+) that `as_user` can run the sandbox with: the suite's own where its
    directories are open to that user (CI's image), otherwise the system's."""
    candidates = [os.path.realpath(sys.executable), "/usr/local/bin/python3", "/usr/bin/python3"]
    # The sandbox starts its child with the real path of the interpreter it runs in: that must work too.
    check = (
        f"import os, subprocess, sys; sys.path.insert(0, {str(code_dir)!r}); import agents.sandbox; "
        "sys.exit(sys.version_info < (3, 11) or subprocess.run([os.path.realpath(sys.executable), '-S', '-c', '']).returncode)"
    )
    for python in dict.fromkeys(candidates):
        try:
            if subprocess.run([*as_user, python, "-s", "-c", check], cwd="/", capture_output=True, timeout=60).returncode == 0:
                return python
        except OSError:
            continue
    return None


USERS = ["root", "uid 1000", "uid 1000, no namespaces"]

KERNELS = {"no landlock": 0, "5.15": 1, "6.1": 2, "6.8": 4, "6.12": 6, "this kernel": None}
"""The Landlock ABI each kernel teams run reports (Ubuntu 22.04, Debian 12, Ubuntu 24.04, 6.12 on),
and none at all: the tests hold Landlock to it to show what holds there."""


@pytest.fixture(params=USERS)
def user(request: pytest.FixtureRequest, code_dir: Path) -> User:
    root = os.geteuid() == 0
    if request.param == "root":
        if not root:
            pytest.skip("the suite does not run as root")
        as_user: tuple[str, ...] = ()
        code_uid, as_code_uid = NOBODY, _as(NOBODY)
    elif root:
        as_user = _as(UNPRIVILEGED)
        code_uid, as_code_uid = UNPRIVILEGED, as_user
    else:  # the suite already runs as an ordinary user
        as_user, code_uid, as_code_uid = (), os.geteuid(), ()
    python = _python_for(as_user, code_dir)
    if python is None:
        pytest.skip(f"no Python 3.11+ that {request.param} can run")
    return User(request.param, as_user, code_uid, as_code_uid, python, "no namespaces" not in request.param, code_dir)


@pytest.fixture
def decoy(user: User) -> Iterator[subprocess.Popen[bytes]]:
    """Another process of the sandboxed code's uid, which every test checks is still alive."""
    proc = user.start_decoy()
    yield proc
    # Only SIGTERM from here: had an attack killed it, it would have died of SIGKILL.
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM, "an attack reached the decoy process"


def test_it_cannot_signal_its_parent_or_another_process(user: User, decoy: subprocess.Popen[bytes]) -> None:
    code = f"""DECOY = {decoy.pid}
attempt("kill parent", lambda: os.kill(PARENT, signal.SIGKILL))
attempt("kill decoy", lambda: os.kill(DECOY, signal.SIGKILL))
attempt("kill decoy's group", lambda: os.kill(-DECOY, signal.SIGKILL))
attempt("killpg decoy", lambda: os.killpg(DECOY, signal.SIGKILL))
attempt("pidfd parent", lambda: signal.pidfd_send_signal(os.pidfd_open(PARENT), signal.SIGKILL))
attempt("pidfd decoy", lambda: signal.pidfd_send_signal(os.pidfd_open(DECOY), signal.SIGKILL))
attempt("proc dir as pidfd", lambda: signal.pidfd_send_signal(os.open(f"/proc/{{DECOY}}", os.O_RDONLY), signal.SIGKILL))
if os.getppid() > 1:
    attempt("kill ppid", lambda: os.kill(os.getppid(), signal.SIGKILL))
"""
    with_hook, without = user.run_all(code)
    for a in (with_hook, without):
        assert "kill decoy refused" in a.out and "pidfd parent refused" in a.out
    if "seccomp" in without.result.isolation:
        assert without.kernel_refused("kill parent", "kill decoy", "kill decoy's group", "killpg decoy", "pidfd parent", "pidfd decoy")
    # The same through libc, and the calls `os` has no function for.
    code = CTYPES + f"""DECOY = {decoy.pid}
info = ctypes.create_string_buffer(128)
pidfd = -1
attempt("libc kill", lambda: ok(libc.kill(DECOY, 9)))
attempt("libc tgkill", lambda: ok(libc.tgkill(DECOY, DECOY, 9)))
attempt("tkill", lambda: syscall({SYS["tkill"]}, DECOY, 9))
attempt("sigqueue", lambda: ok(libc.sigqueue(DECOY, 9, ctypes.c_void_p(0))))
attempt("rt_tgsigqueueinfo", lambda: syscall({SYS["rt_tgsigqueueinfo"]}, DECOY, DECOY, 9, ctypes.addressof(info)))
attempt("libc pidfd_open", lambda: ok(libc.pidfd_open(PARENT, 0)))
attempt("libc pidfd_send_signal", lambda: ok(libc.pidfd_send_signal(0, 9, None, 0)))
attempt("pidfd_getfd", lambda: syscall({SYS["pidfd_getfd"]}, 0, 0, 0))
"""
    (a,) = user.run_all(code, audit_hooks=(False,))
    assert "libc kill refused" in a.out and "pidfd_getfd refused" in a.out
    if "seccomp" in a.result.isolation:
        assert a.kernel_refused("libc kill", "libc tgkill", "tkill", "sigqueue", "rt_tgsigqueueinfo", "libc pidfd_open",
                                "libc pidfd_send_signal", "pidfd_getfd")


def test_it_cannot_signal_its_group_or_every_process(user: User, decoy: subprocess.Popen[bytes]) -> None:
    # kill(-1) and kill(0) reach every process the sender may signal. Try them only where the
    # sandboxed code is proven to run as an unprivileged uid behind the filter; the decoy is
    # one such process.
    (probe,) = user.run_all("print('uid', os.geteuid())", audit_hooks=(False,))
    if "seccomp" not in probe.result.isolation or "uid 0\n" in probe.out:
        pytest.skip("no seccomp filter here, or the code would run as root: too dangerous to try")
    code = """
attempt("kill(0)", lambda: os.kill(0, signal.SIGKILL))
attempt("killpg(0)", lambda: os.killpg(0, signal.SIGKILL))
attempt("kill(-pgrp)", lambda: os.kill(-os.getpgrp(), signal.SIGKILL))
attempt("kill(-1)", lambda: os.kill(-1, signal.SIGKILL))
attempt("kill(1)", lambda: os.kill(1, signal.SIGKILL))
attempt("kill(1, SIGTERM)", lambda: os.kill(1, signal.SIGTERM))
print("still here")
"""
    (a,) = user.run_all(code, audit_hooks=(False,))
    assert a.out.endswith("still here\n")  # the group it shares with the sandbox's own processes lives on
    assert a.kernel_refused("kill(0)", "killpg(0)", "kill(-pgrp)", "kill(-1)", "kill(1)", "kill(1, SIGTERM)")


def test_it_still_signals_itself(user: User) -> None:
    code = """import threading
got = []
signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
os.kill(os.getpid(), signal.SIGUSR1)
signal.raise_signal(signal.SIGUSR1)
signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
print("handled", len(got))
"""
    for a in user.run_all(code):
        assert "handled 3" in a.out
    # and a signal it sends itself ends it as it would anywhere, reported as such
    report = user.run_helper([{"code": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "audit_hook": True,
                               "namespaces": user.namespaces}])
    (r,) = report["results"]
    assert r["exit_code"] == -signal.SIGKILL and r["error"] == "killed by SIGKILL"


def test_it_cannot_trace_or_read_another_process(user: User, decoy: subprocess.Popen[bytes]) -> None:
    code = f"""DECOY = {decoy.pid}
def read(path, offset=0):
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(SECRET_LEN)
attempt("parent's memory", lambda: read(f"/proc/{{PARENT}}/mem", ADDR))
attempt("parent's environ", lambda: read(f"/proc/{{PARENT}}/environ"))
attempt("parent's cmdline", lambda: read(f"/proc/{{PARENT}}/cmdline"))
attempt("decoy's environ", lambda: read(f"/proc/{{DECOY}}/environ"))
attempt("decoy's cmdline", lambda: read(f"/proc/{{DECOY}}/cmdline"))
attempt("decoy's memory map", lambda: read(f"/proc/{{DECOY}}/maps"))
attempt("pid 1's environ", lambda: read("/proc/1/environ"))
if os.getppid() > 1:
    attempt("ppid's environ", lambda: read(f"/proc/{{os.getppid()}}/environ"))
"""
    for a in user.run_all(code):
        assert "parent's memory refused" in a.out and "decoy's environ refused" in a.out
        assert "troupe-parent-secret" not in a.out + a.result.stderr
    code = CTYPES + f"""DECOY = {decoy.pid}
class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
buf = ctypes.create_string_buffer(SECRET_LEN)
local, remote = IoVec(ctypes.addressof(buf), SECRET_LEN), IoVec(ADDR, SECRET_LEN)
attempt("ptrace attach parent", lambda: ok(libc.ptrace(16, PARENT, None, None)))
attempt("ptrace attach decoy", lambda: ok(libc.ptrace(16, DECOY, None, None)))
attempt("ptrace seize decoy", lambda: ok(libc.ptrace(0x4206, DECOY, None, None)))
attempt("process_vm_readv parent", lambda: ok(libc.process_vm_readv(PARENT, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)))
attempt("process_vm_writev parent", lambda: ok(libc.process_vm_writev(PARENT, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)))
attempt("kcmp", lambda: syscall({SYS["kcmp"]}, PARENT, DECOY, 0, 0, 0))
"""
    (a,) = user.run_all(code, audit_hooks=(False,))
    assert "ptrace attach parent refused" in a.out and "troupe-parent-secret" not in a.out
    if "seccomp" in a.result.isolation:
        assert a.kernel_refused("ptrace attach parent", "ptrace attach decoy", "ptrace seize decoy", "process_vm_readv parent",
                                "process_vm_writev parent", "kcmp")


def test_it_cannot_start_a_process_or_a_program(user: User) -> None:
    code = """
def fork():
    if os.fork() == 0:
        print("child ESCAPED")
        os._exit(0)
def fork_exec():  # subprocess's own way in: _posixsubprocess.fork_exec
    import subprocess
    subprocess.Popen(["/bin/echo", "ESCAPED by fork_exec"]).wait()
attempt("os.fork", fork)
attempt("os.posix_spawn", lambda: os.waitpid(os.posix_spawn("/bin/echo", ["echo", "ESCAPED by spawn"], {}), 0))
attempt("fork_exec", fork_exec)
attempt("os.execv", lambda: os.execv("/bin/echo", ["echo", "ESCAPED by exec"]))
"""
    with_hook, without = user.run_all(code)
    assert "os.fork refused" in with_hook.out and "fork_exec refused" in without.out
    if "seccomp" in without.result.isolation:
        assert without.kernel_refused("os.fork", "os.posix_spawn", "fork_exec", "os.execv")
    code = CTYPES + f"""
def child(pid):
    if pid == 0:
        print("child ESCAPED")
        os._exit(0)
args = ctypes.create_string_buffer(88)  # struct clone_args, all zero: a plain fork
attempt("clone", lambda: child(syscall({SYS["clone"]}, int(signal.SIGCHLD), 0, 0, 0, 0)))
attempt("clone3", lambda: child(syscall({SYS["clone3"]}, ctypes.addressof(args), 88)))
attempt("libc fork", lambda: child(ok(libc.fork())))
"""
    (a,) = user.run_all(code, audit_hooks=(False,))
    if "seccomp" in a.result.isolation:
        assert a.kernel_refused("clone", "clone3", "libc fork")


def test_it_sees_none_of_its_parents_file_descriptors(user: User) -> None:
    code = """
fds = []
for fd in range(3, 1024):
    try:
        os.fstat(fd)
        fds.append(fd)
    except OSError:
        pass
print("open", fds)
attempt("read FD", lambda: print(os.read(FD, 100)))
"""
    for a in user.run_all(code):
        assert "open []" in a.out and "troupe-parent-file" not in a.out


def test_it_cannot_open_sockets(user: User) -> None:
    code = """import socket
for name, args in {
    "packet": (socket.AF_PACKET, socket.SOCK_RAW, 0x0300),
    "raw ip": (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
    "netlink": (socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE),
    "tcp": (socket.AF_INET, socket.SOCK_STREAM, 0),
    "udp6": (socket.AF_INET6, socket.SOCK_DGRAM, 0),
    "unix": (socket.AF_UNIX, socket.SOCK_STREAM, 0),
}.items():
    attempt(name, lambda: socket.socket(*args))
"""
    with_hook, without = user.run_all(code)
    assert "netlink refused" in with_hook.out and "packet refused" in with_hook.out
    if "seccomp" in without.result.isolation:
        assert without.kernel_refused("packet", "raw ip", "netlink", "tcp", "udp6", "unix")
    else:
        assert "netlink refused" in without.out and "packet refused" in without.out


def test_it_cannot_reach_kernel_features_or_change_other_processes(user: User, decoy: subprocess.Popen[bytes]) -> None:
    code = CTYPES + f"""DECOY = {decoy.pid}
class RLimit(ctypes.Structure):
    _fields_ = [("cur", ctypes.c_uint64), ("max", ctypes.c_uint64)]
one = RLimit(1, 1)
cpus = ctypes.c_uint64(1)
zeros = ctypes.create_string_buffer(256)
attempt("unshare", lambda: ok(libc.unshare(0x10000000)))
attempt("setns", lambda: ok(libc.setns(0, 0)))
attempt("mount", lambda: ok(libc.mount(b"none", b".", b"tmpfs", 0, None)))
attempt("keyctl", lambda: syscall({SYS["keyctl"]}, 0, -3, 0, 0, 0))
attempt("bpf", lambda: syscall({SYS["bpf"]}, 0, ctypes.addressof(zeros), 48))
attempt("perf_event_open", lambda: syscall({SYS["perf_event_open"]}, ctypes.addressof(zeros), 0, -1, -1, 0))
attempt("userfaultfd", lambda: syscall({SYS["userfaultfd"]}, 0))
attempt("io_uring_setup", lambda: syscall({SYS["io_uring_setup"]}, 1, ctypes.addressof(zeros)))
attempt("personality", lambda: ok(libc.personality(0x0400000)))
attempt("prlimit parent", lambda: ok(libc.prlimit(PARENT, 7, ctypes.byref(one), None)))
attempt("prlimit decoy", lambda: ok(libc.prlimit(DECOY, 7, ctypes.byref(one), None)))
attempt("renice parent", lambda: ok(libc.setpriority(0, PARENT, 19)))
attempt("renice user", lambda: ok(libc.setpriority(2, os.getuid(), 19)))
attempt("pin parent", lambda: ok(libc.sched_setaffinity(PARENT, 8, ctypes.byref(cpus))))
ok(libc.prlimit(0, 7, None, ctypes.byref(one)))
print("own limits still readable")
"""
    (a,) = user.run_all(code, audit_hooks=(False,))
    assert a.parent_unchanged, "the sandboxed code changed its parent's limits, priority or CPUs"
    assert a.out.endswith("own limits still readable\n")
    if "seccomp" in a.result.isolation:
        assert a.kernel_refused("unshare", "setns", "mount", "keyctl", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup",
                                "personality", "prlimit parent", "prlimit decoy", "renice parent", "renice user", "pin parent")


def test_seccomp_and_a_pid_namespace_take_hold(user: User) -> None:
    report = user.run_helper([{"code": "print(1)", "audit_hook": True, "namespaces": user.namespaces}], capabilities=True)
    isolation = set(report["results"][0]["isolation"])
    caps = report["capabilities"]
    # seccomp needs only no-new-privs: it holds for every user on Linux
    assert "seccomp" in isolation and caps["seccomp"] is True, caps
    if user.name == "root":
        assert {"pidns", "netns", "ipcns", "mountns", "private-proc", "nobody"} <= isolation
        assert caps["pidns"] is True and caps["missing"] == "", caps
    if not user.namespaces:
        assert not {"pidns", "netns", "mountns"} & isolation
    assert caps["user"] == ("root" if user.name == "root" else f"uid {user.code_uid}")


# Routes to another process that are not kill(2): a file's SIGIO owner (fcntl and ioctl), a
# lease, directory notification, a terminal's process group or input. Before Linux 6.12 no
# Landlock ABI scopes the signal these deliver: seccomp must refuse setting them up.
SIGNAL_ROUTES = """import fcntl, socket, struct
F_SETOWN, F_SETSIG, F_SETOWN_EX, F_SETLEASE, F_NOTIFY = 8, 10, 15, 1024, 1026
FIOSETOWN, SIOCSPGRP, FIOASYNC, TIOCSPGRP, TIOCSTI, TIOCSCTTY, TIOCSIG = 0x8901, 0x8902, 0x5452, 0x5410, 0x5412, 0x540E, 0x40045436
def socket_pair():
    try:
        return socket.socketpair()
    except OSError:  # the audit hook refuses every socket
        return None
for name, target in (("parent", PARENT), ("decoy", DECOY)):
    r, w = os.pipe()
    attempt(f"F_SETOWN {name}", lambda: fcntl.fcntl(r, F_SETOWN, target))
    attempt(f"F_SETOWN_EX {name}", lambda: fcntl.fcntl(r, F_SETOWN_EX, struct.pack("ii", 1, target)))
    attempt(f"F_SETSIG {name}", lambda: fcntl.fcntl(r, F_SETSIG, signal.SIGKILL))
    attempt(f"O_ASYNC {name}", lambda: fcntl.fcntl(r, fcntl.F_SETFL, fcntl.fcntl(r, fcntl.F_GETFL) | os.O_ASYNC))
    os.write(w, b"x")  # had the three above held, the kernel would SIGKILL the target now
    pair = socket_pair()
    if pair is not None:
        a, b = pair
        attempt(f"FIOSETOWN {name}", lambda: fcntl.ioctl(a.fileno(), FIOSETOWN, struct.pack("i", target)))
        attempt(f"SIOCSPGRP {name}", lambda: fcntl.ioctl(a.fileno(), SIOCSPGRP, struct.pack("i", -target)))
        attempt(f"FIOASYNC {name}", lambda: fcntl.ioctl(a.fileno(), FIOASYNC, struct.pack("i", 1)))
        b.send(b"x")
attempt("TIOCSPGRP", lambda: fcntl.ioctl(0, TIOCSPGRP, struct.pack("i", PARENT)))
attempt("TIOCSTI", lambda: fcntl.ioctl(0, TIOCSTI, b"x"))
attempt("TIOCSCTTY", lambda: fcntl.ioctl(0, TIOCSCTTY, 0))
attempt("TIOCSIG", lambda: fcntl.ioctl(0, TIOCSIG, struct.pack("i", signal.SIGKILL)))
lease = os.open("lease", os.O_RDONLY | os.O_CREAT, 0o600)
attempt("F_SETLEASE", lambda: fcntl.fcntl(lease, F_SETLEASE, fcntl.F_RDLCK))
attempt("F_NOTIFY", lambda: fcntl.fcntl(os.open(".", os.O_RDONLY), F_NOTIFY, 0x80000004))
print("isatty", os.isatty(0), "flags", fcntl.fcntl(lease, fcntl.F_GETFL) & 3)
fcntl.fcntl(lease, fcntl.F_SETFL, os.O_NONBLOCK)  # F_SETFL itself stays: only O_ASYNC is refused
fcntl.lockf(lease, fcntl.LOCK_SH)
print("still here")
"""
SIGNAL_ROUTE_NAMES = (
    *(f"{route} {who}" for who in ("parent", "decoy") for route in ("F_SETOWN", "F_SETOWN_EX", "F_SETSIG", "O_ASYNC")),
    "TIOCSPGRP", "TIOCSTI", "TIOCSCTTY", "TIOCSIG", "F_SETLEASE", "F_NOTIFY",
)


def test_it_cannot_signal_through_a_files_owner_on_any_kernel(user: User, decoy: subprocess.Popen[bytes]) -> None:
    # The issue's example: fcntl(F_SETOWN, getppid()) + F_SETSIG(SIGKILL) + O_ASYNC on a pipe
    # killed a uid-1000 worker with no namespaces on kernels before 6.12. Held to each older
    # Landlock ABI (and to none), with the audit hook off, the parent and the decoy must live.
    code = f"DECOY = {decoy.pid}\n" + SIGNAL_ROUTES
    attempts = user.run_all(code, audit_hooks=(False,), landlock_abis=tuple(KERNELS.values()))
    attempts += user.run_all(code, audit_hooks=(True,))
    for kernel, a in zip([*KERNELS, "this kernel, audit hook"], attempts, strict=True):
        assert a.out.endswith("isatty False flags 0\nstill here\n"), (kernel, a.out, a.result.stderr)
        assert all(f"{name} refused" in a.out for name in SIGNAL_ROUTE_NAMES), (kernel, a.out)
        if "audit" not in a.result.isolation:
            assert "seccomp" in a.result.isolation, kernel
            assert a.kernel_refused(*SIGNAL_ROUTE_NAMES), (kernel, a.out)
            if "FIOSETOWN parent" in a.out:  # the pair exists without the audit hook
                assert a.kernel_refused("FIOSETOWN parent", "SIOCSPGRP decoy", "FIOASYNC decoy"), (kernel, a.out)
        held = [layer for layer in a.result.isolation if layer.startswith("landlock-abi-")]
        abi = KERNELS.get(kernel)
        if abi is not None and abi > 0 and held:
            assert held == [f"landlock-abi-{abi}"], (kernel, held)
        if abi == 0:
            assert "landlock" not in a.result.isolation


MEMORY_ROUTES = CTYPES + """import socket
attempt("memfd_create", lambda: os.memfd_create("hoard"))
attempt("memfd_secret", lambda: syscall(447, 0))
attempt("shmget", lambda: syscall(SHMGET, 0, 1 << 20, 0o1600))
attempt("mq_open", lambda: ok(libc.mq_open(b"/troupe-hoard", 0o102, 0o600, None)))
a, b = socket.socketpair()
fd = os.open("held", os.O_RDWR | os.O_CREAT, 0o600)
attempt("SCM_RIGHTS", lambda: socket.send_fds(a, [b"x"], [fd]))
a.send(b"plain send still works")
print(b.recv(100).decode())
"""


def test_it_cannot_hold_memory_outside_its_limits(user: User) -> None:
    # memfd pages, SysV shared memory (it outlives the process, with no IPC namespace) and
    # files kept alive in flight on a unix socket count against no address-space limit.
    shmget = {"x86_64": 29, "aarch64": 194}.get(os.uname().machine)
    if shmget is None:
        pytest.skip("syscall numbers known for x86_64 and aarch64 only")
    code = MEMORY_ROUTES.replace("SHMGET", str(shmget))
    for a in user.run_all(code, audit_hooks=(False,), landlock_abis=(0, None)):
        assert a.out.endswith("plain send still works\n"), a.out + a.result.stderr
        assert a.kernel_refused("memfd_create", "memfd_secret", "shmget", "mq_open", "SCM_RIGHTS"), a.out


PID_PROBES = """
attempt("getsid parent", lambda: os.getsid(PARENT))
attempt("getpgid decoy", lambda: os.getpgid(DECOY))
attempt("affinity of parent", lambda: os.sched_getaffinity(PARENT))
attempt("priority of decoy", lambda: os.getpriority(os.PRIO_PROCESS, DECOY))
attempt("scheduler of decoy", lambda: os.sched_getscheduler(DECOY))
attempt("sched params of parent", lambda: os.sched_getparam(PARENT))
print("own", os.getsid(0) >= 0, len(os.sched_getaffinity(0)) > 0, os.getpriority(os.PRIO_PROCESS, 0) >= -20)
"""
LIST_PROC = """
def list_proc():
    if not {int(p) for p in os.listdir("/proc") if p.isdigit()} & {PARENT, DECOY}:
        raise OSError(0, "neither listed")
attempt("list /proc", list_proc)
"""


def test_it_cannot_enumerate_host_pids(user: User, decoy: subprocess.Popen[bytes]) -> None:
    # Each of these calls answers ESRCH for a pid that does not exist: without a PID namespace
    # they would list the host's processes. Listing /proc is closed by a PID namespace, a mount
    # namespace or Landlock (any ABI); with none of them it stays open, and Landlock does not
    # mediate stat(2), so stat("/proc/<pid>") still tells a live pid (see docs/security.md).
    code = f"DECOY = {decoy.pid}\n" + PID_PROBES
    abis = tuple(KERNELS.values()) if user.namespaces else tuple(abi for abi in KERNELS.values() if abi != 0)
    for a in user.run_all(code + LIST_PROC, audit_hooks=(False,), landlock_abis=abis):
        assert "own True True True\n" in a.out and "list /proc refused" in a.out, a.out
        assert a.kernel_refused("getsid parent", "getpgid decoy", "affinity of parent", "priority of decoy",
                                "scheduler of decoy", "sched params of parent"), a.out
    if not user.namespaces:
        (a,) = user.run_all(code, audit_hooks=(False,), landlock_abis=(0,))
        assert a.kernel_refused("getsid parent", "getpgid decoy", "affinity of parent", "priority of decoy"), a.out


FILE_ROUTES = """
attempt("truncate by path", lambda: os.truncate(VICTIM, 0))
attempt("O_RDONLY|O_TRUNC", lambda: os.open(VICTIM, os.O_RDONLY | os.O_TRUNC))
attempt("write by dir_fd", lambda: os.open("victim", os.O_WRONLY | os.O_TRUNC, dir_fd=os.open(os.path.dirname(VICTIM), os.O_RDONLY)))
"""


@pytest.fixture
def victim(user: User) -> Iterator[Path]:
    """A file outside the working directory that the sandboxed code's own uid owns and may write."""
    root = Path(tempfile.mkdtemp(prefix="troupe-victim-"))
    try:
        root.chmod(0o755)
        path = root / "victim"
        path.write_text("keep")
        path.chmod(0o644)
        if os.geteuid() == 0:
            os.chown(path, user.code_uid, user.code_uid)
        yield path
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_it_cannot_truncate_or_write_the_uids_own_files(user: User, victim: Path) -> None:
    # truncate(2) by path and O_RDONLY|O_TRUNC are no writes to Landlock before ABI 3 (6.2), and
    # a dir_fd write is invisible to the audit hook: seccomp refuses all three on every kernel.
    code = f"VICTIM = {str(victim)!r}\n" + FILE_ROUTES
    write = "attempt(\"open for writing\", lambda: open(VICTIM, \"w\").write(\"gone\"))\n"
    abis = tuple(KERNELS.values()) if user.namespaces else tuple(abi for abi in KERNELS.values() if abi != 0)
    for a in user.run_all(code + write, audit_hooks=(False,), landlock_abis=abis):
        assert a.kernel_refused("truncate by path", "O_RDONLY|O_TRUNC") and "write by dir_fd refused" in a.out, a.out
        assert "open for writing refused" in a.out
    if not user.namespaces:
        # With neither Landlock nor a mount namespace, a plain open for writing is refused only
        # by the audit hook (docs/security.md); the routes around the hook are not.
        (a,) = user.run_all(code, audit_hooks=(False,), landlock_abis=(0,))
        assert a.kernel_refused("truncate by path", "O_RDONLY|O_TRUNC") and "write by dir_fd refused" in a.out, a.out
    assert victim.read_text() == "keep"


def test_a_directory_it_makes_unreadable_ends_the_run(user: User) -> None:
    # Without a mount namespace the parent counts the working directory's bytes; a directory
    # the code makes unreadable to its own uid (and so to a parent of that uid) would hide files.
    if user.namespaces:
        pytest.skip("with namespaces the code writes into its private tmpfs, bounded by the kernel")
    code = "import os\nos.makedirs('d/e')\nos.chmod('d', 0)\nwhile True:\n    pass"
    (r,) = user.run_helper([{"code": code, "audit_hook": False, "namespaces": False}])["results"]
    assert r["error"] == "disk limit" and not r["timed_out"], r


# Every route to the worker's own secrets tried at once. DATA is the worker's data dir (0700, its
# `secret_key` 0600, owned by the worker's uid), the helper's working directory, and open in the
# helper as DATAFD; the helper's environment holds the secret too. ROUTES_AROUND_THE_HOOK are the
# ones the kernel must refuse even with no namespace, no Landlock and the code's uid the worker's.
SECRET_ROUTES = """
def read(path, **kw):
    fd = os.open(path, os.O_RDONLY, **kw)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)
lib = os.path.dirname(os.__file__)
up = len([p for p in lib.split("/") if p])
deep = "/".join(["d"] * (up + 2))
os.makedirs(deep)
os.chdir(deep)  # deeper than the library: the same "../" path stays in the working directory from here
target = DATA.lstrip("/") + "/secret_key"
ROUTES_AROUND_THE_HOOK = {
    "dir_fd from the library": lambda: read("../" * up + target, dir_fd=os.open(lib, os.O_RDONLY)),
    "O_PATH dir_fd from the library": lambda: read("../" * up + target, dir_fd=os.open(lib, os.O_PATH)),
    "dir_fd from the working directory": lambda: read("../" * 40 + target, dir_fd=os.open(".", os.O_RDONLY)),
    "inherited directory descriptor": lambda: read("secret_key", dir_fd=DATAFD),
    "inherited descriptor listed": lambda: sorted(os.listdir(DATAFD)),
    "fchdir to the inherited descriptor": lambda: (os.fchdir(DATAFD), read("secret_key")),
    "hard link": lambda: (os.link(DATA + "/secret_key", "x"), read("x")),
}
ROUTES = {
    "absolute path": lambda: read(DATA + "/secret_key"),
    "relative ..": lambda: read("../" * 40 + target),
    "scandir of the data dir": lambda: [e.name for e in os.scandir(DATA)],
    "/proc/self/fd": lambda: [os.readlink("/proc/self/fd/" + n) for n in os.listdir("/proc/self/fd")],
    "/proc/self/fd/DATAFD": lambda: read(f"/proc/self/fd/{DATAFD}/secret_key"),
    "/proc/parent/cwd": lambda: read(f"/proc/{PARENT}/cwd/secret_key"),
    "/proc/parent/environ": lambda: read(f"/proc/{PARENT}/environ"),
    "/proc/parent/root": lambda: read(f"/proc/{PARENT}/root{DATA}/secret_key"),
    "/proc/parent/fd": lambda: read(f"/proc/{PARENT}/fd/{DATAFD}/secret_key"),
    "/proc/ppid/environ": lambda: read(f"/proc/{os.getppid()}/environ"),
}
for name, route in [*ROUTES_AROUND_THE_HOOK.items(), *(ROUTES.items() if ALL_ROUTES else [])]:
    try:
        got = route()
    except OSError as e:
        print(name, "refused", e.errno)
    else:
        print(name, "ESCAPED", got)
"""


@pytest.fixture
def data_dir(user: User) -> Iterator[tuple[Path, str]]:
    """A worker's data dir as settings make it (0700, `secret_key` 0600), owned by the worker's uid."""
    root = Path(tempfile.mkdtemp(prefix="troupe-secrets-"))
    secret = "troupe-secret-key-" + uuid.uuid4().hex
    try:
        root.chmod(0o755)
        data = root / "data"
        data.mkdir(mode=0o700)
        (data / "secret_key").write_text(secret)
        (data / "secret_key").chmod(0o600)
        worker_uid = os.geteuid() if user.name == "root" else (UNPRIVILEGED if os.geteuid() == 0 else os.geteuid())
        for path in (data, data / "secret_key"):
            os.chown(path, worker_uid, worker_uid)
        yield data, secret
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_workers_secrets_are_out_of_reach(user: User, data_dir: tuple[Path, str]) -> None:
    # Issue 45, class 12: with neither Landlock nor namespaces, and the code's uid the worker's,
    # a directory descriptor (taken in the standard library, inherited, or of the working
    # directory) led to `secret_key` past the audit hook, which resolves every path from the
    # working directory. Now seccomp refuses every open by dir_fd and every hard link, the child
    # closes what it inherited, and the hook refuses to open a directory outside the working
    # directory; the plain routes stay refused by the hook there, and by the kernel elsewhere.
    data, secret = data_dir
    runs = []
    for hook in (True, False):
        for abi in (None, 0):
            # Only the hook refuses plain paths for the worker's own uid with no Landlock and no mount namespace.
            everything = hook or user.namespaces or abi != 0 or user.name == "root"
            code = ATTEMPT + f"DATA = {str(data)!r}\nALL_ROUTES = {everything}\n" + SECRET_ROUTES
            runs.append({"code": code, "audit_hook": hook, "namespaces": user.namespaces, "landlock_abi": abi})
    report = user.run_helper(runs, env={"TROUPE_SECRET_DIR": str(data), "TROUPE_SECRET_ENV": secret}, cwd=str(data))
    for run, r in zip(runs, report["results"]):
        where = (user.name, run["audit_hook"], run["landlock_abi"])
        if r["error"] == "sandbox setup failed":  # root whose nobody cannot reach this interpreter, no Landlock
            assert user.name == "root" and run["landlock_abi"] == 0 and "would run as root" in r["stderr"], (where, r)
            continue
        assert r["exit_code"] == 0 and r["error"] is None, (where, r)
        assert secret not in r["stdout"] + r["stderr"] and "ESCAPED" not in r["stdout"], (where, r["stdout"])
        assert r["stdout"].count(" refused ") == (17 if "ALL_ROUTES = True" in run["code"] else 7), (where, r["stdout"])
        if "seccomp" in r["isolation"] and not run["audit_hook"]:
            for name in ("dir_fd from the library", "O_PATH dir_fd from the library", "dir_fd from the working directory"):
                assert f"{name} refused 1\n" in r["stdout"], (where, r["stdout"])  # seccomp's EPERM

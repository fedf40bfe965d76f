"""Run model-written Python in a locked-down child process.

`run_python` starts a fresh interpreter (standard library only: `-s -S -B -P`, a clean
environment, `PYTHONHASHSEED=0` so set ordering is reproducible) in a throwaway working
directory, feeds it `stdin` from a file, reads its stdout and stderr incrementally with a
byte cap, and kills its whole process group at the wall-clock timeout or when the output
cap is hit. Inside, `agents/_sandbox_child.py` locks the process down before the model's
code runs, so that the code cannot signal, trace or read the memory of its parent or any
other process, whether the worker runs as root or as an ordinary user. The layers, each
best-effort (the ones that took hold are in `SandboxResult.isolation`; `capabilities()`
says which ones this host grants the current user, and names the missing ones):

- kernel namespaces (as root directly; as an ordinary user inside a user namespace, where
  the host allows one): a PID namespace, where the code runs as pid 2 under a do-nothing
  pid 1 and no process outside can be named; a network namespace (no network at all); an IPC
  namespace; a private mount namespace where every mount is read-only, the project, /home, /root, /run,
  /mnt, /srv and the temp directories are hidden under empty tmpfs mounts, /proc shows only
  the PID namespace, and the working directory is a fresh noexec tmpfs;
- identity: root switches to uid/gid 65534 (nobody), all capabilities are dropped,
  no-new-privs is set, the process is not dumpable (no /proc/<pid>/mem or ptrace of it);
- rlimits: CPU seconds, address space, file size, no new processes or threads, 32 open files;
  and a disk budget: without a mount namespace the parent walks the working directory while
  the code runs and stops it past `DISK_MB` or `DISK_FILES` ("disk limit");
- Landlock (Linux 5.13+, any user): files readable only in the interpreter's and the system's
  library directories, writable only in the working directory (no /proc even without a
  mount namespace); on Linux 6.12+ also no signals to processes outside the sandbox;
- seccomp (any user; it needs only no-new-privs), which alone keeps the code from signalling
  other processes on kernels before 6.12: a filter that kills the process on a foreign
  architecture and refuses with EPERM signals to any process but itself (kill(0) and kill(-1)
  included), the signal routes that are not kill (fcntl and ioctl are allowed only with
  allow-listed commands: no F_SETOWN, F_SETSIG, O_ASYNC, FIOSETOWN, TIOCSTI...), the pidfd calls,
  ptrace, process_vm_readv/writev, kcmp, fork/vfork/clone/clone3, execve, every socket (a
  socketpair of AF_UNIX aside), descriptor passing, memfd, SysV and POSIX IPC, io_uring,
  unshare/setns/mount, keyrings, bpf, perf_event_open, userfaultfd, personality, path truncation,
  writes by dir_fd, and rlimit/priority/scheduling calls aimed at other processes (the full
  lists are in `agents/_sandbox_child.py`);
- Python: an audit hook that refuses sockets, fork/exec/subprocess, ctypes, hand-made code
  objects, and file access outside the working directory (reading the standard library is
  allowed). It is a first line only: the layers above are what hold if code gets around it.

`SandboxWorker` starts the same child with the same layers but keeps it running, fed requests
over a pipe, each under its own timer and output cap (a Python grader grades a run's completions
in one; `agents.graders.GraderWorkers`).

`docs/security.md` says which layer holds what on each kernel (5.15, 6.1, 6.8, 6.12+).

The data directory (`TROUPE_DATA_DIR`, where the worker keeps `secret_key`, the SQLite database
and the teams' files) is hidden like the project; extra directories to hide can be listed,
separated by `:`, in `TROUPE_SANDBOX_HIDE`.

Without namespaces and Landlock (an ordinary user on a host that grants neither), reading a file
the worker's uid may read is refused by the audit hook, and by the kernel only where the route
goes through a descriptor: the child closes every inherited descriptor but its pipes, seccomp
refuses every open relative to a directory descriptor and every hard link, and the hook refuses to
open a directory outside the working directory (docs/security.md, "The worker's secrets").
"""

from __future__ import annotations

import functools
import json
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

PROJECT_ROOT = Path(__file__).resolve().parent.parent
"""The repository (or install) this package lives in; hidden from sandboxed code."""
SANDBOX_UID = 65534
"""The uid/gid a root parent switches the child to (nobody/nogroup on Debian)."""
FILE_BYTES = 8 * 1024 * 1024
"""The largest file the child may write (RLIMIT_FSIZE)."""
DISK_MB = 64
"""The size of the child's private tmpfs working directory, where one is available; without a
mount namespace, the byte budget of its working directory on the host's disk (see `_DiskBudget`)."""
DISK_FILES = 10_000
"""Without a mount namespace: the most files and directories the working directory may hold."""
_DISK_CHECK_S = 0.01
"""How often the parent walks the working directory (`_DiskBudget`). Code writing to the page cache
at about 1 GB/s passes the budget by what it writes in one interval and the parent's wake-up:
measured here with 4 busy processes on 2 cores, at most 6 files of 8 MiB (0.05 s: 13). A walk
and its two signals cost the parent about 2.5 % of a core while code runs."""

EXPECTED_LAYERS = (
    "pidns", "netns", "mountns", "readonly-fs", "masked-paths", "private-proc", "private-tmpfs",
    "no-caps", "no-new-privs", "rlimits", "landlock", "seccomp", "audit",
)
"""The layers every run should get on a Linux host (root also switches to "nobody");
`capabilities()` names the ones that did not take hold."""

_CHILD = Path(__file__).with_name("_sandbox_child.py")
_READ_CHUNK = 65536


@dataclass(frozen=True)
class SandboxResult:
    """What one sandboxed run produced."""

    stdout: str
    stderr: str
    exit_code: int
    """The process exit status; negative for a signal (as in `subprocess`)."""
    timed_out: bool
    output_truncated: bool
    """stdout or stderr went over `max_output_bytes`; the process was stopped there."""
    error: str | None
    """Why the run failed at the sandbox level: "timeout", "memory limit", "cpu limit",
    "output limit", "file size limit", "disk limit", "killed by SIGSEGV", "sandbox setup failed"; None
    otherwise (a Python exception in the code shows as a non-zero exit code and a traceback)."""
    duration_s: float
    isolation: tuple[str, ...] = ()
    """The protection layers that took hold (see the module docstring)."""

    @property
    def ok(self) -> bool:
        """The code ran to completion with exit status 0 and hit no limit."""
        return self.exit_code == 0 and self.error is None


def run_python(
    code: str,
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 256,
    max_output_bytes: int = 16_384,
    files: dict[str, str] | None = None,
    stdin: str = "",
) -> SandboxResult:
    """Run `code` as a script in the sandbox; `files` are written to its working directory first."""
    return _run(
        code,
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        max_output_bytes=max_output_bytes,
        files=files or {},
        stdin=stdin,
        audit_hook=True,
    )


@functools.cache
def capabilities() -> dict[str, bool | str]:
    """Which protection layers the sandbox gets on this host as the current user, probed once
    per process by running an empty program in it (a fraction of a second).

    Returns one bool per name in `EXPECTED_LAYERS`, plus "nobody" (the switch to uid 65534,
    which only root can make) and "userns" (an ordinary user reached the namespaces through a
    user namespace), and three strings:

    - "user": who the sandbox runs as, "root" or "uid 1000";
    - "missing": the expected layers that did not take hold, comma-separated, "" when none
      (as root, "nobody" is expected too). A host that grants an ordinary user no namespaces
      (a container's default seccomp profile, for example) reads "pidns, netns, mountns,
      readonly-fs, masked-paths, private-proc, private-tmpfs": there seccomp and Landlock
      still keep the code away from other processes, but the network is refused only by
      seccomp and the audit hook;
    - "error": why the probe itself failed, "" when it ran.

    The worker shows "missing" on its start line and on /workers/.
    """
    root = os.geteuid() == 0
    r = _run("pass", timeout_s=30.0, memory_mb=256, max_output_bytes=4096, files={}, stdin="", audit_hook=True)
    held = set(r.isolation)
    expected = [*EXPECTED_LAYERS, "nobody"] if root else list(EXPECTED_LAYERS)
    caps: dict[str, bool | str] = {name: name in held for name in (*EXPECTED_LAYERS, "nobody", "userns")}
    caps["user"] = "root" if root else f"uid {os.geteuid()}"
    caps["missing"] = ", ".join(name for name in expected if name not in held)
    caps["error"] = "" if r.ok else (r.error or r.stderr.strip().rsplit("\n", 1)[-1] or f"exit status {r.exit_code}")
    return caps


def _hidden_paths() -> list[str]:
    extra = [p for p in os.environ.get("TROUPE_SANDBOX_HIDE", "").split(":") if p]
    data_dir = os.environ.get("TROUPE_DATA_DIR", "")  # the worker's secrets: secret_key, the database, tokens
    if data_dir:
        extra.append(data_dir)
    temp = [tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"]
    return [str(PROJECT_ROOT), *extra, "/home", "/root", "/run", "/var/run", "/mnt", "/media", "/srv", *temp]


def _check_file_names(files: dict[str, str]) -> None:
    for name in files:
        p = PurePosixPath(name)
        if not name or p.is_absolute() or ".." in p.parts or p.parts[:1] == (".",):
            raise ValueError(f"sandbox file name {name!r} must be a relative path inside the working directory")


def _run(
    code: str,
    *,
    timeout_s: float,
    memory_mb: int,
    max_output_bytes: int,
    files: dict[str, str],
    stdin: str,
    audit_hook: bool,
    namespaces: bool = True,
    landlock_abi: int | None = None,
) -> SandboxResult:
    """`run_python` with the audit hook, the namespaces and Landlock switchable, so tests can
    check the kernel layers alone, what holds on a host that grants no namespaces (seccomp,
    Landlock, rlimits: a worker in a container as an ordinary user, for example), and what holds
    on an older kernel: `landlock_abi` holds Landlock to that ABI (0: none; 5.15 has 1, 6.1 has 2,
    6.8 has 4, 6.12 has 6)."""
    _check_file_names(files)
    start = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="troupe-sandbox-")
    status_r, status_w = os.pipe()
    proc: subprocess.Popen[bytes] | None = None
    try:
        with tempfile.TemporaryFile() as stdin_file:
            stdin_file.write(stdin.encode())
            stdin_file.seek(0)
            proc = _spawn(code, workdir=workdir, status_w=status_w, stdin=stdin_file, files=files, memory_mb=memory_mb,
                          cpu_s=math.ceil(timeout_s) + 1, audit_hook=audit_hook, namespaces=namespaces, landlock_abi=landlock_abi)
        os.close(status_w)
        status_w = -1
        budget = _DiskBudget(workdir, max_bytes=DISK_MB * 1024 * 1024, max_entries=DISK_FILES, pgid=proc.pid)
        out, err, timed_out, truncated = _collect(proc, deadline=start + timeout_s, cap=max_output_bytes, disk=budget)
        exit_code = proc.wait()
        layers = _read_status(status_r)
    finally:
        if proc is not None and proc.poll() is None:
            _kill(proc)
            proc.wait()
        for fd in (status_r, status_w):
            if fd >= 0:
                os.close(fd)
        _remove_tree(workdir)

    stdout = out.decode("utf-8", errors="replace")
    stderr = err.decode("utf-8", errors="replace")
    return SandboxResult(
        stdout=stdout,
        stderr=stderr,
        exit_code=exit_code,
        timed_out=timed_out,
        output_truncated=truncated,
        error="disk limit" if budget.exceeded else _classify(
            exit_code, stderr, timed_out=timed_out, truncated=truncated, started=bool(layers),
        ),
        duration_s=time.monotonic() - start,
        isolation=tuple(layers),
    )


def _spawn(
    code: str, *, workdir: str, status_w: int, stdin: int | IO[bytes], files: dict[str, str], memory_mb: int, cpu_s: int,
    audit_hook: bool, namespaces: bool = True, landlock_abi: int | None = None,
) -> subprocess.Popen[bytes]:
    """Start `agents/_sandbox_child.py` on `code` in `workdir`, its own process group, with every
    layer; `stdin` is a file or `subprocess.PIPE` (`SandboxWorker`)."""
    root = os.geteuid() == 0
    with tempfile.TemporaryFile() as payload:
        payload.write(json.dumps({"code": code, "files": files}).encode())
        payload.seek(0)
        config = {
            "workdir": workdir,
            "uid": SANDBOX_UID if root else None,
            "gid": SANDBOX_UID if root else None,
            "mask_paths": _hidden_paths(),
            "memory_mb": memory_mb,
            "cpu_s": cpu_s,
            "file_bytes": FILE_BYTES,
            "disk_mb": DISK_MB,
            "payload_fd": payload.fileno(),
            "status_fd": status_w,
            "audit_hook": audit_hook,
            "namespaces": namespaces,
            "landlock_abi": landlock_abi,
        }
        env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LC_ALL": "C.UTF-8", "PYTHONHASHSEED": "0"}
        cmd = [
            os.path.realpath(sys.executable),  # the base interpreter, not the project's venv
            "-s", "-S", "-B", "-P", "-u", "-X", "utf8",
            str(_CHILD), json.dumps(config),
        ]
        return subprocess.Popen(
            cmd,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(payload.fileno(), status_w),
            cwd=workdir,
            env=env,
            start_new_session=True,  # its own process group, killed as a whole
        )


class SandboxWorkerError(RuntimeError):
    """A `SandboxWorker` request failed; the process is gone. `reason`: "timeout", "output limit",
    "disk limit", "memory limit", "cpu limit", "killed by SIGSEGV", "exited with status 1: <its last
    stderr line>"..."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class SandboxWorker:
    """A sandboxed Python process kept running and fed requests over a pipe, for code that serves
    many requests (a Python grader grading a run's completions) without one sandbox start per request.

    `code` runs as in `run_python`, with every layer (namespaces, nobody, rlimits, Landlock,
    seccomp, audit hook) and the same memory limit; it reads one request per line on stdin and
    answers each with one line on stdout. `request` sends a line and waits for the reply under its
    own wall-clock `timeout_s`, with at most `max_reply_bytes` of stdout and stderr per request and
    the disk budget checked while it waits; past any of these, or when the process dies, the whole
    process group is killed and `SandboxWorkerError` says why (the caller starts a fresh worker).
    `cpu_s` is RLIMIT_CPU for the process's whole life: a caller that bounds each request's wall
    time retires the worker before it can spend it. Lines that do not start with `reply_prefix`
    (the code's own chatter) are skipped, counted in the output cap. `close()` kills it (also at
    garbage collection and interpreter exit); a worker whose stdin closes (its parent died) should
    exit on EOF."""

    def __init__(self, code: str, *, cpu_s: int, memory_mb: int = 256, max_reply_bytes: int = 16_384,
                 reply_prefix: str = "", files: dict[str, str] | None = None) -> None:
        files = files or {}
        _check_file_names(files)
        self.max_reply_bytes, self.reply_prefix = max_reply_bytes, reply_prefix.encode()
        self.isolation: tuple[str, ...] = ()
        self.error: str | None = None
        self._workdir = tempfile.mkdtemp(prefix="troupe-sandbox-")
        self._status_r, status_w = os.pipe()
        try:
            self._proc = _spawn(code, workdir=self._workdir, status_w=status_w, stdin=subprocess.PIPE, files=files,
                                memory_mb=memory_mb, cpu_s=cpu_s, audit_hook=True)
        except BaseException:
            os.close(self._status_r)
            _remove_tree(self._workdir)
            raise
        finally:
            os.close(status_w)
        self._finalizer = weakref.finalize(self, _stop_worker, self._proc, self._status_r, self._workdir)
        self._disk = _DiskBudget(self._workdir, max_bytes=DISK_MB * 1024 * 1024, max_entries=DISK_FILES, pgid=self._proc.pid)
        self._out = bytearray()
        for pipe in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
            assert pipe is not None
            os.set_blocking(pipe.fileno(), False)

    @property
    def alive(self) -> bool:
        return self.error is None and self._proc.poll() is None

    @property
    def pid(self) -> int:
        return self._proc.pid

    def request(self, line: str, *, timeout_s: float) -> str:
        """Send `line` (no newline in it) and return the reply line, without its prefix."""
        if not self.alive:
            raise SandboxWorkerError(self.error or "the process has ended")
        assert self._proc.stdin is not None and self._proc.stdout is not None and self._proc.stderr is not None
        todo = memoryview((line.replace("\n", " ") + "\n").encode())
        in_fd, out_fd, err_fd = self._proc.stdin.fileno(), self._proc.stdout.fileno(), self._proc.stderr.fileno()
        deadline, seen, err_tail = time.monotonic() + timeout_s, 0, b""
        with selectors.DefaultSelector() as sel:
            sel.register(out_fd, selectors.EVENT_READ)
            sel.register(err_fd, selectors.EVENT_READ)
            sel.register(in_fd, selectors.EVENT_WRITE)
            while True:
                while b"\n" in self._out:
                    reply, _, rest = bytes(self._out).partition(b"\n")
                    self._out = bytearray(rest)
                    if reply.startswith(self.reply_prefix):
                        if not self.isolation:
                            self.isolation = tuple(_read_status(self._status_r))
                        return reply[len(self.reply_prefix):].decode("utf-8", errors="replace")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return self._fail("timeout")
                if self._disk.check():
                    return self._fail("disk limit")
                for key, _ in sel.select(timeout=min(remaining, _DISK_CHECK_S)):
                    fd = int(key.fd)
                    if fd == in_fd:
                        try:
                            todo = todo[os.write(fd, todo):]
                        except BrokenPipeError:
                            todo = todo[:0]
                        if not todo:
                            sel.unregister(fd)
                        continue
                    try:
                        chunk = os.read(fd, _READ_CHUNK)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        sel.unregister(fd)
                        if fd == out_fd:  # the process closed its output: it is ending
                            code = self._proc.wait(timeout=max(0.0, deadline - time.monotonic()) + 1.0)
                            return self._fail(_classify(code, err_tail.decode("utf-8", "replace"), timed_out=False, truncated=False,
                                                        started=True) or f"exited with status {code}: "
                                              + (err_tail.decode("utf-8", "replace").strip().rsplit("\n", 1)[-1][:300] or "no message"))
                        continue
                    seen += len(chunk)
                    if seen > self.max_reply_bytes:
                        return self._fail("output limit")
                    if fd == out_fd:
                        self._out += chunk
                    else:
                        err_tail = (err_tail + chunk)[-4096:]

    def _fail(self, reason: str) -> str:
        self.error = reason
        self.close()
        raise SandboxWorkerError(reason)

    def close(self) -> None:
        """Kill the process group and remove the working directory (idempotent)."""
        if self.error is None:
            self.error = "closed"
        self._finalizer()


def _stop_worker(proc: subprocess.Popen[bytes], status_r: int, workdir: str) -> None:
    if proc.poll() is None:
        _kill(proc)
    proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            try:
                pipe.close()
            except OSError:
                pass
    os.close(status_r)
    _remove_tree(workdir)


class _DiskBudget:
    """What the working directory holds on the host's disk, measured while the code runs.

    With a mount namespace the code writes into a private tmpfs of `DISK_MB` (the kernel
    refuses the write past it, ENOSPC) and the directory the parent sees stays empty. Without
    one, nothing in the kernel bounds the total: RLIMIT_FSIZE caps each file, not their number.
    So the parent walks the directory every `_DISK_CHECK_S` and ends the run ("disk limit") once
    it holds more than `max_bytes` allocated or `max_entries` names, or a directory it cannot
    read (a place to hide files from the count). Files the code unlinked while keeping them open
    are not seen; RLIMIT_NOFILE x RLIMIT_FSIZE (32 x 8 MiB) bounds them.

    The code is stopped (SIGSTOP to its process group) while a walk runs and killed stopped when
    the walk finds the budget spent, so what it writes past the budget is what it wrote since the
    last walk, however long the walk itself took on a busy machine; and the interval between walks
    grows with the walk's CPU time (a directory of many files), not with the wall time a busy
    machine adds to it."""

    def __init__(self, root: str, *, max_bytes: int, max_entries: int, pgid: int | None = None) -> None:
        self.root, self.max_bytes, self.max_entries, self.pgid = root, max_bytes, max_entries, pgid
        self.exceeded = False
        self._next = 0.0

    def check(self) -> bool:
        """True when the budget is spent (the code is then left stopped, for `_kill`). Checked at
        most every `_DISK_CHECK_S`, and less often when a walk costs much CPU, so the parent spends
        at most about a fifth of its time walking."""
        if self.exceeded or time.monotonic() < self._next:
            return self.exceeded
        self._signal(signal.SIGSTOP)
        cpu = time.thread_time()
        try:
            spent = self._walk()
        finally:
            if not self.exceeded:
                self._signal(signal.SIGCONT)
        self._next = time.monotonic() + max(_DISK_CHECK_S, 4 * (time.thread_time() - cpu))
        return spent

    def _signal(self, sig: signal.Signals) -> None:
        if self.pgid is None:
            return
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):  # gone, or (as root) already a foreign uid: the walk still bounds it
            pass

    def _walk(self) -> bool:
        used, entries, todo = 0, 0, [self.root]
        while todo:
            try:
                with os.scandir(todo.pop()) as it:
                    for entry in it:
                        entries += 1
                        try:
                            st = entry.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue
                        used += st.st_blocks * 512
                        if entry.is_dir(follow_symlinks=False):
                            todo.append(entry.path)
                        if used > self.max_bytes or entries > self.max_entries:
                            self.exceeded = True
                            return True
            except FileNotFoundError:
                continue
            except OSError:  # a directory the code made unreadable
                self.exceeded = True
                return True
        return False


def _remove_tree(root: str) -> None:
    """Remove the working directory, whatever modes the code left on its directories."""
    def fix_and_retry(func: object, path: str, _exc: object) -> None:
        try:
            os.chmod(os.path.dirname(path), 0o700)
            if os.path.isdir(path) and not os.path.islink(path):
                os.chmod(path, 0o700)
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
        except OSError:
            pass

    if os.path.isdir(root):
        os.chmod(root, 0o700)
    shutil.rmtree(root, onerror=fix_and_retry)


def _collect(
    proc: subprocess.Popen[bytes], *, deadline: float, cap: int, disk: _DiskBudget | None = None,
) -> tuple[bytes, bytes, bool, bool]:
    """Read stdout and stderr until EOF, the deadline, or `cap` bytes on either; never more than cap
    each. Stop early when `disk` is spent."""
    assert proc.stdout is not None and proc.stderr is not None
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    bufs = {out_fd: bytearray(), err_fd: bytearray()}
    timed_out = truncated = False
    with selectors.DefaultSelector() as sel:
        for fd in bufs:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            if disk is not None and disk.check():
                break
            wait = remaining if disk is None else min(remaining, _DISK_CHECK_S)
            for key, _ in sel.select(timeout=wait):
                fd = int(key.fd)
                chunk = os.read(fd, _READ_CHUNK)
                if not chunk:
                    sel.unregister(fd)
                    continue
                buf = bufs[fd]
                room = cap - len(buf)
                buf += chunk[:room]
                if len(chunk) > room:
                    truncated = True
            if truncated:
                break
    if timed_out or truncated or (disk is not None and disk.exceeded):
        _kill(proc)
    else:
        # Both pipes closed; the process should be exiting. Hold it to the same deadline (and,
        # since code can close its output and go on writing files, to the disk budget).
        while True:
            remaining = deadline - time.monotonic()
            try:
                proc.wait(timeout=max(0.0, remaining if disk is None else min(remaining, _DISK_CHECK_S)))
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    timed_out = True
                elif disk is None or not disk.check():
                    continue
                _kill(proc)
                break
    proc.stdout.close()
    proc.stderr.close()
    return bytes(bufs[out_fd]), bytes(bufs[err_fd]), timed_out, truncated


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError:
        proc.kill()


def _read_status(fd: int) -> list[str]:
    os.set_blocking(fd, False)
    try:
        data = os.read(fd, 65536)
    except BlockingIOError:
        return []
    try:
        layers = json.loads(data) if data else []
    except ValueError:
        return []
    return [str(x) for x in layers] if isinstance(layers, list) else []


def _classify(exit_code: int, stderr: str, *, timed_out: bool, truncated: bool, started: bool) -> str | None:
    if timed_out:
        return "timeout"
    if truncated:
        return "output limit"
    if exit_code == -signal.SIGXCPU:
        return "cpu limit"
    if exit_code == -signal.SIGXFSZ:
        return "file size limit"
    if exit_code < 0:
        return f"killed by {signal.Signals(-exit_code).name}"
    if not started:
        return "sandbox setup failed" if exit_code != 0 else None
    last = stderr.rstrip().rsplit("\n", 1)[-1]
    if exit_code != 0 and last.startswith("MemoryError"):
        return "memory limit"
    if exit_code != 0 and "[Errno 28]" in last:  # ENOSPC: the private tmpfs is full
        return "disk limit"
    return None

"""The sandbox's seccomp filter as a program: its syscall numbers against the kernel's headers, its
verdicts (run through a small classic-BPF interpreter) for both architectures, and what the
interpreter still can do under every kernel layer. The attacks themselves are in
test_sandbox_attacks.py."""

from __future__ import annotations

import functools
import os
import re
import signal
import struct
from pathlib import Path

import pytest

from agents import _sandbox_child as child
from agents import sandbox

HEADERS = {
    "x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
    "aarch64": Path("/usr/include/asm-generic/unistd.h"),
}
ALLOW, EPERM, KILL = child.SECCOMP_RET_ALLOW, child.SECCOMP_RET_ERRNO | 1, child.SECCOMP_RET_KILL_PROCESS
SELF = 2  # the pid the code has in its PID namespace


def verdict(prog: list[tuple[int, int, int, int]], arch: int, nr: int, *args: int) -> int:
    """Run a classic-BPF seccomp program the way the kernel does, on one syscall."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(list(args) + [0] * 6)[:6])
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = prog[pc]
        if code == child._BPF_LD_W_ABS:
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == child._BPF_JEQ_K:
            pc += jt if acc == k else jf
        elif code == child._BPF_JGE_K:
            pc += jt if acc >= k else jf
        elif code == child._BPF_JSET_K:
            pc += jt if acc & k else jf
        elif code == child._BPF_RET_K:
            return k
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")
        pc += 1


@pytest.mark.parametrize("arch", sorted(child.SYSCALLS))
def test_the_syscall_numbers_are_the_kernels(arch: str) -> None:
    if not HEADERS[arch].exists():
        pytest.skip(f"no kernel headers for {arch} here (linux-libc-dev)")
    # the generic table names fcntl and truncate __NR3264_* (one number, two widths)
    kernel = {m[1]: int(m[2]) for m in re.finditer(r"#define __NR(?:3264)?_(\w+)\s+(\d+)\b", HEADERS[arch].read_text())}
    assert {name: kernel.get(name) for name in child.SYSCALLS[arch]} == child.SYSCALLS[arch]


@pytest.mark.parametrize("arch", sorted(child.SYSCALLS))
def test_every_jump_stays_inside_the_program(arch: str) -> None:
    prog = child._seccomp_program(arch, SELF)
    assert len(prog) < 4096  # BPF_MAXINSNS
    for pc, (code, jt, jf, _k) in enumerate(prog):
        assert 0 <= jt < 256 and 0 <= jf < 256
        if code in (child._BPF_JEQ_K, child._BPF_JGE_K):
            assert pc + 1 + max(jt, jf) < len(prog)
    assert prog[-1] == (child._BPF_RET_K, 0, 0, ALLOW)


@pytest.mark.parametrize("arch", sorted(child.SYSCALLS))
def test_the_filter_refuses_what_it_lists_and_allows_the_rest(arch: str) -> None:
    prog = child._seccomp_program(arch, SELF)
    nr, audit = child.SYSCALLS[arch], child.AUDIT_ARCH[arch]
    other_arch = next(a for n, a in child.AUDIT_ARCH.items() if n != arch)
    assert verdict(prog, other_arch, 0) == KILL
    assert verdict(prog, 0x40000003, 0) == KILL  # i386 (int 0x80 on x86_64)
    for name in child.REFUSED_SYSCALLS:
        if name in nr:
            assert verdict(prog, audit, nr[name], SELF, SELF) == EPERM, name
    for common in (0, 1, 3, 63, 64, 93, 94, 172, 222, 226):  # read/write/close/... on one arch or the other
        if common not in nr.values():
            assert verdict(prog, audit, common) == ALLOW
    # signals: only to itself (its pid is also its thread's id)
    assert verdict(prog, audit, nr["kill"], SELF, 10) == ALLOW
    assert verdict(prog, audit, nr["kill"], SELF | 0xFFFFFFFF00000000, 10) == ALLOW  # the kernel reads an int
    for target in (0, 1, 3, -1 & 0xFFFFFFFF, -SELF & 0xFFFFFFFF, -1 & 0xFFFFFFFFFFFFFFFF):
        assert verdict(prog, audit, nr["kill"], target, 9) == EPERM, target
    assert verdict(prog, audit, nr["tgkill"], SELF, SELF, 10) == ALLOW
    assert verdict(prog, audit, nr["tgkill"], SELF, 3, 10) == EPERM
    assert verdict(prog, audit, nr["tgkill"], 3, SELF, 10) == EPERM
    assert verdict(prog, audit, nr["tkill"], SELF, 10) == ALLOW and verdict(prog, audit, nr["tkill"], 1, 10) == EPERM
    assert verdict(prog, audit, nr["rt_sigqueueinfo"], 1, 10) == EPERM
    # its own limits and priority, nobody else's
    assert verdict(prog, audit, nr["prlimit64"], 0, 7) == ALLOW and verdict(prog, audit, nr["prlimit64"], SELF, 7) == ALLOW
    assert verdict(prog, audit, nr["prlimit64"], 1, 7) == EPERM
    assert verdict(prog, audit, nr["setpriority"], 0, 0, 10) == ALLOW
    assert verdict(prog, audit, nr["setpriority"], 2, 0, 10) == EPERM  # PRIO_USER: every process of the uid
    assert verdict(prog, audit, nr["sched_setaffinity"], 1) == EPERM
    # sockets: only a connected pair of unix sockets
    assert verdict(prog, audit, nr["socketpair"], 1, 1, 0) == ALLOW
    assert verdict(prog, audit, nr["socketpair"], 2, 1, 0) == EPERM
    assert verdict(prog, audit, nr["socket"], 1, 1, 0) == EPERM


def test_the_filter_kills_code_that_switches_to_another_abi() -> None:
    if os.uname().machine != "x86_64":
        pytest.skip("x32 is an x86_64 ABI")
    code = "import ctypes\nctypes.CDLL(None).syscall(0x40000000 | 39)\nprint('survived')"  # x32 getpid
    r = sandbox._run(code, audit_hook=False, timeout_s=10.0, memory_mb=256, max_output_bytes=4096, files={}, stdin="")
    if "seccomp" not in r.isolation:
        pytest.skip("no seccomp here")
    assert r.exit_code == -signal.SIGSYS and r.error == "killed by SIGSYS" and "survived" not in r.stdout


@pytest.mark.parametrize("namespaces", [True, False])
def test_the_standard_library_works_under_every_kernel_layer(namespaces: bool) -> None:
    code = """import bz2, datetime, decimal, hashlib, json, lzma, math, random, re, sqlite3, statistics, tempfile, time, unicodedata, zlib, zoneinfo
import os, pathlib, shutil, signal
print(hashlib.sha256(b"x").hexdigest()[:8], sqlite3.connect(":memory:").execute("select 6 * 7").fetchone()[0])
print(zoneinfo.ZoneInfo("Europe/Paris").key, unicodedata.name("a"), decimal.Decimal(1) / 4, time.localtime().tm_year > 2000)
with tempfile.TemporaryDirectory() as d:
    pathlib.Path(d, "a").write_text("x")
    shutil.copy(pathlib.Path(d, "a"), "b")
os.makedirs("c/d")
os.rename("b", "c/d/e")
print(sorted(os.listdir(".")), open("c/d/e").read(), open("/dev/null", "w").write("x"), len(os.urandom(4)))
"""
    r = sandbox._run(code, audit_hook=False, namespaces=namespaces, timeout_s=20.0, memory_mb=256, max_output_bytes=4096,
                     files={}, stdin="")
    assert r.ok, r.stderr
    assert r.stdout.split("\n")[:3] == ["2d711642 42", "Europe/Paris LATIN SMALL LETTER A 0.25 True", "['c'] x 1 4"]


@pytest.mark.parametrize("arch", sorted(child.SYSCALLS))
def test_the_filter_checks_fcntl_ioctl_and_open_arguments(arch: str) -> None:
    prog = child._seccomp_program(arch, SELF)
    nr, audit = child.SYSCALLS[arch], child.AUDIT_ARCH[arch]
    fcntl_ = functools.partial(verdict, prog, audit, nr["fcntl"], 3)
    # a file's SIGIO owner and signal, leases and notification: refused, whatever the argument
    for cmd in (8, 10, 15, 1024, 1026, 1031, 8 | 0xFFFFFFFF00000000):
        assert fcntl_(cmd, SELF) == EPERM and fcntl_(cmd, 0) == EPERM, cmd
    assert fcntl_(4, child.O_ASYNC) == EPERM and fcntl_(4, child.O_ASYNC | 0o4000) == EPERM  # F_SETFL with O_ASYNC
    assert fcntl_(4, 0o4000) == ALLOW and fcntl_(4, 0) == ALLOW  # O_NONBLOCK alone
    for cmd in (0, 1, 2, 3, 5, 6, 7, 9, 11, 16, 36, 37, 38, 1030):
        assert fcntl_(cmd, child.O_ASYNC) == ALLOW, cmd  # the argument only matters to F_SETFL
    ioctl = functools.partial(verdict, prog, audit, nr["ioctl"], 0)
    for req in (0x8901, 0x8902, 0x5452, 0x5410, 0x5412, 0x540E, 0x40045436, 0x541C, 0x4B4E, 0x5401):
        expected = ALLOW if req == 0x5401 else EPERM
        assert ioctl(req) == expected, hex(req)
    assert ioctl(0x5401 | 0xFFFFFFFF00000000) == ALLOW  # the kernel reads an unsigned int
    for req in (0x5413, 0x541B, 0x5421, 0x5450, 0x5451, 0x802C542A):
        assert ioctl(req) == ALLOW, hex(req)
    # openat: only by a path from the working directory (reading too), O_TRUNC only with write access
    at = functools.partial(verdict, prog, audit, nr["openat"])
    cwd, dirfd = child.AT_FDCWD & 0xFFFFFFFFFFFFFFFF, 5
    assert at(cwd, 0, 0) == ALLOW and at(cwd, 0, 0o200000) == ALLOW  # reads, O_DIRECTORY
    assert at(cwd, 0, 0o1 | 0o100 | 0o1000) == ALLOW and at(cwd, 0, 0o2) == ALLOW
    for flags in (0, 0o200000, 0o10000000, 0o1, 0o2, 0o100, 0o2000, 0o1000, 0o1 | 0o100):  # O_PATH too
        assert at(dirfd, 0, flags) == EPERM, oct(flags)
        assert at(0, 0, flags) == EPERM, oct(flags)
    assert at(0xFFFFFF9C, 0, 0) == ALLOW  # the kernel reads an int: AT_FDCWD's low half is AT_FDCWD
    assert at(cwd, 0, 0o1000) == EPERM  # O_RDONLY|O_TRUNC
    if "open" in nr:
        assert verdict(prog, audit, nr["open"], 0, 0o1000) == EPERM
        assert verdict(prog, audit, nr["open"], 0, 0o1 | 0o1000) == ALLOW and verdict(prog, audit, nr["open"], 0, 0) == ALLOW
    # questions about other processes: only about itself
    for name in ("getsid", "getpgid", "sched_getaffinity", "sched_getscheduler", "sched_getparam"):
        assert verdict(prog, audit, nr[name], 0) == ALLOW and verdict(prog, audit, nr[name], SELF) == ALLOW, name
        assert verdict(prog, audit, nr[name], 1) == EPERM and verdict(prog, audit, nr[name], 77) == EPERM, name
    for name in ("memfd_create", "memfd_secret", "shmget", "mq_open", "sendmsg", "truncate", "setsid", "openat2", "linkat"):
        assert verdict(prog, audit, nr[name], 0, 0) == EPERM, name

"""The first code that runs inside a sandbox process: it locks the process down, then runs the model's code.

`agents.sandbox` starts this file as a script with a fresh interpreter
(`python -s -S -B -P -u -X utf8 _sandbox_child.py CONFIG_JSON`), standard library only.
Setting up here, in the child, instead of in a `preexec_fn` keeps the parent safe to call
from a multi-threaded trainer. Every layer is best-effort; the layers that took hold are
written as a JSON list to the status pipe before the model's code starts:

- `pidns`: a new PID namespace. The process that was started unshares it and forks twice: a
  do-nothing pid 1 that holds the namespace open (undumpable, dies with its parent), and the
  process that runs the model's code as pid 2, whose parent is outside the namespace
  (`os.getppid()` is 0). The started process waits for it and ends the same way it did
  (exit status or signal). Nothing outside the namespace can be named by a pid.
- `netns`: a new network namespace with no interface up (no TCP/UDP anywhere, 127.0.0.1 included);
  `ipcns`: a new IPC namespace (SysV and POSIX IPC objects die with the sandbox; seccomp refuses
  them anyway); `userns` when an unprivileged user needed a user namespace to get these.
- `mountns`: a private mount namespace; with it `readonly-fs` (every mount read-only),
  `masked-paths` (empty read-only tmpfs over the project, /home, /root, /run, the temp
  dirs...; the interpreter's own library directories are bound back in), `private-proc` (a
  fresh read-only /proc that shows only the PID namespace, or an empty one without it) and
  `private-tmpfs` (the working directory is a fresh size-limited, noexec tmpfs).
- `nobody`: when started as root, the process switches to uid/gid 65534 (so RLIMIT_NPROC
  and file permissions apply); `no-caps`: every capability dropped; `no-new-privs`.
- `rlimits`: CPU seconds, address space, file size, processes (0: no fork, no threads),
  open files, no core dumps.
- `landlock`: a Landlock domain (Linux 5.13+, no privileges needed): files may be read only
  under the interpreter's library directories and the system's shared libraries, and written
  only in the working directory (so no /proc at all, even on a host without namespaces);
  from Landlock ABI 6 on, no signals to and no abstract unix sockets of processes outside it.
- `seccomp`: a classic-BPF seccomp filter (see `_seccomp_program`) that kills the process
  on a foreign architecture or ABI and refuses with EPERM: signals (kill, tkill, tgkill,
  rt_(tg)sigqueueinfo) to anyone but itself, fcntl and ioctl commands outside their allow-lists
  (the SIGIO owner and signal of a file, O_ASYNC, leases, a terminal's process group or input:
  routes to other processes that are not kill, which Landlock scopes only from Linux 6.12), the
  pidfd calls, ptrace, process_vm_readv/writev, kcmp, fork/vfork/clone/clone3 and
  execve/execveat, every socket (socketpair only for AF_UNIX) and descriptor passing, memfd,
  SysV and POSIX IPC, namespace, mount, keyring, bpf, perf, userfaultfd, io_uring and
  personality calls, truncation by path, hard links, and any open relative to a directory
  descriptor (dir_fd: the audit hook resolves paths from the working directory, and so must the
  kernel), and rlimit/priority/affinity/
  scheduler/page-migration calls on, or questions about, other processes.
- `audit`: a `sys.addaudithook` hook refusing sockets, fork/exec/subprocess, ctypes,
  sub-interpreters, hand-made code objects, fcntl/ioctl commands outside the allow-lists, and
  file access outside the working directory (reads also allowed in the standard library, but no
  directory outside the working directory opened as a descriptor; a dir_fd must name the working
  directory or a directory inside it). It holds no mutable state
  and calls no patchable Python code; before the model's code runs, this module's globals lose
  their libc handles (`_scrub_globals`), since its frame can be reached by walking frames.

Root never runs the model's code as uid 0 with neither read-only mounts nor Landlock: setup
fails instead. Before the model's code runs, every descriptor but stdin, stdout and stderr is
closed (`_close_descriptors`: nothing the worker or this bootstrap opened stays reachable by
number), and the standard library's descriptor-based tree walks are switched to their path-based
twins (`_paths_not_descriptors`), which the seccomp filter's rule on dir_fd would refuse.
"""

from __future__ import annotations

import builtins
import ctypes
import json
import linecache
import os
import resource
import signal
import stat
import sys
import traceback
import types
from typing import Any, NoReturn

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (added in Linux 5.12)
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
LINUX_CAPABILITY_VERSION_3 = 0x20080522

EXIT_SETUP_FAILED = 125

# Syscall numbers, per architecture, of everything the seccomp filter refuses or checks.
# x86_64: arch/x86/entry/syscalls/syscall_64.tbl; aarch64: include/uapi/asm-generic/unistd.h.
# Calls added since Linux 5.1 have one number everywhere.
_COMMON_SYSCALLS = {
    "pidfd_send_signal": 424, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "pidfd_open": 434, "clone3": 435, "openat2": 437, "pidfd_getfd": 438, "process_madvise": 440, "mount_setattr": 442,
    "memfd_secret": 447, "process_mrelease": 448,
}
SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": {
        "socket": 41, "socketpair": 53, "clone": 56, "fork": 57, "vfork": 58, "execve": 59, "kill": 62,
        "ptrace": 101, "syslog": 103, "rt_sigqueueinfo": 129, "personality": 135, "setpriority": 141,
        "sched_setparam": 142, "sched_setscheduler": 144, "modify_ldt": 154, "pivot_root": 155, "chroot": 161,
        "acct": 163, "mount": 165, "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169, "iopl": 172,
        "ioperm": 173, "init_module": 175, "delete_module": 176, "quotactl": 179, "tkill": 200,
        "sched_setaffinity": 203, "tgkill": 234, "kexec_load": 246, "add_key": 248, "request_key": 249,
        "keyctl": 250, "ioprio_set": 251, "migrate_pages": 256, "unshare": 272, "move_pages": 279,
        "rt_tgsigqueueinfo": 297, "perf_event_open": 298, "prlimit64": 302, "open_by_handle_at": 304,
        "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "finit_module": 313,
        "sched_setattr": 314, "kexec_file_load": 320, "bpf": 321, "execveat": 322, "userfaultfd": 323,
        "open": 2, "ioctl": 16, "fcntl": 72, "truncate": 76, "openat": 257, "memfd_create": 319,
        "sendmsg": 46, "sendmmsg": 307, "fanotify_init": 300, "capget": 125, "link": 86, "linkat": 265,
        "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67, "semget": 64, "semop": 65, "semctl": 66, "semtimedop": 220,
        "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71, "mq_open": 240, "mq_unlink": 241, "mq_timedsend": 242,
        "mq_timedreceive": 243, "mq_notify": 244, "mq_getsetattr": 245,
        "setpgid": 109, "setsid": 112, "getpgid": 121, "getsid": 124, "getpriority": 140, "sched_getparam": 143,
        "sched_getscheduler": 145, "sched_rr_get_interval": 148, "sched_getaffinity": 204, "ioprio_get": 252,
        "get_robust_list": 274, "sched_getattr": 315,
        **_COMMON_SYSCALLS,
    },
    "aarch64": {
        "ioprio_set": 30, "umount2": 39, "mount": 40, "pivot_root": 41, "chroot": 51, "quotactl": 60,
        "acct": 89, "personality": 92, "unshare": 97, "kexec_load": 104, "init_module": 105,
        "delete_module": 106, "syslog": 116, "ptrace": 117, "sched_setparam": 118, "sched_setscheduler": 119,
        "sched_setaffinity": 122, "kill": 129, "tkill": 130, "tgkill": 131, "rt_sigqueueinfo": 138,
        "setpriority": 140, "reboot": 142, "socket": 198, "socketpair": 199, "add_key": 217,
        "request_key": 218, "keyctl": 219, "clone": 220, "execve": 221, "swapon": 224, "swapoff": 225,
        "migrate_pages": 238, "move_pages": 239, "rt_tgsigqueueinfo": 240, "perf_event_open": 241,
        "prlimit64": 261, "open_by_handle_at": 265, "setns": 268, "process_vm_readv": 270,
        "process_vm_writev": 271, "kcmp": 272, "finit_module": 273, "sched_setattr": 274,
        "kexec_file_load": 294, "bpf": 280, "execveat": 281, "userfaultfd": 282,
        "fcntl": 25, "ioctl": 29, "truncate": 45, "openat": 56, "memfd_create": 279,
        "sendmsg": 211, "sendmmsg": 269, "fanotify_init": 262, "capget": 90, "linkat": 37,
        "shmget": 194, "shmctl": 195, "shmat": 196, "shmdt": 197, "semget": 190, "semctl": 191, "semtimedop": 192,
        "semop": 193, "msgget": 186, "msgctl": 187, "msgrcv": 188, "msgsnd": 189, "mq_open": 180, "mq_unlink": 181,
        "mq_timedsend": 182, "mq_timedreceive": 183, "mq_notify": 184, "mq_getsetattr": 185,
        "setpgid": 154, "getpgid": 155, "getsid": 156, "setsid": 157, "getpriority": 141, "sched_getscheduler": 120,
        "sched_getparam": 121, "sched_getaffinity": 123, "sched_rr_get_interval": 127, "ioprio_get": 31,
        "get_robust_list": 100, "sched_getattr": 275,
        **_COMMON_SYSCALLS,
    },
}
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000  # x86_64's x32 ABI: same AUDIT_ARCH, numbers with this bit set

REFUSED_SYSCALLS = (
    # other processes: signals by pidfd, tracing, reading or writing their memory, comparing their files
    "pidfd_open", "pidfd_send_signal", "pidfd_getfd", "process_madvise", "process_mrelease",
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "get_robust_list", "capget",
    # leaving its own session or process group (the parent ends the sandbox by its group)
    "setsid", "setpgid",
    # memory no address-space limit counts: memfd pages, SysV shared memory (it outlives the
    # process), POSIX message queues; and descriptors in flight on a unix socket (SCM_RIGHTS
    # keeps a file alive with no descriptor slot), the other SysV IPC objects
    "memfd_create", "memfd_secret", "shmget", "shmat", "shmctl", "shmdt", "semget", "semop", "semctl", "semtimedop",
    "msgget", "msgsnd", "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify",
    "mq_getsetattr", "sendmsg", "sendmmsg",
    # files by path with no open descriptor: truncate(2) is not a write to Landlock before ABI 3;
    # openat2's flags and dirfd sit in a struct the filter cannot read; a hard link would bring a
    # file from outside (the worker's secrets, owned by the same uid) into the working directory
    "truncate", "openat2", "fanotify_init", "link", "linkat",
    # new processes and new programs (RLIMIT_NPROC also stops threads)
    "fork", "vfork", "clone", "clone3", "execve", "execveat",
    # the network (socketpair stays for AF_UNIX, below); io_uring can open sockets without socket()
    "socket", "io_uring_setup", "io_uring_enter", "io_uring_register",
    # namespaces, mounts and kernel features an unprivileged process has no business with
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr", "keyctl", "add_key", "request_key", "bpf",
    "perf_event_open", "userfaultfd", "personality", "open_by_handle_at", "syslog", "acct", "quotactl",
    "swapon", "swapoff", "reboot", "kexec_load", "kexec_file_load", "init_module", "finit_module",
    "delete_module", "modify_ldt", "iopl", "ioperm",
)
"""Refused with EPERM whatever their arguments (names missing on an architecture are skipped)."""

SELF = "self"
"""Stands for the sandboxed process's own pid in `CHECKED_SYSCALLS`."""
CHECKED_SYSCALLS: tuple[tuple[str, tuple[tuple[int, tuple[int | str, ...]], ...]], ...] = (
    # signals only to itself (its pid is also its only thread's id); kill(0) and kill(-1) refused
    ("kill", ((0, (SELF,)),)),
    ("tkill", ((0, (SELF,)),)),
    ("tgkill", ((0, (SELF,)), (1, (SELF,)))),
    ("rt_sigqueueinfo", ((0, (SELF,)),)),
    ("rt_tgsigqueueinfo", ((0, (SELF,)), (1, (SELF,)))),
    # limits, priorities and placement of itself only (0 means "the caller")
    ("prlimit64", ((0, (0, SELF)),)),
    ("setpriority", ((0, (0,)), (1, (0, SELF)))),  # PRIO_PROCESS only: no PRIO_PGRP, PRIO_USER
    ("ioprio_set", ((0, (1,)), (1, (0, SELF)))),  # IOPRIO_WHO_PROCESS only
    ("sched_setaffinity", ((0, (0, SELF)),)),
    ("sched_setscheduler", ((0, (0, SELF)),)),
    ("sched_setparam", ((0, (0, SELF)),)),
    ("sched_setattr", ((0, (0, SELF)),)),
    ("migrate_pages", ((0, (0, SELF)),)),
    ("move_pages", ((0, (0, SELF)),)),
    # reading about other processes: each answers ESRCH for a pid that does not exist, so
    # without a PID namespace they would list the host's pids
    ("getpgid", ((0, (0, SELF)),)),
    ("getsid", ((0, (0, SELF)),)),
    ("getpriority", ((0, (0,)), (1, (0, SELF)))),
    ("ioprio_get", ((0, (1,)), (1, (0, SELF)))),
    ("sched_getaffinity", ((0, (0, SELF)),)),
    ("sched_getscheduler", ((0, (0, SELF)),)),
    ("sched_getparam", ((0, (0, SELF)),)),
    ("sched_getattr", ((0, (0, SELF)),)),
    ("sched_rr_get_interval", ((0, (0, SELF)),)),
    ("socketpair", ((0, (1,)),)),  # AF_UNIX
    # ioctl: only requests that read a terminal's or a descriptor's state or set its own flags.
    # Refused among the rest: FIOSETOWN/SIOCSPGRP (a socket's SIGIO owner), FIOASYNC, TIOCSPGRP,
    # TIOCSCTTY, TIOCSTI (typing into another terminal), TIOCSIG, TIOCLINUX, KDSIGACCEPT.
    ("ioctl", ((1, (0x5401, 0x802C542A, 0x5413, 0x540F, 0x541B, 0x5421, 0x5450, 0x5451, 0x5460)),)),
)
"""Allowed only when every listed argument (index, allowed values) has one of its values,
compared on the low 32 bits, as the kernel reads a pid_t or int; refused with EPERM otherwise.
The ioctl requests: TCGETS, TCGETS2, TIOCGWINSZ, TIOCGPGRP, FIONREAD, FIONBIO, FIONCLEX, FIOCLEX, FIOQSIZE."""

F_SETFL, O_ASYNC = 4, 0o20000
FCNTL_ALLOWED = (
    0, 1, 2, 3, F_SETFL, 5, 6, 7, 9, 11, 16, 36, 37, 38, 1025, 1030, 1032, 1033, 1034,
)
"""fcntl commands the code may use: F_DUPFD, F_GETFD, F_SETFD, F_GETFL, F_SETFL (without O_ASYNC),
the record locks (F_GETLK, F_SETLK, F_SETLKW and their F_OFD_ twins), F_GETOWN, F_GETSIG,
F_GETOWN_EX, F_GETLEASE, F_DUPFD_CLOEXEC, F_GETPIPE_SZ, F_ADD_SEALS, F_GET_SEALS. Refused among
the rest: F_SETOWN, F_SETOWN_EX and F_SETSIG (which make the kernel signal any process the
code's uid may signal when the file becomes ready: a route to other processes that is not kill),
F_SETLEASE and F_NOTIFY (the kernel signals the holder; a lease also stalls whoever opens the
file), F_SETPIPE_SZ."""
O_ACCMODE, O_TRUNC, AT_FDCWD_32 = 0o3, 0o1000, AT_FDCWD & 0xFFFFFFFF
"""open/openat: every file opened (for reading too) only by a path from the working directory
(dirfd AT_FDCWD), so that the path the audit hook checks, which it resolves from the working
directory because the `open` event carries no dir_fd, is the path the kernel opens: a directory
descriptor taken where the hook lets the code read (the standard library) cannot lead by `..` to
a file the hook would refuse (the worker's `secret_key`); and O_TRUNC only with write access
(O_RDONLY|O_TRUNC truncates a file Landlock before ABI 3 only let it read). The standard library's
descriptor-based tree walks (`shutil.rmtree`) are switched to their path-based twins before the
model's code runs (`_paths_not_descriptors`)."""

# Classic BPF, as seccomp reads it (linux/filter.h, linux/seccomp.h).
_BPF_LD_W_ABS = 0x20
_BPF_JEQ_K = 0x15
_BPF_JGE_K = 0x35
_BPF_JSET_K = 0x45
_BPF_RET_K = 0x06
SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
_EPERM = 1
_DATA_NR, _DATA_ARCH, _DATA_ARGS = 0, 4, 16  # offsets in struct seccomp_data

# Landlock (linux/landlock.h): one number for each call on every architecture.
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_TRUNCATE, FS_IOCTL_DEV = 1 << 14, 1 << 15
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
_LANDLOCK_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
SYSTEM_READ_PATHS = (
    "/lib", "/lib32", "/lib64", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/local/lib", "/etc/ld.so.cache",
    "/etc/localtime", "/usr/share/zoneinfo",
)
"""Readable under Landlock besides the interpreter's own directories: the shared libraries that
extension modules load, and the time zone data."""

_libc = ctypes.CDLL(None, use_errno=True)


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


class _LandlockRulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _LandlockPathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = os.fsencode
    ret = _libc.mount(
        enc(source) if source is not None else None,
        enc(target),
        enc(fstype) if fstype is not None else None,
        ctypes.c_ulong(flags),
        enc(data) if data is not None else None,
    )
    _check(ret, f"mount {target}")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _libc_fn(name: str) -> Any:
    """A libc function, or None where this platform has none (macOS has no unshare, prctl, capset)."""
    return getattr(_libc, name, None)


def _enter_namespaces(root: bool, layers: list[str]) -> int:
    """Unshare the PID, network and mount namespaces, through a user namespace where root is not
    at hand; returns the CLONE_NEW* flags that took hold (0 for none).

    The PID namespace only applies to the children forked afterwards: see `_split_pid_namespace`."""
    unshare = _libc_fn("unshare")
    if unshare is None or not sys.platform.startswith("linux"):
        return 0
    uid, gid = os.getuid(), os.getgid()
    wanted = [CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET, CLONE_NEWNS | CLONE_NEWNET, CLONE_NEWNET]
    wanted = [flags | CLONE_NEWIPC for flags in wanted] + wanted
    attempts = (wanted if root else []) + [CLONE_NEWUSER | flags for flags in wanted]
    for flags in attempts:
        if unshare(ctypes.c_int(flags)) != 0:
            continue
        if flags & CLONE_NEWUSER:
            # Map our own ids only: inside, we are who we were outside (with capabilities in the
            # new namespaces until `_drop_privileges` removes them).
            try:
                _write("/proc/self/setgroups", "deny")
                _write("/proc/self/uid_map", f"{uid} {uid} 1")
                _write("/proc/self/gid_map", f"{gid} {gid} 1")
            except OSError:
                return 0
            layers.append("userns")
        layers.append("netns")
        if flags & CLONE_NEWIPC:
            layers.append("ipcns")
        if flags & CLONE_NEWNS:
            layers.append("mountns")
        return flags
    return 0


def _split_pid_namespace(status_fd: int) -> None:
    """After unshare(CLONE_NEWPID): fork the namespace's pid 1, then the process that runs the
    model's code (pid 2); only that one returns.

    The process that was started stays outside the namespace, out of the model's reach: it
    waits for pid 2 and ends as it did, so `agents.sandbox` sees the real exit status or signal.
    Pid 1 runs no model code (an init process ignores the signals it has no handler for, which
    would change how the model's own `os.kill(os.getpid(), ...)` behaves): it only holds the
    namespace until the started process is gone, then exits, and the kernel kills what is left."""
    hold_r, hold_w = os.pipe()
    init = os.fork()
    if init == 0:
        _hold_namespace(hold_r)
    worker = os.fork()
    if worker == 0:
        os.close(hold_r)
        os.close(hold_w)
        return
    os.close(hold_r)
    os.close(status_fd)
    _, status = os.waitpid(worker, 0)
    os.kill(init, signal.SIGKILL)
    os.waitpid(init, 0)
    _exit_like(status)


def _hold_namespace(hold_fd: int) -> NoReturn:
    """Pid 1 of the sandbox's PID namespace: block until the parent closes the pipe (or dies)."""
    try:
        prctl = _libc_fn("prctl")
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
            prctl(PR_SET_DUMPABLE, ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
        os.dup2(hold_fd, 0)
        os.closerange(1, 65536)  # the output pipes too: the parent must see EOF when pid 2 is done
        os.read(0, 1)
    finally:
        os._exit(0)


def _exit_like(status: int) -> NoReturn:
    """End this process the way a child with wait status `status` ended."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL and SIGSTOP cannot be set, and need not be
            pass
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else EXIT_SETUP_FAILED)


def _untraversable_ancestor(path: str, uid: int, gid: int) -> str | None:
    """The highest directory above `path` that uid/gid may not search, if any."""
    parts = path.strip("/").split("/")
    current = ""
    for part in parts[:-1]:
        current += "/" + part
        try:
            st = os.stat(current)
        except OSError:
            return None
        if st.st_uid == uid:
            ok = bool(st.st_mode & stat.S_IXUSR)
        elif st.st_gid == gid:
            ok = bool(st.st_mode & stat.S_IXGRP)
        else:
            ok = bool(st.st_mode & stat.S_IXOTH)
        if not ok:
            return current
    return None


def _is_within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _build_mount_view(cfg: dict[str, Any], needed: list[str], pidns: bool, layers: list[str]) -> None:
    """Make every mount read-only, mask sensitive trees, re-expose `needed`, mount the workdir
    tmpfs, and replace /proc: with the PID namespace's own, or with nothing without one."""
    workdir: str = cfg["workdir"]
    target_uid: int | None = cfg["uid"]
    target_gid: int | None = cfg["gid"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we do here leaks back to the host

    masks: list[str] = []
    for p in cfg["mask_paths"]:
        if os.path.isdir(p) and not os.path.islink(p):
            masks.append(os.path.realpath(p))
    if target_uid is not None and target_gid is not None:
        for p in needed:
            anc = _untraversable_ancestor(p, target_uid, target_gid)
            if anc is not None:
                masks.append(anc)
    # Outermost first; a mask inside another is already hidden by it.
    outer: list[str] = []
    for m in sorted(set(masks), key=len):
        if m != "/" and not any(_is_within(m, o) for o in outer):
            outer.append(m)

    fds = {p: os.open(p, getattr(os, "O_PATH", 0) | os.O_CLOEXEC) for p in needed if os.path.exists(p)}
    attr = _MountAttr(attr_set=MOUNT_ATTR_RDONLY)
    ret = _libc.syscall(
        ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_int(AT_FDCWD), b"/", ctypes.c_uint(AT_RECURSIVE),
        ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)),
    )
    if ret == 0:
        layers.append("readonly-fs")

    tmpfs_flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    # The mount points made below lead the code's user to what it may read (the interpreter under a
    # masked /root, say): 0755 whatever umask the caller runs under (a web process's is 077).
    os.umask(0o022)
    for mask in outer:
        _mount("tmpfs", mask, "tmpfs", tmpfs_flags, "size=64k,mode=755")
        for p, fd in fds.items():
            if _is_within(p, mask) and p != mask:
                if os.path.isdir(f"/proc/self/fd/{fd}"):
                    os.makedirs(p, exist_ok=True)
                else:
                    os.makedirs(os.path.dirname(p), exist_ok=True)
                    os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))
                _mount(f"/proc/self/fd/{fd}", p, None, MS_BIND | MS_REC)
        if _is_within(workdir, mask):
            os.makedirs(workdir, exist_ok=True)
        _mount(None, mask, None, MS_REMOUNT | MS_BIND | MS_RDONLY | tmpfs_flags)
    for fd in fds.values():
        os.close(fd)
    if outer:
        layers.append("masked-paths")

    opts = f"size={int(cfg['disk_mb'])}m,mode=700"
    if target_uid is not None:
        opts += f",uid={target_uid},gid={target_gid}"
    _mount("tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, opts)
    layers.append("private-tmpfs")

    # Last: the steps above read /proc/self/fd. The host's /proc would show every process.
    proc_flags = MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY
    try:
        if not pidns:
            raise OSError("no PID namespace of our own to show")
        _mount("proc", "/proc", "proc", proc_flags)
    except OSError:
        _mount("tmpfs", "/proc", "tmpfs", proc_flags, "size=4k,mode=555")
    layers.append("private-proc")


def _stdlib_reachable(needed: list[str], uid: int, gid: int) -> bool:
    return all(_untraversable_ancestor(p, uid, gid) is None for p in needed)


def _drop_privileges(cfg: dict[str, Any], may_switch_uid: bool, layers: list[str]) -> None:
    uid, gid = cfg["uid"], cfg["gid"]
    if uid is not None and may_switch_uid:
        try:
            os.setgroups([])
            if hasattr(os, "setresuid"):
                os.setresgid(gid, gid, gid)
                os.setresuid(uid, uid, uid)
            else:
                os.setgid(gid)
                os.setuid(uid)
            layers.append("nobody")
        except OSError:
            pass
    capset, prctl = _libc_fn("capset"), _libc_fn("prctl")
    if capset is not None:
        hdr = _CapHeader(version=LINUX_CAPABILITY_VERSION_3, pid=0)
        data = (_CapData * 2)()
        if capset(ctypes.byref(hdr), data) == 0:
            layers.append("no-caps")
    if prctl is not None:
        if prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0:
            layers.append("no-new-privs")
        prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # no ptrace or /proc/<pid>/mem from a sibling sandbox
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)  # die with the parent


def _set_limits(cfg: dict[str, Any], layers: list[str]) -> None:
    cpu = int(cfg["cpu_s"])
    mem = int(cfg["memory_mb"]) * 1024 * 1024
    limits = [
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (mem, mem)),
        (resource.RLIMIT_FSIZE, (int(cfg["file_bytes"]), int(cfg["file_bytes"]))),
        (resource.RLIMIT_NPROC, (0, 0)),
        (resource.RLIMIT_NOFILE, (32, 32)),
        (resource.RLIMIT_CORE, (0, 0)),
    ]
    failed = []
    for which, value in limits:
        try:
            resource.setrlimit(which, value)
        except (ValueError, OSError):  # macOS refuses some (RLIMIT_AS); the rest still apply
            failed.append(which)
    if resource.RLIMIT_CPU in failed or resource.RLIMIT_FSIZE in failed:
        raise OSError("could not set the CPU and file-size limits")
    layers.append("rlimits" if not failed else "rlimits-partial")


def _restrict_filesystem(workdir: str, read_roots: list[str], layers: list[str], max_abi: int | None = None) -> None:
    """Enter a Landlock domain: read only `read_roots` (and a few devices), write only in `workdir`;
    from ABI 6 on also no signals to, and no abstract unix sockets of, processes outside it.

    All or nothing: if a rule cannot be added, no domain is entered (half a list of readable
    directories could stop the interpreter), and the layer is missing from `layers`.

    `max_abi` holds Landlock to an older ABI than the kernel's (0: no Landlock at all), so that
    the tests can show what holds on the kernels teams run: 5.15 has ABI 1, 6.1 ABI 2, 6.8 ABI 4,
    6.12 ABI 6. The ABI used is in `layers` as "landlock-abi-N"."""
    syscall = _libc_fn("syscall")
    if syscall is None or not sys.platform.startswith("linux"):
        return
    abi = syscall(ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    if max_abi is not None:
        abi = min(abi, max_abi)
    if abi < 1:
        return
    handled = _LANDLOCK_FS_BY_ABI[min(abi, 5)]
    file_rights = (FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV) & handled
    attr = _LandlockRulesetAttr(
        handled_access_fs=handled,
        scoped=SCOPE_SIGNAL | SCOPE_ABSTRACT_UNIX_SOCKET if abi >= 6 else 0,
    )
    ruleset = syscall(
        ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0),
    )
    if ruleset < 0:
        return
    read = FS_READ_FILE | FS_READ_DIR
    device = FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE
    rules = [(workdir, handled), *[(p, read) for p in read_roots]]
    rules += [("/dev/null", device), ("/dev/zero", device), ("/dev/urandom", FS_READ_FILE), ("/dev/random", FS_READ_FILE)]
    try:
        for path, access in rules:
            try:
                fd = os.open(path, getattr(os, "O_PATH", 0) | os.O_CLOEXEC)
            except OSError:
                continue  # not on this machine
            try:
                if not stat.S_ISDIR(os.fstat(fd).st_mode):
                    access &= file_rights
                rule = _LandlockPathBeneath(allowed_access=access & handled, parent_fd=fd)
                ret = syscall(
                    ctypes.c_long(SYS_LANDLOCK_ADD_RULE), ctypes.c_int(ruleset), ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH),
                    ctypes.byref(rule), ctypes.c_uint32(0),
                )
            finally:
                os.close(fd)
            if ret != 0:
                return
        if syscall(ctypes.c_long(SYS_LANDLOCK_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0)) == 0:
            layers += ["landlock", f"landlock-abi-{abi}"]
    finally:
        os.close(ruleset)


def _seccomp_program(arch: str, self_pid: int) -> list[tuple[int, int, int, int]]:
    """The seccomp filter as classic-BPF (code, jt, jf, k) instructions, for `arch` and the pid
    the filtered process has in its own PID namespace.

    A foreign architecture (or x86_64's x32 ABI) kills the process; `REFUSED_SYSCALLS` return
    EPERM; `CHECKED_SYSCALLS` are allowed only with the arguments they list; everything else is
    allowed. Each test jumps at most over its own block, so no offset nears BPF's 255."""
    numbers = SYSCALLS[arch]
    kill = (_BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS)
    deny = (_BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | _EPERM)
    allow = (_BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW)
    prog = [(_BPF_LD_W_ABS, 0, 0, _DATA_ARCH), (_BPF_JEQ_K, 1, 0, AUDIT_ARCH[arch]), kill, (_BPF_LD_W_ABS, 0, 0, _DATA_NR)]
    if arch == "x86_64":
        prog += [(_BPF_JGE_K, 0, 1, X32_SYSCALL_BIT), kill]
    for name in REFUSED_SYSCALLS:
        if name in numbers:
            prog += [(_BPF_JEQ_K, 0, 1, numbers[name]), deny]
    for name, conditions in CHECKED_SYSCALLS:
        block: list[tuple[int, int, int, int]] = []
        for index, values in conditions:
            allowed = [self_pid if v == SELF else int(v) for v in values]
            block.append((_BPF_LD_W_ABS, 0, 0, _DATA_ARGS + 8 * index))  # the low half (both arches are little-endian)
            block += [(_BPF_JEQ_K, len(allowed) - i, 0, v & 0xFFFFFFFF) for i, v in enumerate(allowed)]
            block.append(deny)
        block.append(allow)
        prog += [(_BPF_JEQ_K, 0, len(block), numbers[name]), *block]

    def ld(index: int) -> tuple[int, int, int, int]:
        return (_BPF_LD_W_ABS, 0, 0, _DATA_ARGS + 8 * index)

    # fcntl: FCNTL_ALLOWED only, and F_SETFL without O_ASYNC.
    cmds = [c for c in FCNTL_ALLOWED if c != F_SETFL]
    block = [ld(1), (_BPF_JEQ_K, len(cmds) + 1, 0, F_SETFL)]
    block += [(_BPF_JEQ_K, len(cmds) - i + 3, 0, c) for i, c in enumerate(cmds)]
    block += [deny, ld(2), (_BPF_JSET_K, 0, 1, O_ASYNC), deny, allow]
    prog += [(_BPF_JEQ_K, 0, len(block), numbers["fcntl"]), *block]
    # open/openat: see O_ACCMODE.
    for name, dirfd, flags in (("open", None, 1), ("openat", 0, 2)):
        if name not in numbers:
            continue
        block = [] if dirfd is None else [ld(dirfd), (_BPF_JEQ_K, 1, 0, AT_FDCWD_32), deny]
        block += [ld(flags), (_BPF_JSET_K, 0, 2, O_TRUNC), (_BPF_JSET_K, 1, 0, O_ACCMODE), deny, allow]
        prog += [(_BPF_JEQ_K, 0, len(block), numbers[name]), *block]
    prog.append(allow)
    return prog


def _install_seccomp(layers: list[str]) -> None:
    """Install `_seccomp_program` for this process (it needs no-new-privs, set here too)."""
    prctl = _libc_fn("prctl")
    arch = os.uname().machine
    if prctl is None or arch not in SYSCALLS or not sys.platform.startswith("linux"):
        return
    prog = _seccomp_program(arch, os.getpid())
    filters = (_SockFilter * len(prog))(*(_SockFilter(*ins) for ins in prog))
    fprog = _SockFprog(len(prog), filters)
    zero = ctypes.c_ulong(0)
    if prctl(PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), zero, zero, zero) != 0:
        return
    if prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(fprog), zero, zero) == 0:
        layers.append("seccomp")


def _install_audit_hook(workdir: str, read_roots: tuple[str, ...]) -> None:
    """Refuse dangerous operations from Python code. See the module docstring for what."""
    write_roots = (workdir,)
    blocked_events = frozenset({
        "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
        "subprocess.Popen", "os.killpg", "os.symlink", "os.link", "pty.spawn",
        "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames",
        "code.__new__",  # hand-made bytecode reads and writes memory past every check here
    })
    write_events = frozenset({
        "os.mkdir", "os.rmdir", "os.remove", "os.rename", "os.replace", "os.truncate", "os.chmod", "os.chown",
        "os.utime", "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr",
    })
    # Where each event's dir_fd sits in its arguments (-1: none). A path relative to a dir_fd is
    # allowed only when that directory is the working directory or inside it.
    dir_fd_args = {
        "os.mkdir": (2,), "os.remove": (1,), "os.rmdir": (1,), "os.rename": (2, 3), "os.replace": (2, 3),
        "os.chmod": (2,), "os.chown": (3,), "os.utime": (3,),
    }
    workdir_st = os.stat(workdir)
    root_st = os.stat("/")
    ioctls = frozenset(int(v) for v in dict(CHECKED_SYSCALLS)["ioctl"][0][1])
    read_events = frozenset({"os.listdir", "os.scandir", "os.chdir", "os.listxattr", "os.getxattr"})
    blocked_modules = frozenset({
        "ctypes", "_ctypes", "_posixsubprocess", "_xxsubinterpreters", "_xxinterpchannels",
        "_testcapi", "_testinternalcapi",
    })
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    # Everything the hook uses is bound here: the model's code can patch modules and builtins,
    # but not these function objects, nor the methods of str and bytes.
    def hook(
        event: str,
        args: tuple[Any, ...],
        *,
        _blocked: frozenset[str] = blocked_events,
        _writes: frozenset[str] = write_events,
        _reads: frozenset[str] = read_events,
        _modules: frozenset[str] = blocked_modules,
        _read_roots: tuple[str, ...] = read_roots,
        _write_roots: tuple[str, ...] = write_roots,
        _workdir: str = workdir,
        _write_flags: int = write_flags,
        _str: type[str] = str,
        _bytes: type[bytes] = bytes,
        _int: type[int] = int,
        _isinstance: Any = isinstance,
        _len: Any = len,
        _getpid: Any = os.getpid,
        _getcwd: Any = os.getcwd,
        _lstat: Any = os.lstat,
        _readlink: Any = os.readlink,
        _type: Any = type,
        _any: Any = any,
        _range: Any = range,
        _OSError: type[OSError] = OSError,
        _Denied: type[PermissionError] = PermissionError,
        _dir_fd_args: dict[str, tuple[int, ...]] = dir_fd_args,
        _workdir_id: tuple[int, int] = (workdir_st.st_dev, workdir_st.st_ino),
        _root_id: tuple[int, int] = (root_st.st_dev, root_st.st_ino),
        _stat: Any = os.stat,
        _fcntl_allowed: frozenset[int] = frozenset(FCNTL_ALLOWED),
        _ioctls: frozenset[int] = ioctls,
        _F_SETFL: int = F_SETFL,
        _O_ASYNC: int = O_ASYNC,
    ) -> None:
        def deny(what: str) -> None:
            raise _Denied(f"blocked in the sandbox: {what}")

        def as_str(p: Any) -> str | None:
            if _isinstance(p, _str):
                return _bytes.decode(_str.encode(p, "utf-8", "surrogateescape"), "utf-8", "surrogateescape")
            if _isinstance(p, _bytes):
                return _bytes.decode(p, "utf-8", "surrogateescape")
            return None

        def resolve(p: str, depth: int = 0) -> str:
            # An absolute path with symlinks and "." / ".." resolved, using only bound C functions.
            if depth > 16:
                return "/"
            if not _str.startswith(p, "/"):
                p = _getcwd() + "/" + p
            out: list[str] = []
            parts = _str.split(p, "/")
            for i in _range(_len(parts)):
                part = parts[i]
                if part == "" or part == ".":
                    continue
                if part == "..":
                    if out:
                        out.pop()
                    continue
                out.append(part)
                cur = "/" + "/".join(out)
                try:
                    st = _lstat(cur)
                except _OSError:
                    continue
                if (st.st_mode & 0o170000) == 0o120000:
                    target = _readlink(cur)
                    if not _str.startswith(target, "/"):
                        target = "/" + "/".join(out[:-1]) + "/" + target
                    rest = "/".join(parts[i + 1:])
                    return resolve(target + "/" + rest, depth + 1)
            return "/" + "/".join(out)

        def inside(p: str, roots: tuple[str, ...]) -> bool:
            for r in roots:
                if p == r or _str.startswith(p, r + "/"):
                    return True
            return False

        def dir_in_workdir(fd: Any) -> bool:
            # Walk up from the directory `fd` names with stat (which raises no audit event).
            if not _isinstance(fd, _int):
                return False
            rel = "."
            for _ in _range(64):
                try:
                    st = _stat(rel, dir_fd=fd)
                except _OSError:
                    return False
                if (st.st_dev, st.st_ino) == _workdir_id:
                    return True
                if (st.st_dev, st.st_ino) == _root_id:
                    return False
                rel = rel + "/.."
            return False

        def check_dir_fd(event: str) -> None:
            for i in _dir_fd_args.get(event, ()):
                fd = args[i] if i < _len(args) else -1
                if fd is None or fd == -1:
                    continue
                p = as_str(args[0 if i == _dir_fd_args[event][0] else 1])
                if not dir_in_workdir(fd) or p is None or _str.startswith(p, "/") or ".." in _str.split(p, "/"):
                    deny(f"{event} relative to a directory outside the working directory")

        def check_path(p: Any, write: bool, opening: bool = False) -> None:
            if _isinstance(p, _int) or p is None:
                return
            s = as_str(p)
            if s is None:
                deny(f"path of type {_type(p).__name__}")
                return
            full = resolve(s)
            if full in ("/dev/null", "/dev/urandom", "/dev/random", "/dev/zero"):
                return
            if not inside(full, _write_roots if write else _read_roots):
                deny(f"{'writing' if write else 'reading'} {s!r} (only the working directory is allowed)")
            if opening and not inside(full, _write_roots):
                # A directory descriptor outside the working directory would be a base for paths
                # (dir_fd, fchdir) that this hook resolves from elsewhere.
                try:
                    is_dir = (_stat(full).st_mode & 0o170000) == 0o040000
                except _OSError:
                    is_dir = False
                if is_dir:
                    deny(f"opening the directory {s!r} (only directories in the working directory)")

        if event == "open":
            mode, flags = args[1], args[2]
            if _isinstance(mode, _str):
                write = _any(c in mode for c in "wax+")
            else:
                write = bool((flags or 0) & _write_flags)
            check_path(args[0], write, opening=True)
        elif event in _blocked:
            deny(event)
        elif event == "os.kill":
            if args[0] != _getpid():  # 0 and -1 too: its group holds the sandbox's own processes
                deny("signalling other processes")
        elif _str.startswith(event, "socket.") or _str.startswith(event, "ctypes."):
            deny("network access" if _str.startswith(event, "socket.") else "ctypes")
        elif event == "import":
            name = args[0]
            if name in _modules or (_isinstance(name, _str) and _str.split(name, ".")[0] in _modules):
                deny(f"import {name}")
        elif event in _writes:
            check_dir_fd(event)
            check_path(args[0], True)
            if event == "os.rename" or event == "os.replace":
                check_path(args[1], True)
        elif event == "fcntl.fcntl":
            cmd, arg = args[1], args[2]
            if cmd not in _fcntl_allowed or (cmd == _F_SETFL and _isinstance(arg, _int) and arg & _O_ASYNC):
                deny(f"fcntl command {cmd}")
        elif event == "fcntl.ioctl":
            if args[1] not in _ioctls and (_isinstance(args[1], _int) and args[1] & 0xFFFFFFFF) not in _ioctls:
                deny(f"ioctl request {args[1]:#x}" if _isinstance(args[1], _int) else "ioctl")
        elif event in _reads:
            if event == "os.chdir":
                check_path(args[0], True)  # only within the working directory
            else:
                check_path(args[0], False)
        elif event == "object.__setattr__" and args[1] in ("__code__", "__defaults__", "__kwdefaults__"):
            deny(f"setting {args[1]}")

    sys.addaudithook(hook)


def _scrub_globals() -> None:
    """Drop this module's handles on libc before the model's code runs. Its frame stays below
    the model's code (reachable by walking frames), and a ctypes function resolved here could be
    called with no audit event; the seccomp filter refuses the dangerous calls either way."""
    g = globals()
    names = [n for n, v in g.items() if n in ("_libc", "ctypes") or (isinstance(v, type) and issubclass(v, ctypes.Structure))]
    for name in names:
        del g[name]


def _close_descriptors(keep: tuple[int, ...] = (0, 1, 2)) -> None:
    """Close every descriptor but `keep`. The worker starts the child with only its pipes (close_fds),
    and this bootstrap closes what it opened; this is the second fence, so that no descriptor of a
    directory or file outside the working directory (a base for dir_fd, fchdir or `/proc/self/fd`)
    reaches the model's code by number, whatever a future caller passes down."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    high = soft if soft != resource.RLIM_INFINITY else 65536
    start = 0
    for fd in sorted(keep):
        if fd > start:
            os.closerange(start, fd)
        start = fd + 1
    os.closerange(start, max(high, start))


def _paths_not_descriptors() -> None:
    """Switch the standard library's tree walks that open files relative to a directory descriptor
    (`shutil.rmtree`, and `tempfile.TemporaryDirectory` through it) to their path-based twins: the
    seccomp filter refuses every open by dir_fd, and the audit hook checks each path these open."""
    import shutil

    shutil._use_fd_functions = False  # type: ignore[attr-defined]  # Python 3.11 to 3.13
    if hasattr(shutil, "_rmtree_impl") and hasattr(shutil, "_rmtree_unsafe"):  # 3.14 picks it at import
        shutil._rmtree_impl = shutil._rmtree_unsafe  # type: ignore[attr-defined]


def _print_exception(exc: BaseException) -> None:
    """Print a traceback as Python would, without this bootstrap's own frames."""
    try:
        te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
        seen: set[int] = set()
        todo: list[traceback.TracebackException] = [te]
        while todo:
            t = todo.pop()
            if id(t) in seen:
                continue
            seen.add(id(t))
            t.stack = traceback.StackSummary.from_list([f for f in t.stack if f.filename != __file__])
            todo += [c for c in (t.__cause__, t.__context__) if c is not None]
        sys.stderr.write("".join(te.format()))
    except BaseException:  # noqa: BLE001 - the report must not fail, whatever went wrong
        sys.stderr.write(f"{type(exc).__name__}: {exc}\n")


def main() -> None:
    cfg: dict[str, Any] = json.loads(sys.argv[1])
    status_fd: int = cfg["status_fd"]
    with os.fdopen(cfg["payload_fd"], "rb") as f:
        payload = json.loads(f.read())
    source: str = payload["code"]
    files: dict[str, str] = payload["files"]
    workdir: str = cfg["workdir"]
    root = os.geteuid() == 0
    layers: list[str] = []
    needed = [os.path.realpath(p) for p in sys.path if p and os.path.exists(p)]

    # Warm lazy imports used when reporting errors, while every file is still readable.
    try:
        raise ValueError("warm-up")
    except ValueError as e:
        traceback.format_exception(type(e), e, e.__traceback__)

    try:
        namespaces = _enter_namespaces(root, layers) if cfg["namespaces"] else 0
        if namespaces & CLONE_NEWPID:
            _split_pid_namespace(status_fd)  # from here on, this is pid 2 of the new namespace
            layers.append("pidns")
        if "userns" in layers:
            cfg = {**cfg, "uid": None, "gid": None}  # only our own ids exist in a user namespace
        uid, gid = cfg["uid"], cfg["gid"]
        view_ok = False
        if namespaces & CLONE_NEWNS:
            try:
                _build_mount_view(cfg, needed, bool(namespaces & CLONE_NEWPID), layers)
                view_ok = True
            except OSError:
                layers.append("mount-view-failed")  # reported in SandboxResult.isolation, not to the model
        os.chdir(workdir)
        # Switch to the unprivileged uid only if it can still import the standard library.
        may_switch = uid is not None and (view_ok or _stdlib_reachable(needed, uid, gid))
        if may_switch and not view_ok:
            os.chown(".", uid, gid)  # the on-disk workdir becomes the sandbox user's
        _drop_privileges(cfg, may_switch, layers)
        for name, text in files.items():
            os.makedirs(os.path.dirname(name) or ".", exist_ok=True)
            with open(name, "w", encoding="utf-8") as fh:
                fh.write(text)
        _set_limits(cfg, layers)
        real_workdir = os.getcwd()
        _restrict_filesystem(real_workdir, [*needed, *SYSTEM_READ_PATHS], layers, cfg.get("landlock_abi"))
        _install_seccomp(layers)
        if os.geteuid() == 0 and "readonly-fs" not in layers and "landlock" not in layers:
            # uid 0 without capabilities still owns every root-owned file: with no read-only
            # mount view and no Landlock, only the audit hook would keep the code off them.
            raise OSError("the code would run as root with no read-only mounts and no Landlock "
                          "(the sandbox user cannot reach the interpreter's library)")
    except Exception as e:  # noqa: BLE001 - any setup failure must stop before the model's code runs
        sys.stderr.write(f"sandbox setup failed: {e}\n")
        os._exit(EXIT_SETUP_FAILED)

    read_roots = tuple(dict.fromkeys([real_workdir, *needed]))
    if cfg["audit_hook"]:
        layers.append("audit")
    _paths_not_descriptors()
    os.write(status_fd, json.dumps(layers).encode())
    os.close(status_fd)
    _close_descriptors()

    # The model's code gets its own __main__, sys.path starting at the workdir, and no ctypes.
    for name in ("ctypes", "_ctypes", "ctypes._endian"):
        sys.modules.pop(name, None)
    module = types.ModuleType("__main__")
    module.__dict__["__builtins__"] = builtins
    module.__dict__["__file__"] = "main.py"
    sys.modules["__main__"] = module
    sys.argv = ["main.py"]
    sys.path.insert(0, real_workdir)
    linecache.cache["main.py"] = (len(source), None, source.splitlines(True), "main.py")
    if cfg["audit_hook"]:
        _install_audit_hook(real_workdir, read_roots)
    _scrub_globals()

    try:
        code = compile(source, "main.py", "exec")
    except (SyntaxError, ValueError) as e:
        _print_exception(e)
        sys.exit(1)
    try:
        exec(code, module.__dict__)  # noqa: S102 - running this code is the point of the sandbox
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 - report like the interpreter would
        _print_exception(e)
        sys.exit(1)


if __name__ == "__main__":
    main()

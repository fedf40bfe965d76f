"""The first code that runs inside a sandbox process: it locks the process down, then runs the model's code.

`agents.sandbox` starts this file as a script with a fresh interpreter
(`python -s -S -B -P -u -X utf8 _sandbox_child.py CONFIG_JSON`), standard library only.
Setting up here, in the child, instead of in a `preexec_fn` keeps the parent safe to call
from a multi-threaded trainer. Every layer is best-effort; the layers that took hold are
written as a JSON list to the status pipe before the model's code starts:

- `netns`: a new network namespace with no interface up (no TCP/UDP anywhere, 127.0.0.1 included);
  `userns` when an unprivileged user needed a user namespace to get it.
- `mountns`: a private mount namespace; with it `readonly-fs` (every mount read-only),
  `masked-paths` (empty read-only tmpfs over the project, /home, /root, /run, the temp
  dirs...; the interpreter's own library directories are bound back in) and `private-tmpfs`
  (the working directory is a fresh size-limited, noexec tmpfs).
- `nobody`: when started as root, the process switches to uid/gid 65534 (so RLIMIT_NPROC
  and file permissions apply); `no-caps`: every capability dropped; `no-new-privs`.
- `rlimits`: CPU seconds, address space, file size, processes (0: no fork, no threads),
  open files, no core dumps.
- `audit`: a `sys.addaudithook` hook refusing sockets, fork/exec/subprocess, ctypes,
  sub-interpreters, and file access outside the working directory (reads also allowed in
  the standard library). It holds no mutable state and calls no patchable Python code.
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
from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
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
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (added in Linux 5.12)
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
LINUX_CAPABILITY_VERSION_3 = 0x20080522

EXIT_SETUP_FAILED = 125

_libc = ctypes.CDLL(None, use_errno=True)


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


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


def _enter_namespaces(root: bool, layers: list[str]) -> bool:
    """Unshare network (and mount) namespaces; returns whether a private mount namespace is in place."""
    unshare = _libc_fn("unshare")
    if unshare is None or not sys.platform.startswith("linux"):
        return False
    uid, gid = os.getuid(), os.getgid()
    attempts: list[int] = []
    if root:
        attempts += [CLONE_NEWNS | CLONE_NEWNET, CLONE_NEWNET]
    attempts += [CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET, CLONE_NEWUSER | CLONE_NEWNET]
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
                return False
            layers.append("userns")
        layers.append("netns")
        if flags & CLONE_NEWNS:
            layers.append("mountns")
            return True
        return False
    return False


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


def _build_mount_view(cfg: dict[str, Any], needed: list[str], layers: list[str]) -> None:
    """Make every mount read-only, mask sensitive trees, re-expose `needed`, mount the workdir tmpfs."""
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


def _install_audit_hook(workdir: str, read_roots: tuple[str, ...]) -> None:
    """Refuse dangerous operations from Python code. See the module docstring for what."""
    write_roots = (workdir,)
    blocked_events = frozenset({
        "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
        "subprocess.Popen", "os.killpg", "os.symlink", "os.link", "pty.spawn",
        "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames",
    })
    write_events = frozenset({
        "os.mkdir", "os.rmdir", "os.remove", "os.rename", "os.truncate", "os.chmod", "os.chown",
        "os.utime", "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr",
    })
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

        def check_path(p: Any, write: bool) -> None:
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

        if event == "open":
            mode, flags = args[1], args[2]
            if _isinstance(mode, _str):
                write = _any(c in mode for c in "wax+")
            else:
                write = bool((flags or 0) & _write_flags)
            check_path(args[0], write)
        elif event in _blocked:
            deny(event)
        elif event == "os.kill":
            if args[0] != _getpid() and args[0] != 0:
                deny("signalling other processes")
        elif _str.startswith(event, "socket.") or _str.startswith(event, "ctypes."):
            deny("network access" if _str.startswith(event, "socket.") else "ctypes")
        elif event == "import":
            name = args[0]
            if name in _modules or (_isinstance(name, _str) and _str.split(name, ".")[0] in _modules):
                deny(f"import {name}")
        elif event in _writes:
            check_path(args[0], True)
            if event == "os.rename":
                check_path(args[1], True)
        elif event in _reads:
            if event == "os.chdir":
                check_path(args[0], True)  # only within the working directory
            else:
                check_path(args[0], False)
        elif event == "object.__setattr__" and args[1] in ("__code__", "__defaults__", "__kwdefaults__"):
            deny(f"setting {args[1]}")

    sys.addaudithook(hook)


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
        has_mountns = _enter_namespaces(root, layers)
        if "userns" in layers:
            cfg = {**cfg, "uid": None, "gid": None}  # only our own ids exist in a user namespace
        uid, gid = cfg["uid"], cfg["gid"]
        view_ok = False
        if has_mountns:
            try:
                _build_mount_view(cfg, needed, layers)
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
    except Exception as e:  # noqa: BLE001 - any setup failure must stop before the model's code runs
        sys.stderr.write(f"sandbox setup failed: {e}\n")
        os._exit(EXIT_SETUP_FAILED)

    real_workdir = os.getcwd()
    read_roots = tuple(dict.fromkeys([real_workdir, *needed]))
    if cfg["audit_hook"]:
        layers.append("audit")
    os.write(status_fd, json.dumps(layers).encode())
    os.close(status_fd)

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

"""Watching a run's child processes (issue 45, class 5): none may wedge the worker.

A run's children are the async sampler's process (`training.async_rollout`) and a multi-GPU
launch's ranks (`training.distributed.launch`); the code sandbox (`agents.sandbox`) bounds its own
child with a wall-clock deadline. The worker's own heartbeat (`webapp.runs.queue.run_heartbeat`)
says only that the worker's process is alive, not that the run moves, so each wait on a child is
bounded here and checked for three things while it lasts:

- the run's stop request: it lands within one poll, whatever the child is doing; a launch whose
  ranks have not ended `TROUPE_STOP_GRACE_SECONDS` (900 by default: a stop saves a checkpoint)
  after it is killed;
- the child's heartbeat: a thread in the child writes one every `BEAT_S`; a child silent for
  `TROUPE_CHILD_SILENT_SECONDS` (120 by default) is stopped, swapped to a halt or wedged in C
  holding its interpreter lock, and is killed, the run failing with a reason that names it;
- the child's death: the run fails with its exit status.

A child that is alive and beating but makes no progress (a loop in plugin code) is not caught
here: a Stop lands all the same, and `TROUPE_MAX_RUN_HOURS` bounds the run.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

BEAT_S = 1.0
"""How often a child's heartbeat thread writes."""
SILENT_ENV = "TROUPE_CHILD_SILENT_SECONDS"
DEFAULT_SILENT_S = 120.0
STOP_GRACE_ENV = "TROUPE_STOP_GRACE_SECONDS"
DEFAULT_STOP_GRACE_S = 900.0
STARTUP_S = 120.0
"""The least time a child gets to send its first heartbeat (starting one imports torch)."""


def _seconds(environ: Mapping[str, str] | None, name: str, default: float) -> float:
    raw = (os.environ if environ is None else environ).get(name, "")
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive number of seconds, got {raw!r}")
    return value


def silent_limit(environ: Mapping[str, str] | None = None) -> float:
    """`TROUPE_CHILD_SILENT_SECONDS` (a positive number of seconds), else `DEFAULT_SILENT_S`."""
    return _seconds(environ, SILENT_ENV, DEFAULT_SILENT_S)


def stop_grace(environ: Mapping[str, str] | None = None) -> float:
    """`TROUPE_STOP_GRACE_SECONDS` (a positive number of seconds), else `DEFAULT_STOP_GRACE_S`."""
    return _seconds(environ, STOP_GRACE_ENV, DEFAULT_STOP_GRACE_S)


@contextmanager
def heartbeat_file(path: Path) -> Iterator[None]:
    """While the block runs, a daemon thread touches `path` (its mtime is the heartbeat) every
    `BEAT_S`; a stopped or wedged process stops touching it. The file holds this process's pid,
    written whole once, before the block (a temporary file renamed into place), and never
    truncated after: a process stopped in the middle of a beat still names its pid."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_pid(path)
    done = threading.Event()

    def beat() -> None:
        while True:
            try:
                os.utime(path)
            except FileNotFoundError:  # removed under it: written afresh
                _write_pid(path)
            except OSError:
                pass  # the watcher sees the silence
            if done.wait(BEAT_S):
                return

    thread = threading.Thread(target=beat, name=f"heartbeat-{path.name}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        path.unlink(missing_ok=True)  # ended: a finished rank is not a silent one


def _write_pid(path: Path) -> None:
    """`path` holding this process's pid, put in place whole (the watcher skips the hidden temporary)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(str(os.getpid()), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)  # a full disk: the watcher sees the silence


def silent_heartbeats(folder: Path, *, limit: float, since: float, now: float | None = None,
                      startup: float | None = STARTUP_S) -> list[str]:
    """Why each child beating into `folder` is silent: "rank-1 (pid 123) sent no heartbeat for 130 s".
    While no child has written, the launch counts from `since` (its start) and is allowed at least
    `startup` seconds (None: any time; Ray's start on a loaded cluster is not bounded here). Times
    are wall-clock (`time.time()`, the clock of file modification times)."""
    now = time.time() if now is None else now
    out = []
    try:
        entries = sorted(folder.iterdir())
    except FileNotFoundError:
        entries = []
    entries = [path for path in entries if not path.name.startswith(".")]  # a heartbeat being put in place
    for path in entries:
        try:
            age = now - path.stat().st_mtime
            pid = path.read_text(encoding="utf-8").strip()
        except (FileNotFoundError, ValueError):
            continue
        if age > limit:
            out.append(f"{path.name} (pid {pid or '?'}) sent no heartbeat for {age:.0f} s")
    if not entries and startup is not None and now - since > max(limit, startup):
        out.append(f"no process sent a heartbeat in the {now - since:.0f} s since the launch")
    return out


def end_process_group(proc: subprocess.Popen[bytes], *, grace: float = 30.0) -> None:
    """End `proc` and every process of its group (it was started with `start_new_session`): SIGCONT
    (a stopped process cannot act on SIGTERM), SIGTERM, `grace` seconds, then SIGKILL."""
    for sig in (signal.SIGCONT, signal.SIGTERM):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the group, the leader gone or not
    except ProcessLookupError:
        pass
    proc.wait()

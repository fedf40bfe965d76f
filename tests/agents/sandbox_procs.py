"""Test helper: whether a sandbox process (and its process group) is gone (see the `spawned` fixture in conftest.py)."""

from __future__ import annotations

from pathlib import Path


def gone(proc) -> bool:
    """No live process is left in the sandbox's process group: each one there (the started one,
    its PID namespace's init and the code) is a zombie or has SIGKILL pending (a namespace's init
    waits, killed, for the host's init to reap its children)."""
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
            if int(Path(status.parent, "stat").read_text().rsplit(")", 1)[1].split()[2]) != proc.pid:
                continue
        except (OSError, IndexError, ValueError):
            continue
        killed = (int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)) & (1 << (9 - 1))
        if not fields["State"].startswith(("Z", "X")) and not killed:
            return False
    return True

"""A launch's ranks are watched (issue 45, class 5): a rank that dies, goes silent (SIGSTOP) or
ignores a stop ends the launch with its reason, and nothing of its process group is left. The
launcher's watcher (`training.distributed._watch`) runs here on a fake launch: a process that
starts a "rank" grandchild beating into the heartbeat folder as `training.rank` does, then dies,
stops itself or runs on."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from training import distributed, watchdog
from training.distributed import DistributedRunError, _RelayReader, _watch
from training.events import NullSink

ROOT = Path(__file__).resolve().parents[2]

# The fake launch: like torchrun, it starts the rank and waits for it. The rank beats, says it has
# beaten once (the file `ready`), then does what MODE says.
FAKE_LAUNCH = """
import subprocess, sys
rank = subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:]])
sys.exit(rank.wait())
"""
FAKE_RANK = """
import os, signal, sys, threading
from pathlib import Path
from training.watchdog import heartbeat_file
beats, mode, ready = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
with heartbeat_file(beats / "rank-1"):
    while not (beats / "rank-1").exists():
        pass
    Path(str(ready) + ".pid").write_text(str(os.getpid()))
    ready.touch()
    if mode == "die":
        raise SystemExit(7)  # an error ends the rank: its heartbeat file goes with it
    if mode == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    threading.Event().wait()  # "run on": ignore every stop file
"""


class StopAfter(NullSink):
    def __init__(self, ready: Path) -> None:
        self.ready = ready

    def should_stop(self) -> bool:
        return self.ready.exists()


def fake_launch(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[bytes], Path]:
    ready = tmp_path / "ready"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", FAKE_LAUNCH, FAKE_RANK, str(tmp_path / "heartbeats"), mode, str(ready)],
                            env=env, start_new_session=True)
    return proc, ready


def watch(proc: subprocess.Popen[bytes], tmp_path: Path, sink: NullSink, *, limit: float = 600.0, grace: float = 600.0):
    return _watch(proc, _RelayReader(tmp_path / "relay.jsonl"), sink, stop_file=tmp_path / "STOP", beats=tmp_path / "heartbeats",
                  limit=limit, grace=grace, poll_s=0.05)


def gone(pid: int) -> bool:
    """Dead (a zombie waiting for a reaper counts: it runs nothing and holds nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def ends(pid: int, bound_s: float = 60.0) -> bool:
    """The process dies: a signal sent to a process group is delivered after `killpg` returns, so
    wait for the death itself (the bound only stops a hang)."""
    deadline = time.monotonic() + bound_s
    while not gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_rank_that_dies_ends_the_launch(tmp_path):
    proc, ready = fake_launch(tmp_path, "die")
    assert watch(proc, tmp_path, NullSink()) == (None, None)
    assert proc.returncode == 7 and ready.exists()
    assert not list((tmp_path / "heartbeats").iterdir())  # a rank that ended is not a silent one


def test_a_stopped_rank_is_killed_with_its_group_and_named(tmp_path):
    proc, ready = fake_launch(tmp_path, "stop")
    with pytest.raises(DistributedRunError, match=r"rank-1 \(pid \d+\) sent no heartbeat for \d+ s \(stopped or hung; the limit is "
                                                  r"TROUPE_CHILD_SILENT_SECONDS=2\): the launch was killed"):
        watch(proc, tmp_path, NullSink(), limit=2.0)
    assert proc.returncode is not None and ready.exists()
    assert ends(int(Path(str(ready) + ".pid").read_text()))


def test_a_stop_that_the_ranks_ignore_ends_the_launch_after_the_grace(tmp_path):
    proc, ready = fake_launch(tmp_path, "run on")
    with pytest.raises(DistributedRunError, match=r"stop requested, and the launch had not ended 1 s later \(TROUPE_STOP_GRACE_SECONDS\)"):
        watch(proc, tmp_path, StopAfter(ready), grace=1.0)
    assert (tmp_path / "STOP").exists()
    assert proc.returncode is not None and ends(int(Path(str(ready) + ".pid").read_text()))


def test_a_launch_where_no_rank_ever_beats_is_killed(tmp_path):
    beats = tmp_path / "heartbeats"
    now = time.time()
    assert watchdog.silent_heartbeats(beats, limit=5, since=now - 60, now=now) == []  # still starting: STARTUP_S at least
    assert watchdog.silent_heartbeats(beats, limit=5, since=now - 121, now=now) == [
        "no process sent a heartbeat in the 121 s since the launch"]
    assert watchdog.silent_heartbeats(beats, limit=5, since=now - 121, now=now, startup=None) == []
    beats.mkdir()
    (beats / "rank-0").write_text("41")
    (beats / "rank-1").write_text("42")
    os.utime(beats / "rank-1", (now - 30, now - 30))
    assert watchdog.silent_heartbeats(beats, limit=10, since=now - 121, now=now) == ["rank-1 (pid 42) sent no heartbeat for 30 s"]


@pytest.mark.parametrize("name", [watchdog.SILENT_ENV, watchdog.STOP_GRACE_ENV])
def test_a_bad_limit_names_its_variable_before_anything_starts(make_config, tmp_path, monkeypatch, name):
    monkeypatch.setenv(name, "soon")
    with pytest.raises(ValueError, match=f"{name} must be a positive number of seconds, got 'soon'"):
        distributed.launch(make_config("lora"), tmp_path / "out", NullSink())
    assert not (tmp_path / "out").exists()


def test_a_heartbeat_file_always_names_its_pid(tmp_path, monkeypatch):
    """The pid is written whole before the block and a beat never truncates it, so a process stopped
    in the middle of a beat still names itself ("rank-1 (pid ?)" was the symptom)."""
    monkeypatch.setattr(watchdog, "BEAT_S", 0.0005)
    path = tmp_path / "beats" / "rank-0"
    with watchdog.heartbeat_file(path):
        seen = {path.read_text() for _ in range(3000)}
        first = path.stat().st_mtime_ns
        deadline = time.monotonic() + 60
        while path.stat().st_mtime_ns == first and time.monotonic() < deadline:
            time.sleep(0.001)
        assert path.stat().st_mtime_ns != first  # it beats
    assert seen == {str(os.getpid())}
    assert not path.exists() and not list(path.parent.iterdir())  # no temporary left


def test_a_heartbeat_being_put_in_place_is_not_a_child(tmp_path):
    beats = tmp_path / "beats"
    beats.mkdir()
    (beats / ".rank-1.123.tmp").write_text("")
    os.utime(beats / ".rank-1.123.tmp", (0, 0))
    assert watchdog.silent_heartbeats(beats, limit=2.0, since=time.time()) == []

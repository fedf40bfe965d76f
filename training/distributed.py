"""Several GPUs on one host: data-parallel training through torchrun.

A run with `resources.gpus: N > 1` and `resources.parallel: data` (or `fsdp`) has the `torchrun`
launcher in its plan (`training.plan`): the runner (`training.runner.train`) calls `launch`, which
starts `torchrun --nproc_per_node N -m training.rank CONFIG OUT` and relays what rank 0 reports
to the caller's sink. Inside the launch every rank runs the same loop (`training.rank.run_rank`):

- each rank rolls out its share of the step's tasks (tasks i, i+N, ... of the step's batch),
  sampling with its own generator;
- the samples of every rank are one GRPO batch: micro-batch weights use the global sample and
  token counts, and the gradients are summed across ranks before clipping and the optimizer
  step, so every rank's copy of the weights stays identical;
- episodes and update statistics are gathered, so rank 0 reports the whole step; rank 0 alone
  evaluates and saves checkpoints (with every rank's generator state), and its sink's stop
  request reaches every rank at the next step.

The relay is a file in the output folder (`relay.jsonl`, one JSON event per line, written by
rank 0's `RelaySink`) and a stop file (`STOP`) that the launcher touches when its own sink asks
to stop. Nothing here knows about Django: the web worker's sink is the caller's sink.

On a host without CUDA the processes use the CPU and the gloo backend (what the tests run).

The launcher watches the launch (`_watch`, `training.watchdog`; issue 45, class 5): every rank
writes a heartbeat file (`heartbeats/rank-N`) from a thread; a rank silent for
`TROUPE_CHILD_SILENT_SECONDS`, or a launch still running `TROUPE_STOP_GRACE_SECONDS` after a stop
request, has its whole process group killed and fails the run naming the rank or the stop; a rank
that dies ends the launch through torchrun, which stops the others.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist
from torch.distributed.tensor import DTensor

from training.config import RunConfig
from training.events import EventSink, NullSink, StepMetrics, TrainResult
from training.watchdog import end_process_group, silent_heartbeats, silent_limit, stop_grace

RELAY_FILE = "relay.jsonl"
STOP_FILE = "STOP"
HEARTBEATS = "heartbeats"
"""The folder in the output folder where each rank's heartbeat thread writes `rank-N`."""
COLLECTIVE_TIMEOUT = timedelta(hours=6)
"""How long a rank waits in a collective call (NCCL's default of 10 minutes is shorter than a
held-out evaluation of a large model on rank 0)."""
_BUCKET = 1 << 24
"""Gradient elements summed in one collective call."""


class DistributedRunError(RuntimeError):
    """A rank failed; the message carries rank 0's error and traceback, or the launcher's output."""


@dataclass(frozen=True)
class Dist:
    """This process's place in a data-parallel launch; the default is a single process."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    group: Any = None
    """The process group the collectives run on: None, every rank of the launch; a rank group of
    `resources.placement` (`training.placement`), with `rank` and `world` counted inside it."""

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def device(self) -> torch.device | None:
        """The GPU this rank uses, or None (the default device choice) without CUDA."""
        if self.enabled and torch.cuda.is_available():
            return torch.device("cuda", self.local_rank)
        return None

    # -- collectives (no-ops in a single process) ------------------------------------------------

    def sum(self, values: Iterable[float]) -> list[float]:
        values = list(values)
        if not self.enabled:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self._comm_device())
        torch_dist.all_reduce(t, group=self.group)
        return t.tolist()

    def max(self, value: float) -> float:
        if not self.enabled:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self._comm_device())
        torch_dist.all_reduce(t, op=torch_dist.ReduceOp.MAX, group=self.group)
        return float(t.item())

    def any(self, flag: bool) -> bool:
        return self.max(1.0 if flag else 0.0) > 0 if self.enabled else flag

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank."""
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world
        torch_dist.all_gather_object(out, obj, group=self.group)
        return out

    def barrier(self) -> None:
        if self.enabled:
            torch_dist.barrier(group=self.group)

    def sum_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Sum each parameter's gradient over the ranks (a rank without samples adds zeros).
        Parameters sharded by FSDP (DTensors) are left out: their backward summed them already."""
        params = [p for p in params if not isinstance(p, DTensor)]
        if not self.enabled or not params:
            return
        grads = []
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        bucket: list[torch.Tensor] = []
        size = 0
        for g in grads:
            bucket.append(g)
            size += g.numel()
            if size >= _BUCKET:
                _sum_bucket(bucket, self.group)
                bucket, size = [], 0
        if bucket:
            _sum_bucket(bucket, self.group)

    def _comm_device(self) -> torch.device:
        return self.device() or torch.device("cpu")


def _sum_bucket(grads: list[torch.Tensor], group: Any = None) -> None:
    flat = torch.cat([g.reshape(-1) for g in grads])  # (n,)
    torch_dist.all_reduce(flat, group=group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def from_env() -> Dist:
    """The launch this process is part of (torchrun's environment), joining its process group."""
    if not in_launch():
        return Dist()
    world = int(os.environ["WORLD_SIZE"])
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if not torch_dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank)
        # rank 0 evaluates and saves while the others wait in a barrier: allow long evaluations
        torch_dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo", timeout=COLLECTIVE_TIMEOUT)
    return Dist(rank=rank, world=world, local_rank=local_rank)


def in_launch() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


# == the launcher (the caller's process) ==========================================================


def check_gpus(config: RunConfig) -> None:
    """Refuse a run that asks for more GPUs than this host has."""
    want = config.resources.gpus
    if torch.cuda.is_available() and torch.cuda.device_count() < want:
        raise DistributedRunError(f"resources.gpus: the run asks for {want} GPUs, this host has {torch.cuda.device_count()}")


def launch(config: RunConfig, out: Path, sink: EventSink, *, poll_s: float = 0.5) -> Any:
    """Run `config` in `resources.gpus` processes and relay rank 0's events to `sink`; return
    the `TrainResult` rank 0 reported. Raises `DistributedRunError` when the launch fails."""
    check_gpus(config)
    limit, grace = silent_limit(), stop_grace()  # a bad value fails the run before anything starts
    out.mkdir(parents=True, exist_ok=True)
    relay, stop = out / RELAY_FILE, out / STOP_FILE
    relay.unlink(missing_ok=True)
    stop.unlink(missing_ok=True)
    config_file = out / "launch-config.yaml"
    config_file.write_text(config.to_yaml(), encoding="utf-8")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={config.resources.gpus}",
        "-m",
        "training.rank",
        str(config_file),
        str(out),
    ]
    sink.log(f"launching {config.resources.gpus} processes: {' '.join(cmd[2:])}")
    log_file = out / "launch.log"
    beats = out / HEARTBEATS
    for old in beats.glob("rank-*"):
        old.unlink()
    with open(log_file, "wb") as log:
        # its own session: the launcher ends torchrun and every rank with one signal to the group
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,  # noqa: S603, PLW1509
                                start_new_session=True)
        result, error = _watch(proc, _RelayReader(relay), sink, stop_file=stop, beats=beats, limit=limit, grace=grace,
                               poll_s=poll_s)
    relay.unlink(missing_ok=True)  # replayed: the caller's sink kept what it wanted of it
    stop.unlink(missing_ok=True)
    if error is not None:
        raise DistributedRunError(f"{error['message']}\n\nrank 0 traceback:\n{error['traceback']}")
    if proc.returncode != 0 or result is None:
        tail = log_file.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise DistributedRunError(f"the {config.resources.gpus}-process launch exited with status {proc.returncode}:\n{tail}")
    return TrainResult(**{k: v for k, v in result.items() if k != "type"})  # RelaySink.finish wrote asdict(result)


def _watch(proc: subprocess.Popen[bytes], reader: _RelayReader, sink: EventSink, *, stop_file: Path, beats: Path, limit: float,
           grace: float, poll_s: float) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """Relay the launch's events to `sink` until `proc` ends; returns rank 0's result and error
    events. A stop request touches `stop_file`; a rank silent for `limit` seconds (its heartbeat
    file in `beats`), or a launch still running `grace` seconds after the stop, is ended with its
    process group and raises `DistributedRunError` saying why."""
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    started, stopped_at = time.time(), None
    try:
        while True:
            done = proc.poll() is not None
            for event in reader.read():
                if event["type"] == "result":
                    result = event
                elif event["type"] == "error":
                    error = event
                else:
                    replay(event, sink)
            if done:
                return result, error
            if stopped_at is None and sink.should_stop():
                stop_file.touch()
                stopped_at = time.monotonic()
            silent = silent_heartbeats(beats, limit=limit, since=started)
            if silent:
                raise DistributedRunError(f"{'; '.join(silent)} (stopped or hung; the limit is TROUPE_CHILD_SILENT_SECONDS="
                                          f"{limit:g}): the launch was killed")
            if stopped_at is not None and time.monotonic() - stopped_at > grace:
                raise DistributedRunError(f"stop requested, and the launch had not ended {grace:g} s later "
                                          f"(TROUPE_STOP_GRACE_SECONDS): it was killed")
            time.sleep(poll_s)
    except BaseException:
        end_process_group(proc)
        raise


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the launching process dies (a killed worker leaves no
    orphaned training processes holding its GPUs)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class _RelayReader:
    """Reads the complete lines appended to the relay file since the last call."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        return [json.loads(line) for line in data[:end].splitlines() if line.strip()]


def replay(event: dict[str, Any], sink: EventSink) -> None:
    """Call `sink` as rank 0's sink was called."""
    kind = event["type"]
    if kind == "run_started":
        sink.run_started(total_steps=event["total_steps"], start_step=event["start_step"])
    elif kind == "metrics":
        sink.metrics(StepMetrics(**event["metrics"]))
    elif kind == "rollouts":
        sink.rollouts(event["step"], event["episodes"])
    elif kind == "log":
        sink.log(event["message"], level=event["level"])
    elif kind == "checkpoint":
        sink.checkpoint(event["step"], event["path"])
    elif kind == "evaluation":
        sink.evaluation(event["result"])
    elif kind == "status":
        sink.status(event["phase"], event["detail"], progress=event["progress"], eta=event["eta"])
    elif kind == "plan":
        sink.plan(event["plan"])


# == inside the launch =============================================================================


class RelaySink(NullSink):
    """Rank 0's sink: every event becomes a line of the relay file; a stop file asks to stop."""

    def __init__(self, out: Path):
        self.path, self.stop_file = out / RELAY_FILE, out / STOP_FILE

    def _write(self, event: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(event, ensure_ascii=False) + "\n")

    def run_started(self, *, total_steps: int, start_step: int) -> None:
        self._write({"type": "run_started", "total_steps": total_steps, "start_step": start_step})

    def metrics(self, m: StepMetrics) -> None:
        self._write({"type": "metrics", "metrics": asdict(m)})

    def rollouts(self, step: int, episodes: list[dict[str, Any]]) -> None:
        self._write({"type": "rollouts", "step": step, "episodes": episodes})

    def log(self, message: str, *, level: str = "info") -> None:
        self._write({"type": "log", "message": message, "level": level})

    def checkpoint(self, step: int, path: str) -> None:
        self._write({"type": "checkpoint", "step": step, "path": path})

    def evaluation(self, result: dict[str, Any]) -> None:
        self._write({"type": "evaluation", "result": result})

    def status(self, phase: str, detail: str, *, progress: float | None = None, eta: float | None = None) -> None:
        self._write({"type": "status", "phase": phase, "detail": detail, "progress": progress, "eta": eta})

    def plan(self, plan: dict[str, Any]) -> None:
        self._write({"type": "plan", "plan": plan})

    def should_stop(self) -> bool:
        return self.stop_file.exists()

    def finish(self, result: Any) -> None:
        self._write({"type": "result", **asdict(result)})

    def fail(self, exc: BaseException) -> None:
        self._write({"type": "error", "message": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})

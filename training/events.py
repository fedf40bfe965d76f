"""How the trainer reports: an EventSink receives metrics, rollouts, logs, checkpoints,
evaluations and what the run is doing now (`status`), and is asked `should_stop()` once per step.

The CLI uses `JsonlSink` (metrics.jsonl, rollouts.jsonl, events.jsonl in the output folder) plus
`ProgressSink` (a progress bar with ETA on stderr). The web's sink (webapp) writes the database
and publishes small deltas to the channel layer. Payloads are plain JSON-ready dicts.

Payload shapes (the web and the CLI rely on them):

- metrics: `StepMetrics(step, total_steps, values, agents, time)`; `values` holds run-wide
  numbers (`reward/total`, `reward/team`, `success`, `step_time`, `tokens_per_s`, ...), `agents`
  maps agent name -> the same kind of dict for that agent (`reward/total`, `reward/local`,
  `loss`, `kl`, `entropy`, `clip_ratio`, `completion_len`, `grad_norm`, `lr`, ...).
- rollouts: a list of episode dicts:
  `{"task_id", "step", "success", "team_reward", "turns": [{"index", "agent", "role", "prompt",
  "chosen", "candidates": [{"text", "reward", "team", "local", "advantage", "tool_output",
  "tokens", "truncated"}]}]}`
- evaluation: `{"step", "split", "temperature", "n", "team": {"success"}, "agents":
  {name: {"success", "reward"}}}`
- status: `status(phase, detail, progress=None, eta=None)`: the run entered (or moved on within)
  one of `PHASES`; `detail` is one sentence for a person that agrees with `progress`
  ("Evaluating at step 10 on 100 held-out tasks: 50% done (40 finished)"), `progress` the share
  of the phase done (0..1, None when unknown) and `eta` the seconds the whole run still needs by the engine's estimate (None before it can tell).
  Sent at each phase change and as a long phase advances (a few times per evaluation), never
  per token.
- plan: `plan(plan)`, once, at the run's start: how it executes (`training.plan.Plan.to_dict`:
  launcher, hosts, ranks, parallel, device, placement, backend and why, sampler and why, queue,
  and a one-line `summary`).
- placed: `placed(where)`, once, when a launcher knows where the run's ranks live. From the Ray
  launcher (`training.ray_launch.placed`): `{"launcher": "ray", "address", "hosts" (asked),
  "ranks", "resource" ("GPU" or "CPU", one per rank), "nodes": {Ray node name: ranks on it},
  "waited_s"}`.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO

PHASES = ("waiting", "starting", "converting", "loading", "evaluating", "training", "checkpointing", "stopping")
"""What a run can be doing: waiting for a Ray cluster to grant its ranks' GPUs or CPUs (a run on
several hosts, `training.ray_launch.admit`), starting its ranks there (Ray Train's processes, until
rank 0 reports), converting a model to a Hugging Face folder (first use
only), loading its policies, evaluating on the held-out tasks, training a step, saving a
checkpoint, stopping (asked to; saving a checkpoint first)."""


@dataclass(frozen=True)
class StepMetrics:
    step: int
    """1-based index of the step just finished."""
    total_steps: int
    values: dict[str, float]
    """Run-wide metrics for this step."""
    agents: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per-agent metrics for this step."""
    time: float = field(default_factory=time.time)
    """Wall-clock time (epoch seconds) when the step ended."""


@dataclass
class TrainResult:
    """What `train` returns (and a multi-process launch relays from rank 0)."""

    status: str
    """`succeeded` or `cancelled`."""
    step: int
    start_step: int = 0
    """The step the run resumed from (0 for a fresh run)."""
    final_metrics: dict[str, float] = field(default_factory=dict)
    checkpoint: str | None = None
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""
    """Why a run ended as it did when that is not plain, e.g. cancelled before any rank started."""


def summary(evaluation: dict[str, Any]) -> dict[str, Any]:
    """An evaluation's result (`training.evaluation.evaluate`) without its episodes: what a listing,
    a live message or a printed line carries."""
    return {k: v for k, v in evaluation.items() if k not in ("episodes", "examples")}  # `examples`: the 3 kept before


class EventSink(Protocol):
    def run_started(self, *, total_steps: int, start_step: int) -> None: ...

    def metrics(self, m: StepMetrics) -> None: ...

    def rollouts(self, step: int, episodes: list[dict[str, Any]]) -> None: ...

    def log(self, message: str, *, level: str = "info") -> None: ...

    def checkpoint(self, step: int, path: str) -> None: ...

    def evaluation(self, result: dict[str, Any]) -> None: ...

    def status(self, phase: str, detail: str, *, progress: float | None = None, eta: float | None = None) -> None: ...

    def placed(self, where: dict[str, Any]) -> None: ...

    def plan(self, plan: dict[str, Any]) -> None: ...

    def should_stop(self) -> bool: ...


class NullSink:
    """Ignores everything; never asks to stop. A base for sinks that care about a few events."""

    def run_started(self, *, total_steps: int, start_step: int) -> None:
        pass

    def metrics(self, m: StepMetrics) -> None:
        pass

    def rollouts(self, step: int, episodes: list[dict[str, Any]]) -> None:
        pass

    def log(self, message: str, *, level: str = "info") -> None:
        pass

    def checkpoint(self, step: int, path: str) -> None:
        pass

    def evaluation(self, result: dict[str, Any]) -> None:
        pass

    def status(self, phase: str, detail: str, *, progress: float | None = None, eta: float | None = None) -> None:
        pass

    def placed(self, where: dict[str, Any]) -> None:
        pass

    def plan(self, plan: dict[str, Any]) -> None:
        pass

    def should_stop(self) -> bool:
        return False


class MultiSink:
    """Fans every event out to several sinks; stops when any of them asks to."""

    def __init__(self, *sinks: EventSink):
        self.sinks = sinks

    def run_started(self, *, total_steps: int, start_step: int) -> None:
        for s in self.sinks:
            s.run_started(total_steps=total_steps, start_step=start_step)

    def metrics(self, m: StepMetrics) -> None:
        for s in self.sinks:
            s.metrics(m)

    def rollouts(self, step: int, episodes: list[dict[str, Any]]) -> None:
        for s in self.sinks:
            s.rollouts(step, episodes)

    def log(self, message: str, *, level: str = "info") -> None:
        for s in self.sinks:
            s.log(message, level=level)

    def checkpoint(self, step: int, path: str) -> None:
        for s in self.sinks:
            s.checkpoint(step, path)

    def evaluation(self, result: dict[str, Any]) -> None:
        for s in self.sinks:
            s.evaluation(result)

    def status(self, phase: str, detail: str, *, progress: float | None = None, eta: float | None = None) -> None:
        for s in self.sinks:
            s.status(phase, detail, progress=progress, eta=eta)

    def placed(self, where: dict[str, Any]) -> None:
        for s in self.sinks:
            s.placed(where)

    def plan(self, plan: dict[str, Any]) -> None:
        for s in self.sinks:
            s.plan(plan)

    def should_stop(self) -> bool:
        return any(s.should_stop() for s in self.sinks)


class JsonlSink(NullSink):
    """Appends metrics, rollouts and other events as JSON lines under `out_dir`."""

    def __init__(self, out_dir: str | Path):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)

    def _append(self, name: str, record: dict[str, Any]) -> None:
        with open(self.out_dir / name, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")

    def metrics(self, m: StepMetrics) -> None:
        self._append("metrics.jsonl", asdict(m))

    def rollouts(self, step: int, episodes: list[dict[str, Any]]) -> None:
        for ep in episodes:
            self._append("rollouts.jsonl", ep)

    def log(self, message: str, *, level: str = "info") -> None:
        self._append("events.jsonl", {"type": "log", "level": level, "message": message, "time": time.time()})

    def checkpoint(self, step: int, path: str) -> None:
        self._append("events.jsonl", {"type": "checkpoint", "step": step, "path": path, "time": time.time()})

    def evaluation(self, result: dict[str, Any]) -> None:
        self._append("evaluations.jsonl", result)

    def status(self, phase: str, detail: str, *, progress: float | None = None, eta: float | None = None) -> None:
        self._append(
            "events.jsonl", {"type": "status", "phase": phase, "detail": detail, "progress": progress, "eta": eta, "time": time.time()}
        )

    def placed(self, where: dict[str, Any]) -> None:
        self._append("events.jsonl", {"type": "placed", **where, "time": time.time()})

    def plan(self, plan: dict[str, Any]) -> None:
        self._append("events.jsonl", {"type": "plan", **plan, "time": time.time()})


class ProgressSink(NullSink):
    """A one-line progress bar with ETA and the latest reward on a terminal stream; between steps
    the same line says what the run is doing (loading, evaluating 40/100, saving a checkpoint)."""

    def __init__(self, stream: TextIO | None = None, width: int = 28):
        self.stream = stream or sys.stderr
        self.width = width
        self.start_step = 0
        self.total = 0
        self.t0 = time.monotonic()
        self.eta: float | None = None
        self.line = 0
        """Characters of the transient line now on screen (the next line overwrites them)."""

    def run_started(self, *, total_steps: int, start_step: int) -> None:
        self.start_step, self.total, self.t0 = start_step, total_steps, time.monotonic()

    def metrics(self, m: StepMetrics) -> None:
        done = m.step - self.start_step
        elapsed = time.monotonic() - self.t0
        eta = self.eta if self.eta is not None else elapsed / max(done, 1) * (self.total - m.step)
        filled = int(self.width * m.step / max(self.total, 1))
        bar = "#" * filled + "-" * (self.width - filled)
        if "reward/total" in m.values:
            shown = f"reward {m.values['reward/total']:+.3f} success {m.values.get('success', float('nan')):.2f}"
        else:  # an SFT step (`training.sft`)
            shown = f"loss {m.values.get('loss', float('nan')):.3f} token accuracy {m.values.get('token_accuracy', float('nan')):.2f}"
        self._put(
            f"step {m.step}/{self.total} [{bar}] {shown} "
            f"{m.values.get('step_time', 0):.1f}s/step ETA {_fmt_duration(eta)}",
            end="\n" if m.step >= self.total else "",
        )

    def status(self, phase: str, detail: str, *, progress: float | None = None, eta: float | None = None) -> None:
        self.eta = eta
        if phase != "training":  # a step's bar says that
            # the evaluation's sentence gives its share itself
            self._put(detail + (f" ({100 * progress:.0f}%)" if progress is not None and "%" not in detail else ""))

    def log(self, message: str, *, level: str = "info") -> None:
        self._put(f"[{level}] {message}", end="\n")

    def evaluation(self, result: dict[str, Any]) -> None:
        agents = " ".join(f"{name}={v['success']:.2f}" for name, v in result.get("agents", {}).items())
        self._put(
            f"[eval] step {result['step']} {'temperature ' + format(result['temperature'], 'g') if result['temperature'] else 'greedy'}, "
            f"{result['n']} tasks: "
            f"team success {result['team']['success']:.3f} | {agents}",
            end="\n",
        )

    def _put(self, text: str, *, end: str = "") -> None:
        """Overwrite the current line (padding out what it held); a line ending in a newline stays."""
        self.stream.write("\r" + text.ljust(self.line) + end)
        self.line = 0 if end else len(text)
        self.stream.flush()


def _fmt_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"

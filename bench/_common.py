"""What the training benchmarks share: the repo on sys.path, machine facts, tables and JSON."""

from __future__ import annotations

import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def machine() -> dict[str, Any]:
    """The facts a reader needs to judge a timing: CPUs, memory, threads, load (others' work too)."""
    import psutil
    import torch

    return {
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "libraries": _versions("trl", "transformers", "peft"),
        "platform": platform.platform(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def _versions(*names: str) -> dict[str, str | None]:
    """The installed version of each library a timing depends on (None where it is missing)."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (the sandboxed programs), and of its
    live `multiprocessing` children with theirs (an async run's sampler process), user + system.

    On a shared machine wall time mostly measures the neighbours; with one torch thread the CPU
    time a step burns is the work it did, whoever else runs."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system + sum(_live_cpu(p.pid) for p in multiprocessing.active_children())


def _live_cpu(pid: int | None) -> float:
    """utime + stime + cutime + cstime of a running process (proc(5)), in seconds; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (prints well in a terminal and pastes into docs/benchmarks.md)."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(path: str | Path, payload: dict[str, Any]) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
    return out


def command_line() -> str:
    """The command that ran this benchmark, with the interpreter of its venv (`.venv` or `.venv-vllm`)."""
    python = f"{Path(sys.prefix).name}/bin/python" if sys.prefix != sys.base_prefix else "python"
    return " ".join([python, *[a if " " not in a else repr(a) for a in sys.argv]])


def require_vllm() -> None:
    """Exit saying how to run it, unless vLLM can serve here (.venv-vllm, `make vllm-venv`)."""
    from training.plan import vllm_available

    if not vllm_available():
        sys.exit("needs vLLM: run with .venv-vllm/bin/python (make vllm-venv)")


def collect_fresh(sampler: Any, tasks: list[Any], step: int) -> Any:
    """`training.collect.collect_rollouts` with the sandbox's result cache cleared first, in whichever
    process collects (a sampler process has a cache of its own): every arm's step starts with it
    empty, as TRL's does. Passed to the loop's `setup(collect=...)`; a sampler process imports it by name."""
    from agents.envs._common import run_cached
    from training.collect import collect_rollouts

    run_cached.cache_clear()
    return collect_rollouts(sampler, tasks, step)


class SteppedRun:
    """A run of the product's loop (`training.trainer.setup` + `loop`) that advances one step each
    time `step()` is called, so the benchmarks can interleave arms step by step while every arm runs
    the code a user's run runs. The loop runs in a thread of its own, held in its `before_step` hook
    until asked for the next step; `step()` returns the step's metrics, its wall time (from the
    hook's release to the end of the step's report, plus the wait for an async run's next batch, so
    nothing runs beside the other arms) and its CPU time. Each step rolls out from an empty sandbox
    cache (`collect_fresh`). `close()` lets the loop finish (its final checkpoint) and joins it."""

    def __init__(self, config: Any, work_dir: str | Path, *, settle: bool = True) -> None:
        import queue
        import tempfile
        import threading

        Path(work_dir).mkdir(parents=True, exist_ok=True)
        self.config, self.settle = config, settle
        self.out = tempfile.mkdtemp(dir=work_dir, prefix="run-")
        self.parts: Any = None
        self._go: queue.Queue[bool] = queue.Queue()
        self._done: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._mark = (0.0, 0.0)
        self._thread = threading.Thread(target=self._run, name=f"bench-{config.name}", daemon=True)
        self._thread.start()
        self._expect("ready")

    def _run(self) -> None:
        from training.events import NullSink
        from training.trainer import Hooks, loop, setup

        try:
            with setup(self.config, out_dir=self.out, sink=NullSink(), collect=collect_fresh) as parts:
                self.parts = parts
                loop(parts, Hooks(before_step=self._before, after_step=self._after))
        except BaseException as exc:  # the caller's `step()` raises it
            self._done.put(("error", exc))
        else:
            self._done.put(("finished", None))

    def _before(self, step: int) -> None:
        from agents.envs._common import run_cached

        self._done.put(("ready", step))
        if not self._go.get():
            raise SystemExit("the benchmark ended the run")  # close() before the last step
        run_cached.cache_clear()
        self._mark = (time.perf_counter(), cpu_seconds())

    def _after(self, metrics: Any) -> None:
        if self.settle and self.parts.rollouts is not None:  # the next step's rollouts done too
            self.parts.rollouts.settle()
        self._done.put(("step", (metrics, time.perf_counter() - self._mark[0], cpu_seconds() - self._mark[1])))

    def _expect(self, kind: str) -> Any:
        got, value = self._done.get()
        if got == "error":
            raise value
        if got != kind:
            raise RuntimeError(f"the run's loop said {got!r}, expected {kind!r}")
        return value

    def step(self) -> tuple[Any, float, float]:
        """Run the next step: (its `StepMetrics`, wall seconds, CPU seconds)."""
        self._go.put(True)
        result = self._expect("step")
        if self.parts.config.optim.steps > result[0].step:
            self._expect("ready")
        return result  # type: ignore[no-any-return]

    def close(self) -> None:
        import shutil

        if self._thread.is_alive():
            self._go.put(False)
        self._thread.join()
        shutil.rmtree(self.out, ignore_errors=True)

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

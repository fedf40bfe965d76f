"""One held-out evaluation of a starting point for every trial of a sweep that starts from it.

The trials of an experiment's seed often start from the same weights: a grid over the learning
rate, or the arms that train one agent, the other or both from one warm start. Each would evaluate
its step 0 again, with the same weights, tasks and seed; on a CPU that is a large share of a short
trial. `python -m training sweep` gives each trial `SharedStart` as the loop's evaluation hook
(`training.trainer.Hooks.evaluate`): the first trial to reach step 0 evaluates and stores the
results under `<sweep folder>/starts/<key>.json`; a later trial with the same key records those
results as its own step-0 evaluation (its `evaluations.jsonl`, its sinks) and goes on to train.

The key is the trial's config without what cannot change its step 0 (`STEP_ZERO_FREE`: how it
trains, which agents train, checkpointing, when it evaluates, its trackers and name), with the
identity (path, size, modification time) of the files of every model folder and warm start it
loads from disk: a warm start trained again is evaluated again. Two trials that reach step 0 at
once both evaluate; the second write replaces the first with its own numbers, which are the same
ones (the evaluation draws from its own generator, seeded from the run's seed and the step).
A resumed trial, and every later step, evaluates as the run's loop does.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from training.config import RunConfig, flat
from training.trainer import Parts, held_out
from training.warmstart import checkpoint_folder

STARTS = "starts"
"""The sweep folder's sub-folder of stored step-0 evaluations."""

STEP_ZERO_FREE = ("name", "optim.", "grpo.", "sft.", "checkpoint.", "eval.every", "report_to")
"""Config fields (a dotted name, or a prefix ending in a dot) that leave a run's step-0 weights and
held-out evaluation as they are; each agent's `trainable` too (`start_key`)."""


def start_key(config: RunConfig) -> str:
    """What a run's step-0 evaluation depends on, as a short hash (`STEP_ZERO_FREE`)."""
    tree = config.to_dict()
    tree["topology"]["agents"] = [{k: v for k, v in a.items() if k != "trainable"} for a in tree["topology"]["agents"]]
    fields = {k: v for k, v in flat(tree).items() if not any(k == f or (f.endswith(".") and k.startswith(f)) for f in STEP_ZERO_FREE)}
    fields["files"] = _files(config)
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _files(config: RunConfig) -> list[list[Any]]:
    """(path, size, mtime) of each file of the warm start and of every model loaded from a folder."""
    folders = [Path(s) for s in {config.model.source, *(config.agent_model(a) for a in config.topology.agents)} if Path(s).is_dir()]
    if config.model.init_from.run:
        try:
            folders.append(checkpoint_folder(config.model.init_from.run, config.model.init_from.step))
        except FileNotFoundError:
            pass  # the run fails on it when it starts; nothing is shared
    out = []
    for folder in folders:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            st = path.stat()
            out.append([str(path.resolve()), st.st_size, st.st_mtime_ns])
    return out


class SharedStart:
    """The evaluation hook of a sweep's trials (module docstring): step 0 once per starting point."""

    def __init__(self, sweep: Path):
        self.folder = Path(sweep) / STARTS

    def __call__(self, parts: Parts, step: int, final: bool) -> list[dict[str, Any]]:
        if step != 0 or parts.start_step != 0:
            return held_out(parts, step)
        path = self.folder / f"{start_key(parts.config)}.json"
        stored = _read(path)
        if stored is not None:
            parts.sink.log(f"step 0: the held-out evaluation of this starting point, made by {stored['by']}, is recorded as this run's")
            for result in stored["evaluations"]:
                parts.sink.evaluation(result)
            return list(stored["evaluations"])
        results = held_out(parts, step)
        self.folder.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f"{path.name}.{os.getpid()}.part")
        part.write_text(json.dumps({"by": parts.out.name, "evaluations": results}), encoding="utf-8")
        part.replace(path)  # whole or not at all: a reader never sees half a file
        return results


def _read(path: Path) -> dict[str, Any] | None:
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(stored, dict) and isinstance(stored.get("evaluations"), list) and stored["evaluations"]
    return stored if ok else None

"""What a team takes away from a run: each agent's adapter or model from a checkpoint (zipped),
the config YAML, metrics as CSV and JSONL, rollouts as JSONL, and LoRA adapters merged into their
base model (a background job, see `webapp/jobs/services.py`).

Everything here produces byte chunks for a streamed download: nothing is built in memory or in a
temporary file, however large the checkpoint or the history. Paths come from the database and are
checked to lie inside the run's output folder before a byte is read.
"""

from __future__ import annotations

import csv
import io
import json
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from webapp.core import paths
from webapp.core.values import csv_cell
from webapp.models import Checkpoint, Job, MetricPoint, Rollout, Run

CHUNK = 1 << 20


STORED_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
"""Weights barely compress: stored as they are (fast); text files are deflated."""


class ArtifactMissing(LookupError):
    """The artifact does not exist (any more): the view answers 404 with this message."""


@dataclass
class PolicyArtifact:
    name: str
    """`shared` for single/prompt, else the agent's name."""
    kind: str
    """`adapter` (a PEFT folder) or `model` (a full HF model folder)."""
    size: int


@dataclass
class CheckpointArtifacts:
    checkpoint: Checkpoint
    on_disk: bool
    policies: list[PolicyArtifact] = field(default_factory=list)
    size: int = 0
    """Bytes of the whole folder: the policies and the optimizer and RNG state (what deleting it frees)."""


def checkpoint_folder(*, run: Run, checkpoint: Checkpoint) -> Path:
    """The checkpoint's folder, which must lie inside the run's output folder and still exist
    (`checkpoint.keep` deletes old ones)."""
    folder = Path(checkpoint.path)
    if checkpoint.run_id != run.pk or not run.out_dir or not paths.inside(folder, Path(run.out_dir)):
        raise ArtifactMissing("This checkpoint is not in the run's output folder.")
    if not folder.is_dir():
        raise ArtifactMissing(f"Checkpoint step {checkpoint.step} is no longer on disk (older checkpoints are deleted, see checkpoint.keep).")
    return folder


def checkpoint_policies(folder: Path) -> list[PolicyArtifact]:
    out = []
    for sub in sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")):
        kind = "adapter" if (sub / "adapter_config.json").is_file() else "model" if (sub / "config.json").is_file() else ""
        if kind:
            size = sum(f.stat().st_size for f in sub.rglob("*") if f.is_file() and not f.is_symlink())
            out.append(PolicyArtifact(sub.name, kind, size))
    return out


def run_artifacts(*, run: Run) -> list[CheckpointArtifacts]:
    """Every recorded checkpoint, newest first, with the policy folders still on disk (one Troupe
    deleted is not looked for)."""
    out = []
    for checkpoint in run.checkpoints.order_by("-step"):
        if checkpoint.deleted is not None:
            out.append(CheckpointArtifacts(checkpoint, on_disk=False))
            continue
        try:
            folder = checkpoint_folder(run=run, checkpoint=checkpoint)
        except ArtifactMissing:
            out.append(CheckpointArtifacts(checkpoint, on_disk=False))
        else:
            size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())
            out.append(CheckpointArtifacts(checkpoint, on_disk=True, policies=checkpoint_policies(folder), size=size))
    return out


def policy_folder(*, run: Run, checkpoint: Checkpoint, name: str) -> tuple[Path, PolicyArtifact]:
    folder = checkpoint_folder(run=run, checkpoint=checkpoint)
    for policy in checkpoint_policies(folder):
        if policy.name == name:  # only names found on disk: never a path built from the URL
            return folder / policy.name, policy
    raise ArtifactMissing(f"Checkpoint step {checkpoint.step} has no adapter or model named {name!r}.")


def merged_folder(*, job: Job) -> Path:
    if job.kind != Job.Kind.MERGE or job.status != Job.Status.SUCCEEDED or not job.output:
        raise ArtifactMissing("This export is not ready.")
    folder = Path(job.output)
    if not folder.is_dir():
        raise ArtifactMissing("The merged model was deleted; export it again.")
    return folder


# == zip, streamed ===================================================================================


class _Sink(io.RawIOBase):
    """An unseekable file that keeps what is written until it is drained (zipfile then writes
    sizes in data descriptors, so the archive is produced front to back)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        self.parts.append(bytes(b))
        return len(b)

    def drain(self) -> bytes:
        out = b"".join(self.parts)
        self.parts.clear()
        return out


def zip_folder(folder: Path, *, root: str) -> Iterator[bytes]:
    """A zip of `folder`'s regular files (symlinks skipped) under the directory `root/`."""
    sink = _Sink()
    with zipfile.ZipFile(sink, "w", allowZip64=True) as archive:
        for path in sorted(folder.rglob("*")):
            if not path.is_file() or path.is_symlink():
                continue
            name = f"{root}/{path.relative_to(folder).as_posix()}"
            info = zipfile.ZipInfo.from_file(path, name)
            info.compress_type = zipfile.ZIP_STORED if path.suffix in STORED_SUFFIXES else zipfile.ZIP_DEFLATED
            with path.open("rb") as src, archive.open(info, "w", force_zip64=True) as dst:
                while chunk := src.read(CHUNK):
                    dst.write(chunk)
                    yield sink.drain()
            yield sink.drain()
    yield sink.drain()


# == metrics and rollouts ============================================================================


def metric_columns(*, run: Run) -> tuple[list[str], list[tuple[str, str]]]:
    """(run-level keys, (agent, key) pairs) over every step of the run, in first-seen order."""
    keys: dict[str, None] = {}
    agent_keys: dict[tuple[str, str], None] = {}
    for values, agents in MetricPoint.objects.filter(run=run).values_list("values", "agents").iterator(chunk_size=2000):
        keys.update(dict.fromkeys(values or {}))
        for name, per_agent in (agents or {}).items():
            agent_keys.update(dict.fromkeys((name, k) for k in per_agent or {}))
    return list(keys), list(agent_keys)


def metrics_csv(*, run: Run) -> Iterator[str]:
    """One row per step: step, time, the run-level metrics, then `<agent>:<metric>` columns."""
    keys, agent_keys = metric_columns(run=run)
    buffer = io.StringIO()
    writer = csv.writer(buffer)

    def line(cells: list[Any]) -> str:
        buffer.seek(0)
        buffer.truncate()
        writer.writerow([csv_cell(c) for c in cells])  # a metric or agent name starting with = is text, not a formula
        return buffer.getvalue()

    yield line(["step", "time", *keys, *(f"{a}:{k}" for a, k in agent_keys)])
    rows = MetricPoint.objects.filter(run=run).order_by("step").values_list("step", "time", "values", "agents")
    for step, when, values, agents in rows.iterator(chunk_size=2000):
        values, agents = values or {}, agents or {}
        yield line([step, when.isoformat(), *(values.get(k) for k in keys),
                    *((agents.get(a) or {}).get(k) for a, k in agent_keys)])


def metrics_jsonl(*, run: Run) -> Iterator[str]:
    rows = MetricPoint.objects.filter(run=run).order_by("step").values_list("step", "time", "values", "agents")
    for step, when, values, agents in rows.iterator(chunk_size=2000):
        yield json.dumps({"step": step, "time": when.isoformat(), "values": values, "agents": agents}, ensure_ascii=False) + "\n"


def rollouts_jsonl(*, run: Run) -> Iterator[str]:
    """Every recorded episode with every candidate, one JSON object per line, in step order."""
    rows = Rollout.objects.filter(run=run).order_by("step", "episode", "id").values_list("step", "episode", "data")
    for step, episode, data in rows.iterator(chunk_size=200):
        yield json.dumps({"step": step, "episode": episode, **(data or {})}, ensure_ascii=False) + "\n"

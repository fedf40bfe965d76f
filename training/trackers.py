"""Send a run's metrics to the trackers teams already use: TensorBoard, Trackio, MLflow, W&B.

`reporting(config, out, sink, main=...)` wraps the run's sink, once, in `training.trainer.train`,
so the CLI, the web worker and rank 0 of a torchrun launch all report; the other ranks and a run
whose `report_to.trackers` is empty get their sink back unchanged. Each tracker is a small
`EventSink` that imports its library only when it starts, so the engine loads nothing heavy
unless a run asks for it.

What each tracker receives, at the step it belongs to:
- every step's run-wide metrics under their own names (`reward/total`, `success`, `step_time`),
  and each agent's under `agent/<name>/...` (`agent/tool/reward/total`, `agent/tool/loss`);
- held-out evaluations as `eval/success` and `eval/agent/<name>/success|reward` (greedy, at
  `generation.eval_temperature`), and `eval_sampled/...` when `eval.sampled` adds a sampled one;
- where the tracker has tables (W&B, Trackio, MLflow), `report_to.samples` candidates per step
  as a table: step, task, agent, prompt, completion, reward, advantage;
- the run's config (W&B and Trackio config, MLflow params plus `config.yaml`, TensorBoard text).

A tracker that fails to start or to log is dropped with one warning through the run's own sink;
the run goes on. Credentials come only from the worker's environment (the libraries read
WANDB_API_KEY, MLFLOW_TRACKING_TOKEN, HF_TOKEN themselves); `report_to` refuses them.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from training.config import RunConfig
from training.events import EventSink, MultiSink, NullSink, StepMetrics

SAMPLE_COLUMNS = ("step", "task", "agent", "prompt", "completion", "reward", "advantage")
SAMPLE_TEXT_CHARS = 2000
"""Prompts and completions in a sample table are cut to this many characters (their end kept)."""


@contextmanager
def reporting(config: RunConfig, out: Path, sink: EventSink, *, main: bool = True) -> Iterator[EventSink]:
    """`sink` plus one sink per tracker `config.report_to` names (none off rank 0). On the way out
    every tracker that started is finished with the run's outcome: `finished`, `cancelled` (the
    sink asked to stop) or `failed` (an exception is passing through)."""
    names = config.report_to.trackers if main else ()
    if not names:
        yield sink
        return
    trackers = [TRACKERS[name](config, out, warn=lambda message: sink.log(message, level="warning")) for name in names]
    run_sink = _StopWatch(sink, *trackers)
    try:
        yield run_sink
    except BaseException:
        for t in trackers:
            t.close("failed")
        raise
    for t in trackers:
        t.close("cancelled" if run_sink.stop_requested else "finished")


class _StopWatch(MultiSink):
    """A MultiSink that remembers whether the run was asked to stop."""

    stop_requested = False

    def should_stop(self) -> bool:
        stop = super().should_stop()
        self.stop_requested |= stop
        return stop


# == what the trackers share =======================================================================


class Tracker(NullSink):
    """One tracker as an EventSink: turns the trainer's events into step-keyed scalars and sample
    rows, and guards every call to the tracker's library. A subclass implements `start`, `scalars`,
    `finish` and, where the tracker has tables, `table`."""

    name = "tracker"

    def __init__(self, config: RunConfig, out: Path, *, warn: Callable[[str], None]):
        self.config, self.out, self.warn = config, Path(out), warn
        self.run_name = config.report_to.run_name or config.name
        self.started = False
        self.broken = False

    # -- what a subclass implements --------------------------------------------------------------

    def start(self) -> None:
        raise NotImplementedError

    def scalars(self, step: int, values: dict[str, float], when: float) -> None:
        raise NotImplementedError

    def table(self, step: int, rows: list[dict[str, Any]]) -> None:
        """Log a sample table; trackers without tables ignore it."""

    def finish(self, status: str) -> None:
        raise NotImplementedError

    # -- the sink ----------------------------------------------------------------------------------

    def run_started(self, *, total_steps: int, start_step: int) -> None:
        if not self.started and self._guard("start", self.start):
            self.started = True

    def metrics(self, m: StepMetrics) -> None:
        if self.started:
            self._guard("log metrics", self.scalars, m.step, step_scalars(m), m.time)

    def evaluation(self, result: dict[str, Any]) -> None:
        if self.started:
            self._guard("log an evaluation", self.scalars, int(result["step"]), eval_scalars(result, self.config), time.time())

    def rollouts(self, step: int, episodes: list[dict[str, Any]]) -> None:
        if self.started and self.config.report_to.samples:
            self._guard("log samples", self.table, step, sample_rows(step, episodes, self.config.report_to.samples))

    def close(self, status: str) -> None:
        if self.started:
            self._guard("finish", self.finish, status)
            self.started = False

    def _guard(self, what: str, call: Callable[..., None], *args: Any) -> bool:
        """Call the tracker; on any error warn once and drop the tracker for the rest of the run."""
        if self.broken:
            return False
        try:
            call(*args)
        except Exception as exc:  # a tracker never fails the run
            self.broken = True
            self.started = False
            detail = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
            self.warn(f"{self.name}: could not {what} ({type(exc).__name__}{': ' + detail if detail else ''}); the run goes on without {self.name}")
            return False
        return True


def step_scalars(m: StepMetrics) -> dict[str, float]:
    """A step's run-wide metrics under their names, each agent's under `agent/<name>/...`."""
    values = {**m.values, **{f"agent/{agent}/{key}": v for agent, d in m.agents.items() for key, v in d.items()}}
    return {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def eval_scalars(result: dict[str, Any], config: RunConfig) -> dict[str, float]:
    """An evaluation's team success and per-agent success and reward under `eval/` (greedy, at
    `generation.eval_temperature`) or `eval_sampled/` (at the training temperature)."""
    prefix = "eval" if result["temperature"] == config.generation.eval_temperature else "eval_sampled"
    values = {f"{prefix}/success": float(result["team"]["success"])}
    for agent, d in result["agents"].items():
        values.update({f"{prefix}/agent/{agent}/{key}": float(v) for key, v in d.items()})
    return values


def sample_rows(step: int, episodes: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """The first `limit` candidates of the step, in rollout order: whole GRPO groups (a turn's K
    candidates share a prompt) of the first episodes, so rewards and advantages compare."""
    rows: list[dict[str, Any]] = []
    for ep in episodes:
        for turn in ep["turns"]:
            for c in turn["candidates"]:
                if len(rows) == limit:
                    return rows
                rows.append(
                    {
                        "step": step,
                        "task": str(ep["task_id"]),
                        "agent": turn["agent"],
                        "prompt": _clip(turn["prompt"]),
                        "completion": _clip(c["text"]),
                        "reward": float(c["reward"]),
                        "advantage": float(c["advantage"]),
                    }
                )
    return rows


def _clip(text: str) -> str:
    """Keep the end of a long text: the end of a prompt is what the agent just observed."""
    return text if len(text) <= SAMPLE_TEXT_CHARS else "..." + text[-(SAMPLE_TEXT_CHARS - 3) :]


def _config_params(config: RunConfig) -> dict[str, str]:
    """The config as flat `section.field` strings (MLflow params), long values cut."""
    flat: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            flat[prefix] = str(value)[:500]

    walk("", config.to_dict())
    return flat


# == the trackers ====================================================================================


class TensorBoardTracker(Tracker):
    """Event files under `<out>/<report_to.tensorboard_dir>` (torch's SummaryWriter); no tables."""

    name = "tensorboard"

    def start(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = self.out / self.config.report_to.tensorboard_dir
        self.writer = SummaryWriter(log_dir=str(self.log_dir))
        config_text = "\n".join("    " + line for line in self.config.to_yaml().splitlines())  # a markdown code block
        self.writer.add_text("config", config_text, global_step=0)

    def scalars(self, step: int, values: dict[str, float], when: float) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, global_step=step, walltime=when)
        self.writer.flush()

    def finish(self, status: str) -> None:
        self.writer.close()


class TrackioTracker(Tracker):
    """Trackio's local store (TRACKIO_DIR), or the Space `report_to.trackio_space_id`."""

    name = "trackio"

    def start(self) -> None:
        import trackio

        r = self.config.report_to
        self.run = trackio.init(
            project=r.project, name=self.run_name, config={**self.config.to_dict(), "out_dir": str(self.out)},
            space_id=r.trackio_space_id or None, embed=False, auto_log_cpu=False, auto_log_gpu=False,
        )

    def scalars(self, step: int, values: dict[str, float], when: float) -> None:
        self.run.log(values, step=step)

    def table(self, step: int, rows: list[dict[str, Any]]) -> None:
        import trackio

        if rows:
            self.run.log({"samples": trackio.Table(columns=list(SAMPLE_COLUMNS), data=[[row[c] for c in SAMPLE_COLUMNS] for row in rows])}, step=step)

    def finish(self, status: str) -> None:
        import trackio

        trackio.finish()  # finishes this run (trackio.init made it the current one) and forgets it


class MlflowTracker(Tracker):
    """An MLflow run in experiment `report_to.project`: metrics, the config as params and
    `config.yaml`, a `samples/step-NNNNNN.json` table per step, and the outcome as its status."""

    name = "mlflow"
    STATUS = {"finished": "FINISHED", "cancelled": "KILLED", "failed": "FAILED"}

    def tracking_uri(self) -> str:
        r = self.config.report_to
        return r.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or (self.out / "mlruns").resolve().as_uri()

    def start(self) -> None:
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        uri = self.tracking_uri()
        if uri.startswith("file:"):  # MLflow 3 keeps its file store only for those who opt in
            with _environ(MLFLOW_ALLOW_FILE_STORE="true"):
                self.client = MlflowClient(tracking_uri=uri)
        else:
            self.client = MlflowClient(tracking_uri=uri)
        project = self.config.report_to.project
        experiment = self.client.get_experiment_by_name(project)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            try:
                experiment_id = self.client.create_experiment(project)
            except MlflowException:  # another run created it meanwhile
                found = self.client.get_experiment_by_name(project)
                if found is None:
                    raise
                experiment_id = found.experiment_id
        self.run_id = self.client.create_run(experiment_id, run_name=self.run_name, tags={"troupe.out_dir": str(self.out)}).info.run_id
        params = [Param(k, v) for k, v in _config_params(self.config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params a call
            self.client.log_batch(self.run_id, params=params[i : i + 100])
        self.client.log_text(self.run_id, self.config.to_yaml(), "config.yaml")

    def scalars(self, step: int, values: dict[str, float], when: float) -> None:
        from mlflow.entities import Metric

        ms = int(when * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, ms, step) for k, v in values.items() if math.isfinite(v)])

    def table(self, step: int, rows: list[dict[str, Any]]) -> None:
        if rows:
            columns = {c: [row[c] for row in rows] for c in SAMPLE_COLUMNS}
            self.client.log_table(self.run_id, data=columns, artifact_file=f"samples/step-{step:06d}.json")

    def finish(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status=self.STATUS[status])


class WandbTracker(Tracker):
    """A W&B run in `report_to.project`; its files go under WANDB_DIR, else the run's output
    folder. `wandb_mode: offline` writes them there only (upload later with `wandb sync`)."""

    name = "wandb"

    def start(self) -> None:
        import wandb

        r = self.config.report_to
        self.run = wandb.init(
            project=r.project,
            entity=r.wandb_entity or None,
            name=self.run_name,
            config={**self.config.to_dict(), "out_dir": str(self.out)},
            dir=None if os.environ.get("WANDB_DIR") else str(self.out),
            mode=r.wandb_mode or None,  # type: ignore[arg-type]  # None: WANDB_MODE, else online
            reinit="create_new",  # several runs in one worker process never touch each other
            settings=wandb.Settings(console="off"),  # leave the worker's stdout and stderr alone
        )

    def scalars(self, step: int, values: dict[str, float], when: float) -> None:
        self.run.log(values, step=step)

    def table(self, step: int, rows: list[dict[str, Any]]) -> None:
        import wandb

        if rows:
            self.run.log({"samples": wandb.Table(columns=list(SAMPLE_COLUMNS), data=[[row[c] for c in SAMPLE_COLUMNS] for row in rows])}, step=step)

    def finish(self, status: str) -> None:
        import wandb

        self.run.summary["troupe/status"] = status  # W&B's own state tells only failed (exit code) from not
        self.run.finish(exit_code=1 if status == "failed" else 0)
        # finish() returns before W&B's service has flushed the run's file; stopping the service
        # flushes it, so an offline run is whole on disk (ready for `wandb sync`) when train returns,
        # not when the worker process exits. The next run starts a new service.
        wandb.teardown()


TRACKERS: dict[str, type[Tracker]] = {
    "tensorboard": TensorBoardTracker,
    "trackio": TrackioTracker,
    "mlflow": MlflowTracker,
    "wandb": WandbTracker,
}
"""The class behind each name `report_to.trackers` accepts (training.config.TRACKERS)."""


@contextmanager
def _environ(**values: str) -> Iterator[None]:
    """Set environment variables for the duration of a block."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

"""A run's workflows: building and checking its config from a topology, a dataset and overrides,
creating and launching it (from the form, a clone or the API), enqueueing, cancelling, resuming,
and executing it on a worker (`run_execute`, through the Celery task in `webapp/runs/tasks.py`).

Functions are keyword-only and named `<entity>_<action>`. Engine config errors are
`training.config.ConfigError`s naming the dotted config field; every config passes
`webapp.core.trust` before it is stored and again before it trains.
"""

from __future__ import annotations

import copy
import errno
import logging
import sys
import traceback
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from kombu.exceptions import OperationalError

from training.config import ConfigError, RunConfig
from webapp.catalog import services as catalog
from webapp.core import trust
from webapp.core.enqueue import RUN_EXECUTE, enqueue
from webapp.history.services import run_notes_set, run_tags_set
from webapp.models import (
    Dataset,
    Run,
    Team,
    Topology,
)
from webapp.runs import queue
from webapp.runs.sink import DatabaseSink
from webapp.teams.audit import Verb, audit_record

log = logging.getLogger(__name__)


# == runs ===========================================================================================

RUN_OVERRIDES = {
    "specialization": "topology.specialization",
    "steps": "optim.steps",
    "k": "grpo.k",
    "tasks_per_step": "optim.tasks_per_step",
    "lr": "optim.lr",
    "lora_r": "lora.r",
    "max_new_tokens": "generation.max_new_tokens",
    "temperature": "generation.temperature",
    "beta": "grpo.beta",
    "eval_every": "eval.every",
    "gpus": "resources.gpus",
}


"""Run form field -> the RunConfig field it overrides."""


SPECIALIZATION_DEFAULTS: dict[str, dict[str, Any]] = {"lora": {"optim.lr": 1e-4}}


"""What the run form uses where the engine's default does not fit a specialization: LoRA adapters
want a learning rate about ten times the full model's (the engine's 1e-5). A form field or the
advanced YAML still sets its own."""


def run_config_build(
    *, topology: Topology, dataset: Dataset, name: str = "run", overrides: Mapping[str, Any] | None = None,
    advanced_yaml: str = "",
) -> RunConfig:
    """The RunConfig for a topology on a dataset, with dotted overrides (`{"optim.lr": 1e-4}`)
    and then the advanced YAML merged on top. Raises ConfigError naming the field at fault,
    also when the YAML reaches outside the team (another path, checkpoint, model or a plugin
    that is not what it claims to be)."""
    tree: dict[str, Any] = {"name": name, **catalog.topology_config_tree(topology=topology)}
    if dataset.environment != topology.environment:
        raise ConfigError(
            "data", f"dataset {dataset.name!r} is for {dataset.environment}; the topology plays {topology.environment}"
        )
    env_args, tree["data"] = catalog.dataset_config_tree(dataset=dataset)
    tree["topology"]["env_args"].update(env_args)
    specialization = (overrides or {}).get("topology.specialization") or topology.specialization
    for dotted, value in {**SPECIALIZATION_DEFAULTS.get(specialization, {}), **(overrides or {})}.items():
        if value is not None:
            section, key = dotted.split(".")
            tree.setdefault(section, {})[key] = value
    if advanced_yaml.strip():
        extra = trust.yaml_load(advanced_yaml, field="yaml")
        if extra is not None and not isinstance(extra, dict):
            raise ConfigError("yaml", "the advanced YAML must be a mapping of sections, like `grpo: {alpha: 0.5}`")
        _merge(tree, extra or {})
    # the advanced YAML may name files, checkpoints, models and plugins: only the team's own
    return trust.config_from_tree(team=topology.team, tree=tree)


def run_config_check(
    *, topology: Topology, dataset: Dataset, name: str = "run", overrides: Mapping[str, Any] | None = None,
    advanced_yaml: str = "",
) -> tuple[RunConfig | None, list[tuple[str | None, ConfigError]]]:
    """The run form's config, or every problem with it at once: (config, []) or (None, [(source,
    error), ...]) where `source` is the override (a dotted field) or "yaml" that caused an error on
    its own, or None for one only their combination has. Each override and the YAML are tried
    alone first, so one bad field never hides another."""
    base = {"topology": topology, "dataset": dataset, "name": name}
    given = {dotted: value for dotted, value in (overrides or {}).items() if value is not None}
    try:
        run_config_build(**base)
    except ConfigError as exc:
        return None, [(None, exc)]  # the topology and dataset themselves
    errors: list[tuple[str | None, ConfigError]] = []
    for dotted, value in given.items():
        try:
            run_config_build(**base, overrides={dotted: value})
        except ConfigError as exc:
            errors.append((dotted, exc))
    if advanced_yaml.strip():
        try:
            run_config_build(**base, advanced_yaml=advanced_yaml)
        except ConfigError as exc:
            errors.append(("yaml", exc))
    if errors:
        return None, errors
    try:
        return run_config_build(**base, overrides=given, advanced_yaml=advanced_yaml), []
    except ConfigError as exc:
        return None, [(None, exc)]


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


def run_create(
    *, team: Team, user: User | None, name: str, config: RunConfig, topology: Topology | None = None,
    dataset: Dataset | None = None, resumed_from: Run | None = None,
) -> Run:
    """Save a queued run with its config snapshot (as the engine will run it: an agent's empty
    instructions hold its environment's default prompt); enqueue it once the row is committed."""
    config = _with_default_instructions(config)
    with transaction.atomic():
        run = Run.objects.create(
            team=team, owner=user, name=name, topology=topology, dataset=dataset, config_yaml=config.to_yaml(),
            total_steps=config.optim.steps, resumed_from=resumed_from, celery_task_id=str(uuid.uuid4()),
            environment=config.topology.environment[:200], specialization=config.topology.specialization,
            gpus=config.resources.gpus,
        )
        log.info("run #%s queued by %s: %s", run.pk, user or "the API", name)
        if resumed_from is None:  # a resumed run is recorded by run_resume
            audit_record(team=team, actor=user, verb=Verb.LAUNCH, obj=run, environment=run.environment,
                         specialization=run.specialization, steps=run.total_steps, gpus=run.gpus)
        transaction.on_commit(lambda: run_enqueue(run=run))
    return run


def _with_default_instructions(config: RunConfig) -> RunConfig:
    try:
        env = catalog.environment_load(name=config.topology.environment, env_args=config.topology.env_args)
    except ValidationError:  # the run fails with the engine's own message when it starts
        return config
    return config.with_default_instructions(getattr(env, "default_instructions", None) or {})


def run_enqueue(*, run: Run) -> None:
    """Send the run to the queue of its GPU count (`Run.queue_name`). A broker that is down leaves the run queued (the run
    command re-enqueues queued runs when it starts; a redelivered task never runs twice)."""
    try:
        enqueue(RUN_EXECUTE, object_id=run.pk, task_id=run.celery_task_id or None, queue=run.queue_name)
    except OperationalError as exc:
        log.warning("run %s: could not reach the broker: %s", run.pk, exc)
        run.log_lines.create(level="warning", message=f"could not reach the task queue ({exc}); the run stays queued")


def run_enqueue_queued() -> int:
    """Send a message for every queued run again (after a broker outage). Extra messages are
    harmless: a message claims the next queued run, or finds none and returns."""
    runs = list(Run.objects.filter(status=Run.Status.QUEUED).order_by(*Run.QUEUE_ORDER))
    for run in runs:
        run_enqueue(run=run)
    return len(runs)


def run_cancel(*, run: Run, actor: User | None = None) -> Run:
    """Queued: cancelled at once. Running: flag it; the trainer stops at its next step."""
    now = timezone.now()
    with transaction.atomic():
        queued = Run.objects.filter(pk=run.pk, status=Run.Status.QUEUED)
        if queued.update(status=Run.Status.CANCELLED, cancel_requested=True, finished=now):
            audit_record(team=run.team_id, actor=actor, verb=Verb.CANCEL, obj=run, was="queued")
        elif Run.objects.filter(pk=run.pk, status=Run.Status.RUNNING, cancel_requested=False).update(cancel_requested=True):
            run.refresh_from_db()
            audit_record(team=run.team_id, actor=actor, verb=Verb.CANCEL, obj=run, was="running", at_step=run.step)
    run.refresh_from_db()
    return run


def run_resume(*, run: Run, user: User) -> Run:
    """A new run continuing a failed or cancelled run from its latest checkpoint, with the same
    config: the engine restores weights, optimizer and RNG state and replays the same data order,
    so the new run's first step is the checkpoint's step + 1 (its charts continue the old ones)."""
    checkpoint = run.checkpoints.filter(deleted__isnull=True).order_by("-step").first()
    if not run.can_resume or checkpoint is None:
        raise ValidationError("Only a failed or cancelled run with a checkpoint can be resumed.")
    config = run.to_config().replace(**{"checkpoint.resume_from": checkpoint.path})
    with transaction.atomic():
        new = run_create(
            team=run.team, user=user, name=f"{run.name} (resumed @{checkpoint.step})", config=config,
            topology=run.topology, dataset=run.dataset, resumed_from=run,
        )
        Run.objects.filter(pk=new.pk).update(resumed_at_step=checkpoint.step, step=checkpoint.step)
        new.resumed_at_step = new.step = checkpoint.step
        audit_record(team=run.team_id, actor=user, verb=Verb.RESUME, obj=run, new_run=new.pk, from_step=checkpoint.step)
    return new


TrainFn = Callable[..., Any]


def run_execute(*, run_id: int | None = None, worker: str = "", train: TrainFn | None = None, gpus: int = 1) -> Run | None:
    """Claim a queued run and execute it to its end: the run `run_id` if it is still queued, or
    without one the first queued run in queue order among runs needing `gpus` GPUs (what the
    Celery task does, see `webapp.runs.queue`). The claim is atomic, so a redelivered or duplicated task never runs a
    run twice. Engine failures are recorded on the run, never raised; a heartbeat thread keeps
    the run from looking lost while it loads or steps."""
    if run_id is None:
        run = queue.run_claim_next(worker=worker, gpus=gpus)
    else:
        run = queue.run_claim(run_id=run_id, worker=worker)
    if run is None:
        log.debug("no queued run to execute (run %s)", run_id)
        return None
    with queue.run_heartbeat(run_id=run.pk, worker=worker):
        _run_train(run, train)
    run.refresh_from_db()
    return run


def _run_train(run: Run, train: TrainFn | None) -> None:
    sink = DatabaseSink(run)
    log.info("run #%s started on %s: %s", run.pk, run.worker or "this worker", run.name)
    try:
        config = run.to_config()
        trust.check_config(team=run.team, config=config)  # again: the operator's roots or plugins may have changed
        if train is None:
            from training.trainer import (
                train,  # imports torch: only inside the worker's task
            )
        result = train(config, out_dir=Path(run.out_dir), sink=sink)
    except Exception as exc:  # any engine failure is the run's outcome, recorded with its traceback
        sink.finish(status=Run.Status.FAILED, error=run_failure_message(exc), traceback=traceback.format_exc())
        log.warning("run #%s failed: %s", run.pk, run_failure_message(exc))
    except BaseException as exc:  # the worker is being killed: record it, then let it die
        sink.finish(status=Run.Status.FAILED, error=f"the worker stopped during the run ({type(exc).__name__})", traceback=traceback.format_exc())
        raise
    else:
        if result.checkpoint and not run.checkpoints.filter(path=result.checkpoint).exists():
            sink.checkpoint(result.step, result.checkpoint)
        cancelled = result.status == "cancelled"
        error = "stopped because the worker shut down; resume it from its last checkpoint" if cancelled and sink.stopped_by_shutdown else ""
        sink.finish(
            status=Run.Status.CANCELLED if cancelled else Run.Status.SUCCEEDED,
            step=result.step, final_metrics=dict(result.final_metrics), error=error,
        )
        log.info("run #%s %s at step %s of %s", run.pk, "cancelled" if cancelled else "succeeded", result.step, run.total_steps)


def run_failure_message(exc: BaseException) -> str:
    """One line for the run page: what went wrong, a hint for the usual resource failures, and
    where it was raised in Troupe's or a plugin's code (the full traceback is stored as well)."""
    text = f"{type(exc).__name__}: {exc}".strip()
    if isinstance(exc, MemoryError) or "out of memory" in str(exc).lower():
        text = (f"Out of memory ({text}). Lower optim.micro_batch_size, grpo.k, optim.tasks_per_step or "
                "generation.max_new_tokens, or use a smaller model.")
    elif isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        text = f"Disk full ({text}). Free space under the data dir ({settings.TROUPE_DATA_DIR}) and resume the run."
    where = _raised_in(exc)
    return f"{text} [raised in {where}]" if where else text


def _raised_in(exc: BaseException) -> str:
    """`path:line in function` of the innermost frame outside the standard library and installed
    packages: Troupe's own code or a plugin's."""
    frames = traceback.extract_tb(exc.__traceback__)
    root = str(Path(__file__).resolve().parents[2])  # the project: webapp/runs/services.py is three levels down
    for frame in reversed(frames):
        path = frame.filename
        if "site-packages" in path or "dist-packages" in path or path.startswith((sys.base_prefix, "<")):
            continue
        shown = path[len(root) + 1:] if path.startswith(root + "/") else path
        return f"{shown}:{frame.lineno} in {frame.name}"
    return ""


def run_fail_lost(*, worker: str) -> int:
    """Runs a worker left `running` when it died (it is not running now): mark them failed."""
    lost = Run.objects.filter(status=Run.Status.RUNNING, worker=worker)
    return lost.update(
        status=Run.Status.FAILED, finished=timezone.now(),
        error_message=f"worker lost: {worker} stopped while this run was running; resume it from its last checkpoint",
    )


# == cloning a run ======================================================================================


@dataclass
class CloneInitial:
    initial: dict[str, Any]
    notes: list[str]


def run_clone_initial(*, run: Run) -> CloneInitial:
    """The new-run form's initial values that rebuild `run`'s config: its topology and dataset, the
    form's hyperparameters read from the snapshot, and the advanced YAML holding every other
    difference (edited agents, extra sections). Submitted unchanged, the form reproduces the
    config except the name (and `checkpoint.resume_from`: a clone starts from scratch)."""
    notes: list[str] = []
    try:
        config = run.to_config()
    except ConfigError as exc:
        return CloneInitial({"name": f"{run.name} (clone)"[:200], "advanced_yaml": run.config_yaml},
                            [f"The snapshot no longer validates ({exc}); fix it in the advanced YAML."])
    target = config.to_dict()
    target["name"] = f"{run.name} (clone)"[:200]
    if target["checkpoint"].get("resume_from"):
        target["checkpoint"]["resume_from"] = None
        notes.append("This run resumed from a checkpoint; the clone starts from scratch.")
    initial: dict[str, Any] = {"name": target["name"]}
    for field_name, dotted in RUN_OVERRIDES.items():
        section, key = dotted.split(".")
        initial[field_name] = target[section][key]
    topology, dataset = run.topology, run.dataset
    if topology is not None and topology.specialization == config.topology.specialization:
        initial["specialization"] = ""
    if topology is None:
        notes.append("The run's topology was deleted: pick one; the advanced YAML keeps the run's agents.")
    else:
        initial["topology"] = topology.pk
    if dataset is None:
        notes.append("The run's dataset was deleted: pick one; the advanced YAML keeps the run's data section.")
    else:
        initial["dataset"] = dataset.pk
    base: dict[str, Any] = {}
    if topology is not None and dataset is not None:
        overrides = {dotted: initial[name] for name, dotted in RUN_OVERRIDES.items() if initial.get(name) not in (None, "")}
        try:
            base = run_config_build(topology=topology, dataset=dataset, name=target["name"], overrides=overrides).to_dict()
        except ConfigError as exc:
            notes.append(f"The topology or dataset changed since ({exc}); the advanced YAML carries the run's config.")
    extra = _tree_diff(base, target)
    extra.pop("name", None)
    if extra:
        initial["advanced_yaml"] = yaml.safe_dump(extra, sort_keys=False, allow_unicode=True, width=100)
    if extra.get("topology", {}).get("agents") and topology is not None:
        notes.append("The topology's agents changed since this run; the advanced YAML restores the run's agents.")
    return CloneInitial(initial, notes)


def _tree_diff(base: Any, target: Any) -> Any:
    """What of `target` differs from `base`: nested dicts recursively; anything else whole."""
    if not isinstance(target, dict):
        return target
    out = {}
    for key, value in target.items():
        if not isinstance(base, dict) or key not in base:
            out[key] = value
        elif base[key] != value:
            out[key] = _tree_diff(base[key], value) if isinstance(value, dict) and isinstance(base[key], dict) else value
    return out


# == launching from a config (the API) ===================================================================


MAX_CONFIG_PROBLEMS = 20


class ConfigProblems(ConfigError):
    """A config's first problem (as a ConfigError names it) and, in `others`, those after it."""

    def __init__(self, first: ConfigError, others: list[ConfigError]):
        super().__init__(first.field, first.message)
        self.others = others


def config_problems_after(*, team: Team, tree: Mapping[str, Any], first: ConfigError) -> list[ConfigError]:
    """The config's other problems, after `first`: the engine names one field at a time, so the
    field at fault is taken out (its default stands in) and the rest validated again, until the
    config passes, a problem is not a field that can be taken out, or MAX_CONFIG_PROBLEMS."""
    trial = copy.deepcopy(dict(tree))
    seen = {first.field}
    others: list[ConfigError] = []
    error = first
    while len(others) < MAX_CONFIG_PROBLEMS and _drop_field(trial, error.field):
        try:
            trust.config_from_tree(team=team, tree=trial)
            break
        except ConfigError as exc:
            if exc.field in seen:
                break
            seen.add(exc.field)
            others.append(exc)
            error = exc
    return others


def _drop_field(tree: dict[str, Any], dotted: str) -> bool:
    """Take `section.key` (or a whole top-level key) out of the tree; False when it names no such
    plain entry (a list item, a whole section the engine needs)."""
    parts = dotted.split(".")
    if len(parts) == 1:
        return parts[0] not in ("model", "topology", "data") and tree.pop(parts[0], None) is not None
    section = tree.get(parts[0])
    if len(parts) != 2 or not isinstance(section, dict) or parts[1] not in section:
        return False
    del section[parts[1]]
    return True


def run_launch(
    *, team: Team, user: Any, tree: dict[str, Any], name: str = "", dataset: Any = None, tags: str = "", notes: str = "",
    topology: Topology | None = None,
) -> Run:
    """Validate a config tree (a parsed YAML mapping) for this team and queue it as a run.
    `topology` (one of the team's) gives the `model` and `topology` sections, its values over the
    tree's; `dataset` (one of the team's) fills the `data` section as the run form does."""
    tree = dict(tree)
    if topology is not None:
        if topology.team_id != team.pk:
            raise ConfigError("topology", "not one of your team's topologies")
        sections = catalog.topology_config_tree(topology=topology)
        for key in ("model", "topology"):
            given = tree.get(key) if isinstance(tree.get(key), dict) else {}
            tree[key] = {**given, **sections[key]}
        tree.setdefault("name", topology.name)
    if dataset is not None:
        env_args, data = catalog.dataset_config_tree(dataset=dataset)
        section = dict(tree.get("topology") or {}) if isinstance(tree.get("topology"), dict) else {}
        if section.get("environment", "math_tool") != dataset.environment:
            raise ConfigError("data", f"dataset {dataset.name!r} is for {dataset.environment}; the config plays {section.get('environment', 'math_tool')}")
        section["env_args"] = {**(section.get("env_args") or {}), **env_args}
        tree["topology"] = section
        extra = tree.get("data") if isinstance(tree.get("data"), dict) else {}
        tree["data"] = {**extra, **data}
    if name:
        tree["name"] = name
    try:
        config = trust.config_from_tree(team=team, tree=tree)
    except ConfigError as exc:
        raise ConfigProblems(exc, config_problems_after(team=team, tree=tree, first=exc)) from exc
    with transaction.atomic():
        run = run_create(team=team, user=user, name=(name or config.name)[:200], config=config, dataset=dataset, topology=topology)
        if notes:
            run_notes_set(run=run, notes=notes)
        if tags:
            run_tags_set(run=run, text=tags)
    return run

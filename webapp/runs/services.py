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

from training.config import ConfigError, RunConfig, set_field
from training.config import ConfigProblems as ConfigProblems  # raised by run_config_build
from training.search import PruningSink
from webapp.catalog import environments
from webapp.catalog import selectors as catalog_selectors
from webapp.core import trust
from webapp.core.enqueue import RUN_EXECUTE, enqueue
from webapp.history.services import run_notes_set, run_tags_set
from webapp.models import (
    Checkpoint,
    Dataset,
    Experiment,
    Run,
    Team,
    Topology,
)
from webapp.runs import queue, selectors, trials
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
    "hosts": "resources.hosts",
    "sft_batch_size": "sft.batch_size",
    "sft_max_length": "sft.max_length",
}
"""Run form field -> the RunConfig field it overrides."""

ALGORITHM_FIELDS = {"grpo": ("k", "tasks_per_step", "temperature", "beta"),
                    "sft": ("conversations", "sft_batch_size", "sft_max_length")}
"""Run form fields that only one algorithm reads: the form shows them for that algorithm only, and
a value left in one for the other algorithm sets nothing."""


SPECIALIZATION_DEFAULTS: dict[str, dict[str, Any]] = {"lora": {"optim.lr": 1e-4}}
"""What the run form uses where the engine's default does not fit a specialization: LoRA adapters
want a learning rate about ten times the full model's (the engine's 1e-5). A form field or the
advanced YAML still sets its own."""


def run_config_build(
    *, topology: Topology | None = None, dataset: Dataset | None = None, team: Team | None = None, name: str = "",
    tree: Mapping[str, Any] | None = None, overrides: Mapping[str, Any] | None = None, advanced_yaml: str = "",
) -> RunConfig:
    """The one way a run's config is built: the run form and its preview, clone-and-edit, the API's
    launch (`run_launch`) and experiments all call it. Layers, each over the ones before:

    1. `tree`, a submitted config (the API's body, an experiment's base), or nothing;
    2. `topology`: its `model` and `topology` sections, key by key over the tree's, and its name
       when nothing else names the run;
    3. `dataset`, for the environment the config plays: its `data` section and the environment
       arguments it adds;
    4. without a `tree`, what the run form uses for the specialization (`SPECIALIZATION_DEFAULTS`);
    5. `overrides`, dotted fields (`{"optim.lr": 1e-4}`; None sets nothing);
    6. `advanced_yaml`, a YAML mapping merged on top; then `name`, when given.

    The topology and dataset must be `team`'s (by default the topology's team). The tree then
    passes `trust.config_from_tree` once, which validates it in one pass. Raises ConfigError for one
    problem, or ConfigProblems naming every problem (a bad YAML text or a dataset for another
    environment does not hide the rest: the config is still checked without it)."""
    owner = team or (topology.team if topology is not None else dataset.team if dataset is not None else None)
    if owner is None:
        raise ValueError("run_config_build needs a team, a topology or a dataset")
    if topology is not None and topology.team_id != owner.pk:
        raise ConfigError("topology", "not one of your team's topologies")
    if dataset is not None and dataset.team_id != owner.pk:
        raise ConfigError("dataset", "not one of your team's datasets")
    problems: list[ConfigError] = []
    config_tree: dict[str, Any] = copy.deepcopy(dict(tree or {}))  # the caller's tree stays as it was
    if topology is not None:
        try:
            sections = catalog_selectors.topology_config_tree(topology=topology)
        except ConfigError as exc:
            problems.append(exc)
        else:
            for key in ("model", "topology"):
                given = config_tree.get(key) if isinstance(config_tree.get(key), dict) else {}
                config_tree[key] = {**given, **sections[key]}
            config_tree.setdefault("name", topology.name)
    if dataset is not None:
        problems += _dataset_apply(config_tree, dataset, plays="topology" if topology is not None else "config")
    given = {dotted: value for dotted, value in (overrides or {}).items() if value is not None}
    if tree is None:
        section = config_tree.get("topology") if isinstance(config_tree.get("topology"), dict) else {}
        specialization = given.get("topology.specialization") or section.get("specialization")
        given = {**SPECIALIZATION_DEFAULTS.get(str(specialization), {}), **given}
    for dotted, value in given.items():
        try:
            set_field(config_tree, dotted, value)
        except ConfigError as exc:
            problems.append(exc)
    if advanced_yaml.strip():
        try:
            extra = trust.yaml_load(advanced_yaml, field="yaml")
        except ConfigError as exc:
            problems.append(exc)
        else:
            if extra is not None and not isinstance(extra, dict):
                problems.append(ConfigError("yaml", "the advanced YAML must be a mapping of sections, like `grpo: {alpha: 0.5}`"))
            else:
                _merge(config_tree, extra or {})
    if name:
        config_tree["name"] = name
    # the tree may name files, checkpoints, models and plugins: only the team's own
    return trust.config_from_tree(team=owner, tree=config_tree, problems=problems)


def _dataset_apply(tree: dict[str, Any], dataset: Dataset, *, plays: str) -> list[ConfigError]:
    """Give the tree `dataset`'s `data` section and environment arguments (over the tree's), or
    the problem why not: a dataset for another environment, or one that is not valid."""
    section = tree.get("topology") if isinstance(tree.get("topology"), dict) else {}
    environment = section.get("environment", RunConfig().topology.environment)
    if dataset.environment != environment:
        return [ConfigError("data", f"dataset {dataset.name!r} is for {dataset.environment}; the {plays} plays {environment}")]
    try:
        env_args, data = catalog_selectors.dataset_config_tree(dataset=dataset)
    except ConfigError as exc:
        return [exc]
    given_args = section.get("env_args")
    section["env_args"] = {**(given_args if isinstance(given_args, dict) else {}), **env_args}
    tree["topology"] = section
    given_data = tree.get("data") if isinstance(tree.get("data"), dict) else {}
    tree["data"] = {**given_data, **data}
    return []


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
            environment=config.topology.environment[:200], specialization=config.topology.specialization, algorithm=config.algorithm,
            gpus=config.resources.gpus, hosts=config.resources.hosts,
        )
        log.info("run #%s queued by %s: %s", run.pk, user or "the API", name)
        if resumed_from is None:  # a resumed run is recorded by run_resume
            audit_record(team=team, actor=user, verb=Verb.LAUNCH, obj=run, environment=run.environment,
                         specialization=run.specialization, steps=run.total_steps, gpus=run.gpus)
        transaction.on_commit(lambda: run_enqueue(run=run))
    return run


def _with_default_instructions(config: RunConfig) -> RunConfig:
    try:
        env = environments.environment_load(name=config.topology.environment, env_args=config.topology.env_args)
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
    """A new run (with its own id) continuing a failed or cancelled run from its latest checkpoint
    (`Run.resume_point`), with the same config, linked both ways (`resumed_from`, `resumes`); a run
    already resumed is refused, so one checkpoint never forks into two lineages by accident. The
    engine restores weights, optimizer and RNG state and replays the same data order, so the new
    run's first step is the checkpoint's step + 1 (its charts and evaluations continue the old ones).

    Idempotent under concurrency: the run's row is locked (on SQLite the transaction's write lock,
    taken at BEGIN) before anything is checked, so while a resume of it is queued or running, a
    second click, tab or API call gets that same resume instead of a second run from the checkpoint."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run.pk)  # its status now, under the lock
        pending = run.resumes.filter(status__in=Run.ACTIVE).order_by("created", "id").first()
        if pending is not None:
            return pending
        if run.status not in (Run.Status.FAILED, Run.Status.CANCELLED):
            raise ValidationError("Only a failed or cancelled run with a checkpoint can be resumed.")
        if run.continued_by is not None:  # one lineage: the next resume continues the resume, not this run again
            raise ValidationError(f"Run #{run.pk} was already resumed as run #{run.continued_by.pk}: "
                                  f"it continues from there (resume #{run.continued_by.pk} if it stopped too).")
        checkpoint = run.resume_point()
        if checkpoint is None:
            raise ValidationError("Only a failed or cancelled run with a checkpoint can be resumed.")
        config = run.to_config().replace(**{"checkpoint.resume_from": checkpoint.path})
        new = run_create(
            team=run.team, user=user, name=f"{run.name} (resumed @{checkpoint.step})", config=config,
            topology=run.topology, dataset=run.dataset, resumed_from=run,
        )
        Run.objects.filter(pk=new.pk).update(resumed_at_step=checkpoint.step, step=checkpoint.step)
        new.resumed_at_step = new.step = checkpoint.step
        audit_record(team=run.team_id, actor=user, verb=Verb.RESUME, obj=run, new_run=new.pk, from_step=checkpoint.step)
    return new


TrainFn = Callable[..., Any]


def run_execute(
    *, run_id: int | None = None, worker: str = "", train: TrainFn | None = None, gpus: int = 1, hosts: int = 1,
) -> Run | None:
    """Claim a queued run and execute it to its end: the run `run_id` if it is still queued, or
    without one the first queued run in queue order among runs needing `gpus` GPUs on `hosts` hosts (what the
    Celery task does, see `webapp.runs.queue`). The claim is atomic, so a redelivered or duplicated task never runs a
    run twice. Engine failures are recorded on the run, never raised; a heartbeat thread keeps
    the run from looking lost while it loads or steps."""
    if run_id is None:
        run = queue.run_claim_next(worker=worker, gpus=gpus, hosts=hosts)
    else:
        run = queue.run_claim(run_id=run_id, worker=worker)
    if run is None:
        log.debug("no queued run to execute (run %s)", run_id)
        return None
    with queue.run_heartbeat(run_id=run.pk, worker=worker):
        _run_train(run, train)
    run.refresh_from_db()
    if run.experiment_id is not None:  # a trial ended: a search asks its next trials; a held trial may start
        try:
            experiment_trials_start(experiment=Experiment.objects.get(pk=run.experiment_id))
        except ValueError as exc:  # its stored spec no longer validates: the run's own outcome stands
            log.warning("experiment #%s: no next trial asked (%s)", run.experiment_id, exc)
        held = queue.run_queue().filter(team_id=run.team_id, experiment__isnull=False).first()
        if held is not None:
            run_enqueue(run=held)
    return run


def experiment_trials_start(*, experiment: Experiment) -> list[Run]:
    """Queue the next trials of an experiment's Optuna search (`webapp.runs.trials.search_next`):
    as many as its budget and the team's cap on running trials allow. A grid's trials are all
    queued when it is created, so this queues nothing for one."""
    started = []
    with transaction.atomic():
        Experiment.objects.select_for_update().filter(pk=experiment.pk).first()  # one asker at a time
        for index, config in trials.search_next(experiment=experiment, running_cap=settings.TROUPE_EXPERIMENT_CONCURRENCY):
            new = run_create(team=experiment.team, user=experiment.owner, name=config.name, config=config,
                             topology=experiment.topology, dataset=experiment.dataset)
            Run.objects.filter(pk=new.pk).update(experiment=experiment, trial_index=index)
            new.experiment, new.trial_index = experiment, index
            started.append(new)
    return started


def _run_train(run: Run, train: TrainFn | None) -> None:
    sink = DatabaseSink(run)
    log.info("run #%s started on %s: %s", run.pk, run.worker or "this worker", run.name)
    try:
        config = run.to_config()
        trust.check_config(team=run.team, config=config)  # again: the operator's roots or plugins may have changed
        if train is None:
            from training.runner import (
                train,  # imports torch: only inside the worker's task
            )
        trial_sink = trials.trial_sink(run=run, sink=sink)  # a search trial: the pruner may stop it
        result = train(config, out_dir=Path(run.out_dir), sink=trial_sink)
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
        error = "stopped because the worker shut down; resume it from its last checkpoint" if cancelled and sink.stopped_by_shutdown else result.note
        pruned_at = trial_sink.pruned_at if isinstance(trial_sink, PruningSink) and cancelled else None  # not at its last evaluation
        if pruned_at is not None:
            Run.objects.filter(pk=run.pk).update(pruned_at_step=pruned_at)
            error = f"pruned at step {pruned_at}: its held-out evaluation trailed the median of the experiment's completed trials"
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
    _clone_warm_start(run, target, initial, notes)
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


def _clone_warm_start(run: Run, target: dict[str, Any], initial: dict[str, Any], notes: list[str]) -> None:
    """The form fields that say what `run` learned from and started from, taken out of `target`
    (so the advanced YAML does not repeat them): an SFT run's algorithm and conversations dataset,
    and the checkpoint of `model.init_from` with its agent mapping, when they are still the team's."""
    sft = target.get("sft") or {}
    if target.get("algorithm") == "sft" and sft.get("path"):
        picked = selectors.conversations_at(team_id=run.team_id, path=sft["path"], valid_only=True)
        if picked is None:
            notes.append("The conversations dataset this run learned from is gone: pick one.")
        else:
            initial.update(algorithm="sft", conversations=picked.pk)
        target["algorithm"] = "grpo"
        target["sft"] = {**sft, "path": None}
    init = target["model"].get("init_from") or {}
    if init.get("run"):
        checkpoint = Checkpoint.objects.kept().filter(run__team_id=run.team_id, path=init["run"]).first()
        if checkpoint is None:
            notes.append("The checkpoint this run started from is gone: it starts from the base model unless you pick another.")
        else:
            initial["init_checkpoint"] = checkpoint.pk
            initial["init_agents"] = ", ".join(f"{k}={v}" for k, v in (init.get("agents") or {}).items())
        target["model"]["init_from"] = {"run": "", "step": 0, "agents": {}}


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


# == what a run learns from and starts from ================================================================


def run_source_overrides(*, team: Team, conversations: Dataset | None = None, start_from: Checkpoint | None = None,
                         agents: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The dotted config fields that make a run learn from a conversations dataset (`algorithm: sft`,
    `sft.path`) and start from a checkpoint (`model.init_from`), for the run form, experiments and
    the API. Both must be the team's (ValidationError naming the field otherwise)."""
    values: dict[str, Any] = {}
    if conversations is not None:
        if conversations.team_id != team.pk or conversations.kind != Dataset.Kind.CHATS or conversations.status != Dataset.Status.VALID:
            raise ValidationError({"conversations": "Not one of your team's valid conversations datasets."})
        values.update({"algorithm": "sft", "sft.path": str(conversations.path)})
    if start_from is not None:
        if start_from.run.team_id != team.pk or start_from.deleted is not None:
            raise ValidationError({"start_from": "Not a kept checkpoint of one of your team's runs."})
        values.update({"model.init_from.run": start_from.path, "model.init_from.step": start_from.step,
                       "model.init_from.agents": dict(agents) if agents else None})
    elif agents:
        raise ValidationError({"start_from": "An agent mapping maps policies to a checkpoint's folders: name the checkpoint too."})
    return values


def run_checkpoint_pick(*, team: Team, run_id: int, step: int = 0) -> Checkpoint:
    """The kept checkpoint of the team's finished run `run_id` at `step` (0: its last); a
    ValidationError on `start_from` that says what is wrong (another team's run is "no run with this
    id", as everywhere)."""
    run = Run.objects.filter(team=team, pk=run_id).first()
    if run is None:
        raise ValidationError({"start_from": f"No run #{run_id} in your team."})
    if run.is_active:
        raise ValidationError({"start_from": f"Run #{run_id} is still {run.status}: start from it once it has finished."})
    kept = run.checkpoints.kept().order_by("-step")
    checkpoint = kept.filter(step=step).first() if step else kept.first()
    if checkpoint is None:
        steps = ", ".join(str(s) for s in kept.values_list("step", flat=True))
        raise ValidationError({"start_from": f"Run #{run_id} has no checkpoint" + (f" at step {step}; it keeps steps {steps}." if steps else ".")})
    return checkpoint


# == launching from a config (the API) ===================================================================


MAX_CONFIG_PROBLEMS = 20
"""Problems after the first that the API lists in `fields`."""


def run_launch(
    *, team: Team, user: Any, tree: Mapping[str, Any], name: str = "", dataset: Dataset | None = None, tags: str = "",
    notes: str = "", topology: Topology | None = None, overrides: Mapping[str, Any] | None = None,
) -> Run:
    """Build a config tree (a parsed YAML mapping) for this team with `run_config_build` (a
    `topology` gives the `model` and `topology` sections, its values over the tree's; a `dataset`
    fills the `data` section as the run form does; `overrides` are dotted fields on top) and queue
    it as a run. Raises ConfigError, or ConfigProblems naming every problem."""
    config = run_config_build(team=team, tree=tree, topology=topology, dataset=dataset, name=name, overrides=overrides)
    with transaction.atomic():
        run = run_create(team=team, user=user, name=(name or config.name)[:200], config=config, dataset=dataset, topology=topology)
        if notes:
            run_notes_set(run=run, notes=notes)
        if tags:
            run_tags_set(run=run, text=tags)
    return run

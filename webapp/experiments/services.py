"""An experiment's workflows: building and checking its spec (the base config through the run
form's own builder, then the engine's `ExperimentSpec` with every problem at once, then each arm
through the trust boundary), creating it with its trials queued as ordinary runs, cancelling and
resuming it, and queueing an ablation of every finished trial.

Functions are keyword-only and named `<entity>_<action>`; problems are `ExperimentError`s whose
`problems` are ConfigErrors naming their place (`axes.optim.lr`, `seeds[1]`, `base.grpo.k`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from training.ablation import Ablation, ablations_for, apart_pairs
from training.config import ConfigError, RunConfig
from training.experiment import ExperimentError, ExperimentSpec, Trial, arm_label, with_fields
from webapp.catalog import environments
from webapp.core import trust
from webapp.experiments.selectors import experiment_latest_runs, experiment_unfinished
from webapp.jobs.ablations import ablation_request
from webapp.models import Dataset, Experiment, Run, Team, Topology
from webapp.runs import services as runs
from webapp.teams.audit import Verb, audit_record

log = logging.getLogger(__name__)

MODEL_FIELDS = ("model.source",)
"""Axis fields naming model folders: checked by the trust boundary before the engine looks inside."""


def experiment_spec_build(
    *, team: Team, topology: Topology, dataset: Dataset, name: str, axes: Any, seeds: Any,
    metric: str = "team.success", direction: str = "maximize", advanced_yaml: str = "",
    overrides: Mapping[str, Any] | None = None, search: Any = None,
) -> ExperimentSpec:
    """The experiment's spec, or ExperimentError with every problem at once. The base config is
    the run form's (`runs.run_config_build`: topology, dataset, overrides, advanced YAML); the
    axes and seeds are checked by the engine against the config's schema; then each arm passes
    the trust boundary as a run's config would (files, models and plugins of the team only)."""
    if topology.team_id != team.pk or dataset.team_id != team.pk:
        raise ExperimentError([ConfigError("base", "the topology and the dataset must be your team's")])
    try:
        base = runs.run_config_build(topology=topology, dataset=dataset, name=name or topology.name, overrides=overrides,
                                     advanced_yaml=advanced_yaml)
    except ConfigError as exc:  # every problem of the base at once, each under `base.`
        raise ExperimentError([ConfigError(f"base.{p.field}" if p.field != "yaml" else "base", p.message)
                               for p in exc.problems]) from None
    try:
        trust.check_tree(axes, field="axes")
        trust.check_tree(search, field="search")
    except ConfigError as exc:
        raise ExperimentError([exc]) from None
    params = search.get("params") if isinstance(search, dict) else None
    problems = _reach_problems(team=team, axes=axes) + _reach_problems(
        team=team, axes={k: v.get("choices") for k, v in params.items() if isinstance(v, dict)} if isinstance(params, dict) else {})
    try:
        spec = ExperimentSpec.from_dict(
            {"name": name or base.name, "axes": axes, "seeds": seeds, "metric": metric, "direction": direction,
             **({"search": search} if search else {})}, base=base,
        )
    except ExperimentError as exc:
        raise ExperimentError(problems + exc.problems) from None
    if problems:
        raise ExperimentError(problems)
    for trial in _one_per_arm(spec.trials()):
        try:
            trust.check_config(team=team, config=trial.config)
        except ConfigError as exc:
            problems.append(ConfigError("axes", f"the arm {arm_label(trial.arm, spec.arms())}: {exc}"))
    for config in _search_corners(spec):
        try:
            trust.check_config(team=team, config=config)
        except ConfigError as exc:
            problems.append(ConfigError("search", str(exc)))
    if problems:
        raise ExperimentError(problems)
    return spec


def _reach_problems(*, team: Team, axes: Any) -> list[ConfigError]:
    """Axis values that name what only the trust boundary may look at: model folders outside the
    team's reach (refused before the engine opens them), a data file (the dataset gives it)."""
    problems: list[ConfigError] = []
    if not isinstance(axes, dict):
        return problems
    for dotted, values in axes.items():
        if not isinstance(values, list):
            continue
        if dotted in ("data.path", "checkpoint.resume_from"):
            problems.append(ConfigError(f"axes.{dotted}", "cannot be an axis here: the dataset gives the data, and trials start from scratch"))
            continue
        if dotted in MODEL_FIELDS or (dotted.startswith("topology.agents[") and dotted.endswith("].model")):
            for value in values:
                if isinstance(value, str):
                    try:
                        trust.check_model_source(team=team, source=value, field=f"axes.{dotted}", look_inside=False)
                    except ConfigError as exc:
                        problems.append(exc)
    return problems


def _search_corners(spec: ExperimentSpec) -> list[RunConfig]:
    """A search's configs at each end of each range and at each choice: what its trials may reach
    (the values between the ends of a numeric range reach nothing the ends do not)."""
    if spec.search is None:
        return []
    out = [spec.base]
    for param in spec.search.params:
        for value in (param.choices if param.kind == "choice" else (param.low, param.high)):
            out.append(with_fields(spec.base, **{param.field: value}))
    return out


def _one_per_arm(trials: list[Trial]) -> list[Trial]:
    seen: set[Any] = set()
    out = []
    for trial in trials:
        key = repr(trial.arm)
        if key not in seen:
            seen.add(key)
            out.append(trial)
    return out


def experiment_create(
    *, team: Team, user: User | None, spec: ExperimentSpec, topology: Topology | None = None, dataset: Dataset | None = None,
    notes: str = "",
) -> Experiment:
    """Save the experiment and queue every trial as a run (arm by arm, each arm's seeds together),
    or for a search its first trials (as many as the team's cap on running trials; each one that
    ends asks for the next); the runs are enqueued when the transaction commits, like any run.
    ExperimentError (nothing saved) when a search's ranges give no valid run to start with."""
    trials = spec.trials()
    count = spec.search.trials if spec.search is not None else len(trials)
    with transaction.atomic():
        experiment = Experiment.objects.create(
            team=team, owner=user, name=spec.name[:100], topology=topology, dataset=dataset, spec_yaml=spec.to_yaml(),
            trial_count=count, notes=notes,
        )
        for trial in trials:
            _trial_run(experiment=experiment, trial=trial, user=user)
        if spec.search is not None:
            try:
                runs.experiment_trials_start(experiment=experiment)
            except ConfigError as exc:  # its ranges gave no valid run in MAX_REFUSED_POINTS samples: nothing is saved
                raise ExperimentError([exc]) from None
        audit_record(team=team, actor=user, verb=Verb.LAUNCH, obj=experiment, trials=count,
                     arms=len(spec.arms()), seeds=len(spec.seeds), search=spec.search is not None)
    log.info("experiment #%s queued by %s: %s trials", experiment.pk, user or "the API", count)
    return experiment


def _trial_run(*, experiment: Experiment, trial: Trial, user: User | None, config: RunConfig | None = None) -> Run:
    run = runs.run_create(team=experiment.team, user=user, name=trial.config.name, config=config or trial.config,
                          topology=experiment.topology, dataset=experiment.dataset)
    Run.objects.filter(pk=run.pk).update(experiment=experiment, trial_index=trial.index)
    run.experiment, run.trial_index = experiment, trial.index
    return run


def experiment_cancel(*, experiment: Experiment, actor: User | None = None) -> int:
    """Cancel every queued and running trial (running ones stop at their next step); the number
    of trials it stopped. ValidationError for an experiment with none queued or running (a
    finished experiment is not marked cancelled)."""
    with transaction.atomic():
        Experiment.objects.select_for_update().filter(pk=experiment.pk).first()
        active = list(experiment.runs.filter(status__in=Run.ACTIVE))
        if not active:
            raise ValidationError(f"Experiment #{experiment.pk} has no queued or running trial to cancel: it has ended.")
        Experiment.objects.filter(pk=experiment.pk).update(cancelled=timezone.now())
        for run in active:
            runs.run_cancel(run=run, actor=actor)
        audit_record(team=experiment.team_id, actor=actor, verb=Verb.CANCEL, obj=experiment, trials=len(active))
    experiment.refresh_from_db()
    return len(active)


def experiment_resume(*, experiment: Experiment, user: User) -> int:
    """Start the trials that did not succeed: a failed or cancelled trial with a checkpoint
    continues from it (`run_resume`), one without starts over, one never started starts. The
    number of trials started; ValidationError while trials are still queued or running.

    Idempotent under concurrency: the experiment's row is locked (on SQLite the transaction's write
    lock, taken at BEGIN) before the check for active trials, so of two clicks on "Resume
    unfinished" the second finds the first's trials queued and starts none."""
    spec = experiment.to_spec()
    started = 0
    with transaction.atomic():
        Experiment.objects.select_for_update().filter(pk=experiment.pk).first()  # one resume at a time
        if experiment.runs.filter(status__in=Run.ACTIVE).exists():
            raise ValidationError("Some trials are still queued or running; cancel them first, or wait for them to end.")
        if not experiment_unfinished(experiment=experiment, spec=spec):
            raise ValidationError(f"Experiment #{experiment.pk} has no unfinished trial: every trial succeeded"
                                  f"{' or was pruned, and its search budget is spent' if spec.search is not None else ''}.")
        latest = experiment_latest_runs(experiment=experiment)
        if spec.search is not None:  # a search goes on asking until its budget is spent
            Experiment.objects.filter(pk=experiment.pk).update(cancelled=None)
            experiment.refresh_from_db()
            try:
                started = len(runs.experiment_trials_start(experiment=experiment))
            except ConfigError as exc:  # (a point that makes no valid run is skipped: only ranges that give none end here)
                raise ValidationError(f"The search cannot ask its next trial: {exc}") from None
            audit_record(team=experiment.team_id, actor=user, verb=Verb.RESUME, obj=experiment, trials=started)
            return started
        Experiment.objects.filter(pk=experiment.pk).update(cancelled=None)
        for trial in spec.trials():
            run = latest.get(trial.index)
            if run is not None and run.status == Run.Status.SUCCEEDED:
                continue
            if run is not None and run.checkpoints.kept().exists():
                new = runs.run_resume(run=run, user=user)
                Run.objects.filter(pk=new.pk).update(experiment=experiment, trial_index=trial.index)
            else:
                trust.check_config(team=experiment.team, config=trial.config)
                _trial_run(experiment=experiment, trial=trial, user=user)
            started += 1
        audit_record(team=experiment.team_id, actor=user, verb=Verb.RESUME, obj=experiment, trials=started)
    experiment.refresh_from_db()
    return started


def experiment_ablate(*, experiment: Experiment, user: User | None, key: str) -> tuple[int, list[str]]:
    """Queue the ablation `key` (`role_swap`, `untrained`, `alone:<agent>`) of every succeeded
    trial (its latest run), each an evaluation job (`webapp.jobs.ablations`); for `apart`, one job
    per team of two succeeded trials of the same seed, one of which trained exactly the agents the
    other froze (`training.ablation.apart_pairs`), on the first of the two. Returns how many jobs
    were queued or found already done, and why the others were refused (`run #N: ...`)."""
    queued, refused = 0, []
    finished = [(index, run) for index, run in sorted(experiment_latest_runs(experiment=experiment).items())
                if run.status == Run.Status.SUCCEEDED]
    if key == "apart":
        return _ablate_apart(finished, user=user)
    for index, run in finished:
        try:
            ablation_request(run=run, user=user, key=key)
        except ValidationError as exc:
            refused.append(f"trial {index} (run #{run.pk}): {' '.join(exc.messages)}")
        else:
            queued += 1
    return queued, refused


def _ablate_apart(finished: list[tuple[int, Run]], *, user: User | None) -> tuple[int, list[str]]:
    """`experiment_ablate`'s `apart`: each finished trial that froze agents, teamed with its partner."""
    items, refused = [], []
    for index, run in finished:
        try:
            config = run.to_config()
        except ConfigError as exc:
            refused.append(f"trial {index} (run #{run.pk}): its config no longer validates: {exc}")
            continue
        items.append(((index, run), config.seed, config))
    pairs, alone = apart_pairs(items)
    queued = 0
    for (index, run), (_, partner) in pairs:
        try:
            ablation_request(run=run, user=user, key="apart", partner=partner)
        except ValidationError as exc:
            refused.append(f"trial {index} (run #{run.pk}): {' '.join(exc.messages)}")
        else:
            queued += 1
    refused += [f"trial {index} (run #{run.pk}): no finished trial of its seed trained exactly the agents it froze"
                for index, run in alone]
    if not pairs and not alone and not refused:
        refused.append("trained apart teams a trial that froze some agents with one of the same seed that trained them; "
                       "no finished trial froze any")
    return queued, refused


def experiment_ablation_choices(*, experiment: Experiment) -> list[Ablation]:
    """The ablations the experiment's base topology allows (what the page offers for its trials),
    and trained apart when two of its arms can be teamed (`training.ablation.apart_pairs`)."""
    try:
        spec = experiment.to_spec()
        config = spec.base
        env = environments.environment_load(name=config.topology.environment, env_args=config.topology.env_args)
    except (ExperimentError, ValidationError):
        return []
    choices = ablations_for(config, env)
    if spec.search is None and apart_pairs([(t.index, t.seed, t.config) for t in spec.trials()])[0]:
        choices.append(Ablation.parse("apart", paired=True))
    return choices

"""Runs that are trials of an experiment's Optuna search (`training.search`): the study's records
read back from the experiment's runs, the next trials to start, and the sink that lets the
pruner stop a trial. The study lives in no store of its own: it is rebuilt from these rows each
time it is asked (the runs and their held-out evaluations are its storage)."""

from __future__ import annotations

from typing import Any

from training.config import RunConfig
from training.events import EventSink
from training.experiment import ExperimentSpec, field_value, trial_metrics, trial_name, with_fields
from training.search import PruningSink, TrialRecord, search_ask, search_should_prune
from webapp.core import trust
from webapp.models import Evaluation, Experiment, Run


def search_records(*, experiment: Experiment, spec: ExperimentSpec, exclude: Run | None = None) -> list[TrialRecord]:
    """Each trial's latest run as a record of the study: succeeded -> complete (its target metric),
    stopped by the pruner -> pruned (its intermediate values), failed -> failed, queued or running
    -> running (left out of the study); one cancelled by a person says nothing and is left out."""
    assert spec.search is not None
    latest: dict[int, Run] = {}
    for run in experiment.runs.filter(trial_index__isnull=False).order_by("created", "id"):
        latest[run.trial_index] = run  # type: ignore[index]
    if exclude is not None:
        latest.pop(exclude.trial_index, None)  # type: ignore[arg-type]
    evaluations: dict[int, list[dict[str, Any]]] = {}
    for row in Evaluation.objects.filter(run_id__in=[r.pk for r in latest.values()]).order_by("step", "id").values("run_id", "data"):
        evaluations.setdefault(row["run_id"], []).append(row["data"])
    records = []
    for index, run in sorted(latest.items()):
        try:
            config = run.to_config()
        except ValueError:
            continue
        params = {p.field: field_value(config, p.field) for p in spec.search.params}
        intermediate: dict[int, float] = {}
        for data in evaluations.get(run.pk, []):
            value = trial_metrics([data]).get(spec.metric)
            step = data.get("step") if isinstance(data, dict) else None
            if isinstance(step, int) and step > 0 and value is not None and step not in intermediate:
                intermediate[step] = value
        if run.status == Run.Status.SUCCEEDED:
            state, value = "complete", trial_metrics(evaluations.get(run.pk, [])).get(spec.metric)
        elif run.pruned_at_step is not None:
            state, value = "pruned", None
        elif run.status == Run.Status.FAILED:
            state, value = "failed", None
        elif run.status in Run.ACTIVE:
            state, value = "running", None
        else:
            continue
        records.append(TrialRecord(number=index, params=params, state=state, value=value, intermediate=intermediate))
    return records


def search_next(*, experiment: Experiment, running_cap: int) -> list[tuple[int, RunConfig]]:
    """(trial index, config) of the search trials to queue now: while the budget lasts, until the
    experiment has `running_cap` trials queued or running; none once it was cancelled. A sampled
    point that makes no valid run (the engine's or the trust boundary's checks) is told to the
    study as failed and another asked (`training.search.search_ask`); ConfigError on `search` when
    the ranges give none."""
    spec = experiment.to_spec()
    if spec.search is None or experiment.cancelled is not None:
        return []
    started = set(experiment.runs.filter(trial_index__isnull=False).values_list("trial_index", flat=True))
    active = experiment.runs.filter(status__in=Run.ACTIVE).count()
    records = search_records(experiment=experiment, spec=spec)
    seed = spec.seeds[0]
    out: list[tuple[int, RunConfig]] = []
    index = max(started, default=-1) + 1

    def build(params: dict[str, Any]) -> RunConfig:  # a combination of the ranges the run could not start with is refused here
        config = with_fields(spec.base, **params, seed=seed, name=trial_name(spec.name, tuple(params.items()), seed)[:200])
        trust.check_config(team=experiment.team, config=config)
        return config

    while index < spec.search.trials and active + len(out) < running_cap:
        params, config = search_ask(search=spec.search, direction=spec.direction, seed=seed, records=records, build=build)
        out.append((index, config))
        records.append(TrialRecord(number=index, params=params, state="running"))
        index += 1
    return out


def trial_sink(*, run: Run, sink: EventSink) -> EventSink:
    """The sink a trial trains with: for a search trial with a pruner, one that asks the pruner
    after each held-out evaluation (against the experiment's other trials as recorded now)."""
    if run.experiment_id is None or run.trial_index is None:
        return sink
    experiment = Experiment.objects.get(pk=run.experiment_id)
    spec = experiment.to_spec()
    search = spec.search
    if search is None or search.pruner == "none":
        return sink
    config = run.to_config()
    params = {p.field: field_value(config, p.field) for p in search.params}

    def decide(intermediate: dict[int, float]) -> bool:
        records = search_records(experiment=experiment, spec=spec, exclude=run)
        return search_should_prune(search=search, direction=spec.direction, seed=spec.seeds[0], records=records, params=params,
                                   intermediate=intermediate)

    return PruningSink(sink, metric=spec.metric, decide=decide)

"""Reads for experiments: the list, each trial's latest run and its held-out metrics, the arms'
mean ± 95 % interval over seeds, the best arm, the rough duration of a spec before launch, and
the CSV export."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, Q, QuerySet

from training.experiment import (
    ArmSummary,
    ExperimentSpec,
    Interval,
    Trial,
    arm_label,
    best_arm,
    field_value,
    mean_interval,
    summarize,
    trial_metrics,
)
from training.search import best_record
from webapp.history import selectors as history
from webapp.jobs.ablations import ablation_results
from webapp.models import Evaluation, Experiment, Job, Run, Team
from webapp.runs import queue
from webapp.runs import trials as trials_of_search
from webapp.runs.estimates import seconds_per_step
from webapp.runs.series import CHARTS


def experiment_list(*, team: Team) -> QuerySet[Experiment]:
    """The team's experiments, newest first, with their trials counted by state."""
    return (Experiment.objects.filter(team=team).select_related("owner", "topology", "dataset")
            .annotate(active_runs=Count("runs", filter=Q(runs__status__in=Run.ACTIVE)),
                      succeeded_runs=Count("runs", filter=Q(runs__status=Run.Status.SUCCEEDED)))
            .order_by("-created", "-id"))  # (Meta.ordering does not apply to a query with GROUP BY)


def experiment_latest_runs(*, experiment: Experiment) -> dict[int, Run]:
    """Trial index -> the trial's latest run (a resumed trial's newest attempt)."""
    latest: dict[int, Run] = {}
    for run in experiment.runs.filter(trial_index__isnull=False).order_by("created", "id"):
        latest[run.trial_index] = run  # type: ignore[index]
    return latest


def experiment_unfinished(*, experiment: Experiment, spec: ExperimentSpec | None = None) -> int:
    """How many trials "Resume unfinished" would start: a grid's trials whose latest run did not
    succeed (or never ran); for a search, its budget less the trials that ended it (succeeded, or
    pruned by the search itself). 0 for an experiment that is done."""
    spec = spec or experiment.to_spec()
    latest = experiment_latest_runs(experiment=experiment)
    if spec.search is not None:
        done = sum(1 for run in latest.values() if run.status == Run.Status.SUCCEEDED or run.pruned_at_step is not None)
        return max(0, spec.search.trials - done)
    return sum(1 for trial in spec.trials() if (run := latest.get(trial.index)) is None or run.status != Run.Status.SUCCEEDED)


@dataclass
class TrialRow:
    trial: Trial
    run: Run | None
    metrics: dict[str, float]
    held: bool = False
    """Queued but held back by the team's cap on running trials."""


@dataclass
class AblationRow:
    """One ablation (`training.ablation`) of an arm's finished trials: each metric's mean ± 95 %
    interval over the seeds whose trial was ablated, and each seed's value."""

    key: str
    label: str
    metrics: dict[str, Interval]
    seeds: list[tuple[int, Run, float | None]]
    """(seed, trial run, the experiment's metric under the ablation)."""


@dataclass
class ArmRow:
    summary: ArmSummary
    cells: list[TrialRow]
    """One per seed, in the spec's seed order."""
    is_best: bool = False
    ablations: list[AblationRow] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.summary.label


@dataclass
class SearchRow:
    index: int
    run: Run
    params: dict[str, Any]
    state: str
    """complete, pruned, failed, running, or cancelled (by a person)."""
    value: float | None
    is_best: bool = False


@dataclass
class ExperimentResults:
    spec: ExperimentSpec
    arms: list[ArmRow]
    trials: list[TrialRow]
    metric_names: list[str]
    best: ArmSummary | None
    counts: dict[str, int] = field(default_factory=dict)
    """Trials by their latest run's status (`queued`, `running`, ...), `not started` for none."""
    cap: int = 0
    running_trials: int = 0
    """The team's running experiment trials (all its experiments), against `cap`."""
    search_rows: list[SearchRow] = field(default_factory=list)
    """A search's trials in order (empty for a grid)."""

    @property
    def best_search_row(self) -> SearchRow | None:
        return next((r for r in self.search_rows if r.is_best), None)


def experiment_results(*, experiment: Experiment) -> ExperimentResults:
    """Every trial with its latest run and metrics (the last greedy held-out evaluation, as the
    CLI reads it), and each arm's mean ± 95 % interval over the seeds whose trial succeeded."""
    spec = experiment.to_spec()
    latest = experiment_latest_runs(experiment=experiment)
    evaluations: dict[int, list[dict[str, Any]]] = {}
    for row in Evaluation.objects.filter(run_id__in=[r.pk for r in latest.values()]).order_by("step", "id").values("run_id", "data"):
        evaluations.setdefault(row["run_id"], []).append(row["data"])
    capped = queue.experiment_capped_teams()
    trials = []
    for trial in spec.trials():
        run = latest.get(trial.index)
        metrics = trial_metrics(evaluations.get(run.pk, [])) if run is not None else {}
        trials.append(TrialRow(trial=trial, run=run, metrics=metrics,
                               held=run is not None and queue.run_is_held(run=run, capped=capped)))
    finished = [(t.trial.arm, t.trial.seed, t.metrics) for t in trials if t.run is not None and t.run.status == Run.Status.SUCCEEDED]
    summaries = summarize(spec.arms(), finished)
    best = best_arm(summaries, spec.metric, spec.direction)
    ablated = ablation_results(runs=[t.run for t in trials if t.run is not None and t.run.status == Run.Status.SUCCEEDED])
    arms = [ArmRow(summary=s, cells=[t for t in trials if t.trial.arm == s.arm], is_best=best is not None and s.arm == best.arm)
            for s in summaries]
    for arm in arms:
        arm.ablations = _ablation_rows(arm.cells, ablated, spec.metric)
    names = [spec.metric] + [n for n in dict.fromkeys(k for t in trials for k in t.metrics) if n != spec.metric]
    counts: dict[str, int] = {}
    for t in trials:
        key = t.run.status if t.run is not None else "not started"
        counts[key] = counts.get(key, 0) + 1
    running = Run.objects.filter(team_id=experiment.team_id, status=Run.Status.RUNNING, experiment__isnull=False).count()
    rows = _search_rows(experiment=experiment, spec=spec, latest=latest) if spec.search is not None else []
    if spec.search is not None:
        for row in rows:
            counts[row.state] = counts.get(row.state, 0) + 1
        counts["not asked yet"] = spec.search.trials - len(rows)
    return ExperimentResults(spec=spec, arms=arms, trials=trials, metric_names=names, best=best, counts=counts,
                             cap=settings.TROUPE_EXPERIMENT_CONCURRENCY, running_trials=running, search_rows=rows)


def _ablation_rows(cells: list[TrialRow], ablated: dict[int, dict[str, list[dict[str, Any]]]], metric: str) -> list[AblationRow]:
    """The arm's ablations, in the order they were first run, over the seeds ablated so far."""
    per_key: dict[str, list[tuple[int, Run, dict[str, float]]]] = {}
    labels: dict[str, str] = {}
    for cell in cells:
        if cell.run is None:
            continue
        for key, evaluations in ablated.get(cell.run.pk, {}).items():
            per_key.setdefault(key, []).append((cell.trial.seed, cell.run, trial_metrics(evaluations)))
            labels[key] = ((evaluations[0].get("ablation") or {}).get("label") if evaluations else None) or key
    rows = []
    for key, seeds in per_key.items():
        names = list(dict.fromkeys(n for _, _, m in seeds for n in m))
        intervals = {n: i for n in names if (i := mean_interval([m[n] for _, _, m in seeds if n in m])) is not None}
        rows.append(AblationRow(key=key, label=labels[key], metrics=intervals,
                                seeds=[(seed, run, m.get(metric)) for seed, run, m in seeds]))
    return rows


def experiment_is_live(*, experiment: Experiment) -> bool:
    """Whether the page has something to wait for: a trial queued or running, or an ablation job
    of one of its trials queued or running."""
    return experiment.is_active or Job.objects.filter(run__experiment=experiment, status__in=Job.ACTIVE,
                                                      params__has_key="ablation").exists()


def _search_rows(*, experiment: Experiment, spec: ExperimentSpec, latest: dict[int, Run]) -> list[SearchRow]:
    records = {r.number: r for r in trials_of_search.search_records(experiment=experiment, spec=spec)}
    rows = []
    for index, run in sorted(latest.items()):
        record = records.get(index)
        if record is None:  # cancelled by a person: not part of the study
            params = {p.field: field_value(run.to_config(), p.field) for p in spec.search.params} if spec.search else {}
            rows.append(SearchRow(index=index, run=run, params=params, state="cancelled", value=None))
        else:
            rows.append(SearchRow(index=index, run=run, params=record.params, state=record.state, value=record.value))
    best = best_record([records[r.index] for r in rows if r.index in records], spec.direction)
    for row in rows:
        row.is_best = best is not None and row.index == best.number
    return rows


@dataclass
class Estimate:
    runs: int
    arms: int
    seeds: int
    steps: int
    """Training steps over all trials."""
    seconds_per_step: float | None
    parallel: int
    """Trials that may run at once (the team's cap)."""

    @property
    def duration(self) -> timedelta | None:
        if self.seconds_per_step is None:
            return None
        return timedelta(seconds=self.seconds_per_step * self.steps / self.parallel)


def experiment_estimate(*, team: Team, spec: ExperimentSpec) -> Estimate:
    """How many runs the spec starts and roughly how long they take: total steps times the
    team's recent seconds per step, over the trials its cap lets run at once."""
    trials = spec.trials()
    if spec.search is not None:  # at most: the pruner may stop some trials early
        runs, arms, seeds, steps = spec.search.trials, spec.search.trials, 1, spec.search.trials * spec.base.optim.steps
    else:
        runs, arms, seeds, steps = len(trials), len(spec.arms()), len(spec.seeds), sum(t.config.optim.steps for t in trials)
    return Estimate(runs=runs, arms=arms, seeds=seeds, steps=steps,
                    seconds_per_step=seconds_per_step(team=team, environment=spec.base.topology.environment),
                    parallel=min(settings.TROUPE_EXPERIMENT_CONCURRENCY, runs) or 1)


def experiment_csv_rows(*, results: ExperimentResults) -> Iterator[list[Any]]:
    """One row per trial: its arm, each axis value, the seed, its run and status, every metric;
    then one summary row per arm (mean, and the interval's bounds) of each metric. A search: one
    row per trial with its parameters, state and target metric."""
    spec = results.spec
    names = results.metric_names
    if spec.search is not None:
        yield ["trial", *[p.field for p in spec.search.params], "run", "state", spec.metric]
        for row in results.search_rows:
            yield [row.index, *[row.params.get(p.field, "") for p in spec.search.params], row.run.pk, row.state,
                   "" if row.value is None else row.value]
        return
    yield ["trial", "arm", *[a.field for a in spec.axes], "seed", "run", "status", *names]
    arms = spec.arms()
    for t in results.trials:
        yield [t.trial.index, arm_label(t.trial.arm, arms), *[v for _, v in t.trial.arm], t.trial.seed,
               t.run.pk if t.run else "", t.run.status if t.run else "not started", *[t.metrics.get(n, "") for n in names]]
    yield []
    yield ["arm", "runs", *[f"{n} {part}" for n in names for part in ("mean", "ci95_low", "ci95_high")]]
    for arm in results.arms:
        cells: list[Any] = []
        for n in names:
            interval = arm.summary.metrics.get(n)
            cells += [interval.mean, interval.low, interval.high] if interval is not None else ["", "", ""]
        yield [arm.label, len(arm.summary.trials), *cells]


HELD_OUT = "held-out "
"""Prefix of a curve metric read from the trials' greedy held-out evaluations (`held-out team.success`)."""


def experiment_curve_metrics(*, experiment: Experiment, results: ExperimentResults) -> list[str]:
    """What the learning curves can show: the held-out metrics (the experiment's own first), then
    the training metrics the trials record each step."""
    runs = [t.run for t in results.trials if t.run is not None][:8] or [r.run for r in results.search_rows][:8]
    held_out = [HELD_OUT + n for n in results.metric_names] or [HELD_OUT + results.spec.metric]
    return held_out + history.compare_metric_names(runs=runs)


def experiment_curves(*, experiment: Experiment, metric: str) -> dict[str, Any]:
    """One metric against the step for each arm: its mean over the arm's trials (seeds) at each
    step and a band, the 95 % t-interval where two or more seeds have the step (none with one).
    A search's trials are one arm each. Training metrics come downsampled as on the compare page."""
    spec = experiment.to_spec()
    latest = experiment_latest_runs(experiment=experiment)
    if spec.search is not None:
        groups = [(f"#{i}", [run]) for i, run in sorted(latest.items())]
    else:
        by_index = {t.index: t for t in spec.trials()}
        arms = spec.arms()
        grouped: dict[str, list[Run]] = {arm_label(arm, arms): [] for arm in arms}  # (an arm's values may be lists: keyed by label)
        for index, run in sorted(latest.items()):
            if index in by_index:
                grouped[arm_label(by_index[index].arm, arms)].append(run)
        groups = list(grouped.items())
    runs = [run for _, rs in groups for run in rs]
    series: dict[int, dict[int, float]] = {}
    if metric.startswith(HELD_OUT):
        name = metric[len(HELD_OUT):]
        for row in Evaluation.objects.filter(run__in=runs).order_by("step", "id").values("run_id", "step", "data"):
            value = trial_metrics([row["data"]]).get(name)
            if value is not None:
                series.setdefault(row["run_id"], {})[row["step"]] = value
    else:
        for each in history.compare_series(runs=runs, metric=metric)["runs"]:
            steps, values = each["run"]
            series[each["id"]] = {s: v for s, v in zip(steps, values) if v is not None}
    arms = []
    for label, members in groups:
        steps = sorted({s for run in members for s in series.get(run.pk, {})})
        mean, low, high = [], [], []
        for step in steps:
            interval = mean_interval([series[run.pk][step] for run in members if step in series.get(run.pk, {})])
            assert interval is not None
            mean.append(interval.mean)
            low.append(interval.low if interval.low is not None else interval.mean)
            high.append(interval.high if interval.high is not None else interval.mean)
        arms.append({"label": label, "runs": len(members), "steps": steps, "mean": mean, "low": low, "high": high})
    out: dict[str, Any] = {"metric": metric, "arms": arms}
    if _is_share(metric):
        out["range"] = [0, 1]  # the chart's axis runs 0-1, as the run page's charts of shares do
    return out


def _is_share(metric: str) -> bool:
    """Whether a metric is a 0-1 share: a held-out success, or a training metric the run page charts
    on a fixed 0-1 axis (`webapp.runs.series.CHARTS`)."""
    if metric.startswith(HELD_OUT):
        return metric.endswith("success")
    return any(chart.range == (0, 1) and (metric in chart.run or metric == chart.agent) for chart in CHARTS)


def experiment_diff_choices(*, results: ExperimentResults) -> list[tuple[str, str, str]]:
    """(key, label, config YAML) of each arm at its first seed (a search: each trial's run), for the
    "differences only" config diff between two of them."""
    if results.spec.search is not None:
        return [(str(r.index), f"#{r.index}", r.run.config_yaml) for r in results.search_rows]
    out = []
    for i, arm in enumerate(results.arms):
        first = arm.cells[0]
        out.append((str(i), arm.label, first.run.config_yaml if first.run is not None else first.trial.config.to_yaml()))
    return out


def experiment_arm_diff(*, results: ExperimentResults, a: str, b: str) -> tuple[list[str], list[history.DiffRow]]:
    """The labels of arms `a` and `b` (keys of `experiment_diff_choices`) and the config keys whose
    values differ between them (`webapp.history.services.config_diff`, differences only)."""
    choices = {key: (label, text) for key, label, text in experiment_diff_choices(results=results)}
    if a not in choices or b not in choices:
        return [], []
    labels = [choices[a][0], choices[b][0]]
    return labels, history.config_diff(configs=[choices[a][1], choices[b][1]], differences_only=True)

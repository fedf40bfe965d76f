"""The experiments API: list and launch, one experiment with its arms and trials, cancel, resume.

    GET  /api/v1/experiments/?page=&per_page=   the team's experiments, newest first
    POST /api/v1/experiments/                   JSON {topology, dataset, name, config, axes, seeds, metric, direction}
    POST /api/v1/experiments/preview/           the same body, a dry run: the runs, arms and steps it would start, and how long
    GET  /api/v1/experiments/<id>/              arms (mean ± 95 % interval over seeds, per-seed runs), trials, best arm
    POST /api/v1/experiments/<id>/cancel/       cancel every queued and running trial
    POST /api/v1/experiments/<id>/resume/       start the trials that did not succeed
    POST /api/v1/experiments/<id>/ablations/    {"ablation": ...}: ablate every finished trial
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import yaml
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from ninja import Field, Router, Schema, Status

from training.experiment import MAX_SEEDS, ExperimentError, Interval, arm_label
from webapp.api.app import Id, In, Page, QueryPaging, answers, body_doc, page_of, read_body
from webapp.api.http import ApiError, absolute
from webapp.catalog import selectors as catalog
from webapp.core import trust
from webapp.experiments import selectors, services
from webapp.experiments.selectors import ExperimentResults
from webapp.models import Dataset, Experiment
from webapp.runs import services as run_services

router = Router(tags=["experiments"])


class ExperimentIn(In):
    topology: Id = Field(description="A topology of the team: its model and agents.")
    dataset: Id = Field(description="A dataset of the team: every trial trains on it.")
    name: str = Field("", max_length=100, description="The experiment's name (default: the topology's).")
    conversations: Id | None = Field(None, description="A conversations dataset of the team: every trial is supervised "
                                                       "fine-tuning on it (algorithm sft).")
    config: str | dict[str, Any] = Field("", description="Base config fields every trial shares, merged over the topology and "
                                         "dataset (YAML text, or the same sections as an object), as the run form's advanced YAML.")
    axes: dict[str, Any] = Field({}, description='The grid: dotted config field -> list of values, e.g. {"optim.lr": [0.0001, 0.0003]}.')
    seeds: list[int] = Field([0], description=f"Each arm runs once per seed (at most {MAX_SEEDS}); default [0].")
    metric: str = Field("team.success", max_length=100, description="What ranks the arms: team.success, or <agent>.success / <agent>.reward.")
    direction: Literal["maximize", "minimize"] = Field("maximize", description="Whether a higher or a lower metric is better.")
    search: dict[str, Any] | None = Field(None, description="An Optuna search instead of axes: {trials, params: {field: {low, high, log} "
                                                          "or {choices}}, pruner: median|none, startup_trials}.")

    model_config = {**In.model_config, "json_schema_extra": {"examples": [
        {"topology": 1, "dataset": 1, "name": "lr sweep", "axes": {"optim.lr": [0.0001, 0.0003]}, "seeds": [0, 1]}]}}


class ExperimentOut(Schema):
    id: int
    name: str
    status: Literal["active", "finished", "cancelled"] = Field(description="Active while a trial is queued or running.")
    trials: int = Field(description="Arms x seeds.")
    topology: int | None
    dataset: int | None
    owner: str | None
    created: datetime
    cancelled: datetime | None
    url: str
    api_url: str

    @staticmethod
    def resolve_trials(obj: Experiment) -> int:
        return obj.trial_count

    @staticmethod
    def resolve_topology(obj: Experiment) -> int | None:
        return obj.topology_id

    @staticmethod
    def resolve_dataset(obj: Experiment) -> int | None:
        return obj.dataset_id

    @staticmethod
    def resolve_owner(obj: Experiment) -> str | None:
        return obj.owner.username if obj.owner else None

    @staticmethod
    def resolve_url(obj: Experiment, context: dict[str, Any]) -> str:
        return absolute(context["request"], obj.get_absolute_url())

    @staticmethod
    def resolve_api_url(obj: Experiment, context: dict[str, Any]) -> str:
        return absolute(context["request"], reverse("api_experiment", args=[obj.pk]))


class IntervalOut(Schema):
    mean: float
    ci95: list[float] | None = Field(description="[low, high]; null with one seed")
    n: int


class TrialOut(Schema):
    seed: int
    run: int | None
    status: str | None
    held: bool
    metrics: dict[str, Any]


class AblationSeed(Schema):
    seed: int
    run: int
    value: float | None


class AblationOut(Schema):
    ablation: str
    label: str
    metrics: dict[str, IntervalOut | None]
    seeds: list[AblationSeed]


class ArmOut(Schema):
    arm: dict[str, Any]
    label: str
    best: bool
    metrics: dict[str, IntervalOut | None] = Field(description="metric -> {mean, ci95, n}, or null")
    trials: list[TrialOut]
    ablations: list[AblationOut] = Field(description="The arm's ablations (POST /api/v1/runs/<id>/ablations/ on its trials): each "
                                                     "metric over the seeds ablated so far, and each seed's value of the experiment's metric")


class SearchTrialOut(Schema):
    trial: int
    run: int
    params: dict[str, Any]
    state: Literal["complete", "pruned", "failed", "running", "cancelled"]
    value: float | None
    pruned_at_step: int | None


class ExperimentDetail(ExperimentOut):
    spec_yaml: str = Field(description="The spec; `python -m training sweep` runs it as written.")
    metric: str
    direction: Literal["maximize", "minimize"]
    axes: dict[str, Any]
    seeds: list[int]
    best_arm: dict[str, Any] | None = Field(description="field -> value of the best arm (or search trial) so far")
    search_trials: list[SearchTrialOut] = Field(description="A search's trials (empty for a grid)")
    arms: list[ArmOut]


class _Detail:
    """An experiment with its results, as `ExperimentDetail` reads it."""

    def __init__(self, experiment: Experiment):
        self.experiment, results = experiment, selectors.experiment_results(experiment=experiment)
        spec = results.spec
        self.metric, self.direction, self.seeds = spec.metric, spec.direction, list(spec.seeds)
        self.axes = {a.field: list(a.values) for a in spec.axes}
        self.best_arm = (dict(results.best.arm) if results.best is not None else
                         next(({**r.params} for r in results.search_rows if r.is_best), None))
        self.search_trials = [{"trial": r.index, "run": r.run.pk, "params": r.params, "state": r.state, "value": r.value,
                               "pruned_at_step": r.run.pruned_at_step} for r in results.search_rows]
        self.arms = [_arm(arm, results) for arm in results.arms]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.experiment, name)


def _interval(interval: Interval | None) -> dict[str, Any] | None:
    if interval is None:
        return None
    return {"mean": interval.mean, "ci95": [interval.low, interval.high] if interval.half_width is not None else None, "n": interval.n}


def _arm(arm: Any, results: ExperimentResults) -> dict[str, Any]:
    names = results.metric_names
    return {
        "arm": dict(arm.summary.arm), "label": arm.label, "best": arm.is_best,
        "metrics": {name: _interval(arm.summary.metrics.get(name)) for name in names},
        "trials": [{"seed": c.trial.seed, "run": c.run.pk if c.run else None, "status": c.run.status if c.run else None,
                    "held": c.held, "metrics": c.metrics} for c in arm.cells],
        "ablations": [{"ablation": ab.key, "label": ab.label, "metrics": {name: _interval(ab.metrics.get(name)) for name in names},
                       "seeds": [{"seed": seed, "run": run.pk, "value": value} for seed, run, value in ab.seeds]}
                      for ab in arm.ablations],
    }


def _experiment(request: Any, pk: int) -> Experiment:
    return selectors.experiment_list(team=request.team).get(pk=pk)


@router.get("/", response=answers({200: Page[ExperimentOut]}, 400, 404), url_name="api_experiments",
            summary="The team's experiments, newest first")
def experiments(request: HttpRequest, paging: QueryPaging) -> Any:
    return page_of(request, selectors.experiment_list(team=request.team).order_by("-created", "-id"), paging)


def _spec(request: HttpRequest, body: ExperimentIn) -> tuple[Any, Any, Any]:
    """(the spec, the topology, the dataset) of a launch body, or a 400 naming every problem."""
    team = request.team  # type: ignore[attr-defined]
    topology = catalog.team_topology(team=team, pk=body.topology)
    dataset = catalog.team_dataset(team=team, pk=body.dataset, valid=True)
    missing = {k: ["No such object in your team."] for k, v in (("topology", topology), ("dataset", dataset)) if v is None}
    if body.conversations is not None and catalog.team_dataset(team=team, pk=body.conversations, kind=Dataset.Kind.CHATS, valid=True) is None:
        missing["conversations"] = ["No valid conversations dataset with this id in your team."]
    if missing:
        raise ApiError(400, "; ".join(f"{k}: no such object in your team" for k in missing), fields=missing)
    conversations = body.conversations and catalog.team_dataset(team=team, pk=body.conversations)
    config = body.config
    if isinstance(config, dict):
        trust.check_tree(config, field="config")
        config = yaml.safe_dump(config, sort_keys=False)
    try:
        spec = services.experiment_spec_build(
            team=team, topology=topology, dataset=dataset, name=body.name, axes=body.axes, seeds=body.seeds, metric=body.metric,
            direction=body.direction, advanced_yaml=config, search=body.search,
            overrides=run_services.run_source_overrides(team=team, conversations=conversations or None),
        )
    except ExperimentError as exc:
        raise _spec_error(exc) from None
    return spec, topology, dataset


def _spec_error(exc: ExperimentError) -> ApiError:
    """Every problem of the spec (or a search whose ranges give no valid run to start with)."""
    fields: dict[str, list[str]] = {}
    for problem in exc.problems:
        fields.setdefault(problem.field, []).append(problem.message)
    return ApiError(400, str(exc), fields=fields)


@router.post("/", response=answers({201: ExperimentDetail}, 400, 413, 415),
             summary="Launch an experiment: a base config, axes and seeds; every trial is queued as a run")
def experiment_create(request: HttpRequest, response: HttpResponse, body: ExperimentIn) -> Any:
    spec, topology, dataset = _spec(request, body)
    try:
        experiment = services.experiment_create(team=request.team, user=request.user, spec=spec, topology=topology, dataset=dataset)  # type: ignore[attr-defined]
    except ExperimentError as exc:
        raise _spec_error(exc) from None
    response["Location"] = absolute(request, reverse("api_experiment", args=[experiment.pk]))
    return Status(201, _Detail(_experiment(request, experiment.pk)))


class PreviewOut(Schema):
    runs: int = Field(description="Runs it would start (a search: at most, the pruner may stop some early).")
    arms: int
    seeds: int
    steps: int = Field(description="Training steps over all trials.")
    parallel: int = Field(description="Trials that may run at once (the team's cap).")
    seconds_per_step: float | None = Field(description="The team's recent seconds per step on this environment; null: no runs yet.")
    duration_seconds: float | None = Field(description="Roughly how long the experiment takes; null without a recent step time.")
    arm_labels: list[str] = Field(description="Each arm as field=value, ... (empty for a search).")


@router.post("/preview/", response=answers({200: PreviewOut}, 400, 413, 415), url_name="api_experiment_preview",
             summary="A dry run of a launch: the runs, arms and steps it would start and roughly how long, or every problem with it "
                     "(the experiment form's preview); nothing is saved")
def experiment_preview(request: HttpRequest, body: ExperimentIn) -> Any:
    spec, _, _ = _spec(request, body)
    estimate = selectors.experiment_estimate(team=request.team, spec=spec)  # type: ignore[attr-defined]
    return {"runs": estimate.runs, "arms": estimate.arms, "seeds": estimate.seeds, "steps": estimate.steps, "parallel": estimate.parallel,
            "seconds_per_step": estimate.seconds_per_step,
            "duration_seconds": estimate.duration.total_seconds() if estimate.duration is not None else None,
            "arm_labels": [] if spec.search is not None else [arm_label(arm, spec.arms()) for arm in spec.arms()]}


@router.get("/{int:id}/", response=answers({200: ExperimentDetail}, 404), url_name="api_experiment",
            summary="One experiment: its arms (mean ± 95 % interval over seeds), each seed's run, the best arm")
def experiment_detail(request: HttpRequest, id: int) -> Any:
    return _Detail(_experiment(request, id))


@router.post("/{int:id}/cancel/", response=answers({200: ExperimentOut}, 404), url_name="api_experiment_cancel",
             summary="Cancel every queued and running trial")
def experiment_cancel(request: HttpRequest, id: int) -> Any:
    services.experiment_cancel(experiment=_experiment(request, id), actor=request.user)
    return _experiment(request, id)


@router.post("/{int:id}/resume/", response=answers({200: ExperimentOut}, 400, 404), url_name="api_experiment_resume",
             summary="Start the trials that did not succeed (from their last checkpoint where they have one)")
def experiment_resume(request: HttpRequest, id: int) -> Any:
    services.experiment_resume(experiment=_experiment(request, id), user=request.user)  # ValidationError -> 400 (trials still active)
    return _experiment(request, id)


class ExperimentAblationIn(In):
    ablation: str = Field(max_length=200, description="role_swap, untrained, or alone:<agent>: queued for every finished trial; "
                          "apart: one job per pair of finished trials of a seed, one of which trained the agents the other froze.")


class ExperimentAblated(Schema):
    queued: int = Field(description="Finished trials whose ablation was queued (or found done already).")
    refused: list[str] = Field(description="Why each other finished trial was not ablated: run #N: ...")


@router.post("/{int:id}/ablations/", response=answers({202: ExperimentAblated}, 400, 404, 415), url_name="api_experiment_ablations",
             openapi_extra=body_doc(ExperimentAblationIn),
             summary="Ablate every finished trial at once (the experiment page's Ablate): the arms' ablation rows fill in as the jobs finish")
def experiment_ablate(request: HttpRequest, id: int) -> Any:
    experiment = _experiment(request, id)
    body, problems = read_body(request, ExperimentAblationIn)
    if problems:
        raise ApiError(400, "; ".join(f"{k}: {' '.join(v)}" for k, v in problems.items()), fields=problems)
    queued, refused = services.experiment_ablate(experiment=experiment, user=request.user, key=body["ablation"])
    return Status(202, {"queued": queued, "refused": refused})

"""The experiments API: list and launch, one experiment with its arms and trials, cancel, resume.

    GET  /api/v1/experiments/?page=&per_page=   the team's experiments, newest first
    POST /api/v1/experiments/                   JSON {topology, dataset, name, config, axes, seeds, metric, direction}
    GET  /api/v1/experiments/<id>/              arms (mean ± 95 % interval over seeds, per-seed runs), trials, best arm
    POST /api/v1/experiments/<id>/cancel/       cancel every queued and running trial
    POST /api/v1/experiments/<id>/resume/       start the trials that did not succeed
"""

from __future__ import annotations

from typing import Any

import yaml
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse

from training.experiment import DIRECTIONS, MAX_SEEDS, ExperimentError, Interval
from webapp.api.http import ApiError, Field, absolute, endpoint, id_field, json_body, page_of, stamp
from webapp.core import trust
from webapp.experiments import selectors, services
from webapp.models import Dataset, Experiment, Topology
from webapp.runs import services as run_services

EXPERIMENT_FIELDS = {
    "topology": id_field("A topology of the team: its model and agents.", required=True),
    "dataset": id_field("A dataset of the team: every trial trains on it.", required=True),
    "name": Field("string", "The experiment's name (default: the topology's).", max_length=100),
    "conversations": id_field("A conversations dataset of the team: every trial is supervised fine-tuning on it (algorithm sft).",
                              nullable=True),
    "config": Field(("string", "object"), "Base config fields every trial shares, merged over the topology and dataset "
                    "(YAML text, or the same sections as an object), as the run form's advanced YAML."),
    "axes": Field("object", "The grid: dotted config field -> list of values, e.g. {\"optim.lr\": [0.0001, 0.0003]}."),
    "seeds": Field("array", f"Each arm runs once per seed (at most {MAX_SEEDS}); default [0].", items="integer"),
    "metric": Field("string", "What ranks the arms: team.success, or <agent>.success / <agent>.reward.", max_length=100),
    "direction": Field("string", "Whether a higher or a lower metric is better.", enum=DIRECTIONS),
    "search": Field("object", "An Optuna search instead of axes: {trials, params: {field: {low, high, log} or {choices}}, "
                    "pruner: median|none, startup_trials}."),
}


def _interval(interval: Interval | None) -> dict[str, Any] | None:
    if interval is None:
        return None
    return {"mean": interval.mean, "ci95": [interval.low, interval.high] if interval.half_width is not None else None,
            "n": interval.n}


def experiment_json(request: HttpRequest, experiment: Experiment) -> dict[str, Any]:
    return {
        "id": experiment.pk,
        "name": experiment.name,
        "status": experiment.status,
        "trials": experiment.trial_count,
        "topology": experiment.topology_id,
        "dataset": experiment.dataset_id,
        "owner": experiment.owner.username if experiment.owner else None,
        "created": stamp(experiment.created),
        "cancelled": stamp(experiment.cancelled),
        "url": absolute(request, experiment.get_absolute_url()),
        "api_url": absolute(request, reverse("api_experiment", args=[experiment.pk])),
    }


def experiment_detail_json(request: HttpRequest, experiment: Experiment) -> dict[str, Any]:
    results = selectors.experiment_results(experiment=experiment)
    spec = results.spec
    data = experiment_json(request, experiment)
    data.update({
        "spec_yaml": experiment.spec_yaml,
        "metric": spec.metric,
        "direction": spec.direction,
        "axes": {a.field: list(a.values) for a in spec.axes},
        "seeds": list(spec.seeds),
        "best_arm": (dict(results.best.arm) if results.best is not None else
                     next(({**r.params} for r in results.search_rows if r.is_best), None)),
        "search_trials": [{"trial": r.index, "run": r.run.pk, "params": r.params, "state": r.state, "value": r.value,
                           "pruned_at_step": r.run.pruned_at_step} for r in results.search_rows],
        "arms": [{
            "arm": dict(arm.summary.arm),
            "label": arm.label,
            "best": arm.is_best,
            "metrics": {name: _interval(arm.summary.metrics.get(name)) for name in results.metric_names},
            "trials": [{"seed": c.trial.seed, "run": c.run.pk if c.run else None, "status": c.run.status if c.run else None,
                        "held": c.held, "metrics": c.metrics} for c in arm.cells],
            "ablations": [{"ablation": ab.key, "label": ab.label,
                           "metrics": {name: _interval(ab.metrics.get(name)) for name in results.metric_names},
                           "seeds": [{"seed": seed, "run": run.pk, "value": value} for seed, run, value in ab.seeds]}
                          for ab in arm.ablations],
        } for arm in results.arms],
    })
    return data


def _experiment(request: Any, pk: int) -> Experiment:
    return Experiment.objects.select_related("owner").get(pk=pk, team=request.team)


@endpoint("GET", "POST")
def experiments(request: Any) -> HttpResponse:
    if request.method == "GET":
        return page_of(request, Experiment.objects.filter(team=request.team).select_related("owner").order_by("-created", "-id"),
                       experiment_json)
    body = json_body(request, EXPERIMENT_FIELDS)
    topology = Topology.objects.filter(team=request.team, pk=body["topology"]).first()
    dataset = Dataset.objects.filter(team=request.team, pk=body["dataset"], status=Dataset.Status.VALID).first()
    missing = {k: ["No such object in your team."] for k, v in (("topology", topology), ("dataset", dataset)) if v is None}
    if missing:
        raise ApiError(400, "; ".join(f"{k}: no such object in your team" for k in missing), fields=missing)
    conversations = None
    if body.get("conversations") is not None:
        conversations = Dataset.objects.filter(team=request.team, pk=body["conversations"], kind=Dataset.Kind.CHATS,
                                               status=Dataset.Status.VALID).first()
        if conversations is None:
            raise ApiError(400, "conversations: no valid conversations dataset with this id in your team",
                           fields={"conversations": ["No such object in your team."]})
    config = body.get("config") or ""
    if isinstance(config, dict):
        trust.check_tree(config, field="config")
        config = yaml.safe_dump(config, sort_keys=False)
    try:
        spec = services.experiment_spec_build(
            team=request.team, topology=topology, dataset=dataset, name=body.get("name") or "", axes=body.get("axes") or {},
            seeds=body.get("seeds", [0]), metric=body.get("metric") or "team.success", direction=body.get("direction") or "maximize",
            advanced_yaml=config, search=body.get("search"),
            overrides=run_services.run_source_overrides(team=request.team, conversations=conversations),
        )
    except ExperimentError as exc:
        fields: dict[str, list[str]] = {}
        for problem in exc.problems:
            fields.setdefault(problem.field, []).append(problem.message)
        raise ApiError(400, str(exc), fields=fields) from None
    try:
        experiment = services.experiment_create(team=request.team, user=request.user, spec=spec, topology=topology, dataset=dataset)
    except ExperimentError as exc:  # a search whose ranges give no valid run to start with
        raise ApiError(400, str(exc), fields={p.field: [p.message] for p in exc.problems}) from None
    response = JsonResponse(experiment_detail_json(request, experiment), status=201)
    response["Location"] = absolute(request, reverse("api_experiment", args=[experiment.pk]))
    return response


@endpoint("GET")
def experiment_detail(request: Any, pk: int) -> HttpResponse:
    return JsonResponse(experiment_detail_json(request, _experiment(request, pk)))


@endpoint("POST")
def experiment_cancel(request: Any, pk: int) -> HttpResponse:
    experiment = _experiment(request, pk)
    services.experiment_cancel(experiment=experiment, actor=request.user)
    return JsonResponse(experiment_json(request, experiment))


@endpoint("POST")
def experiment_resume(request: Any, pk: int) -> HttpResponse:
    experiment = _experiment(request, pk)
    services.experiment_resume(experiment=experiment, user=request.user)  # ValidationError -> 400 (trials still active)
    return JsonResponse(experiment_json(request, experiment))

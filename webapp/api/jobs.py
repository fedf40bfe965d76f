"""Evaluations and playground sessions over the JSON API, and the jobs they become.

    POST /api/v1/runs/<id>/evaluations/   evaluate a checkpoint (or the base models) on a dataset
    GET  /api/v1/runs/<id>/ablations/     the ablations a finished team run allows, and its ablation jobs
    POST /api/v1/runs/<id>/ablations/     queue one: role swap, untrained team, or an agent alone
    POST /api/v1/playground/              play one task with a topology's base models or a checkpoint
    GET  /api/v1/jobs/?kind=&status=      the team's jobs, newest first
    GET  /api/v1/jobs/<id>/               one job: its status, and its result once it has one

Both POSTs answer 202 with the job; poll its `api_url` until `status` is succeeded or failed.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ValidationError
from django.http import HttpResponse, JsonResponse
from django.urls import reverse

from webapp.api.http import (
    ApiError,
    ApiRequest,
    Field,
    absolute,
    endpoint,
    id_field,
    invalid_fields,
    json_body,
    json_fields,
    page_of,
    stamp,
)
from webapp.catalog import environments
from webapp.core.values import ID_MAX
from webapp.jobs import ablations, services
from webapp.models import Checkpoint, Dataset, Job, Run, Topology

EVALUATION_FIELDS = {
    "dataset": id_field("The id of a valid dataset of the team, for the run's environment; its held-out split is played.",
                     required=True),
    "checkpoint_step": Field("integer", "The step of one of the run's checkpoints; null evaluates the base models.",
                             nullable=True, minimum=0, maximum=ID_MAX, strict=True),
}

PLAYGROUND_FIELDS = {
    "topology": id_field("A topology's id: its base models play (give this or run and checkpoint_step).", nullable=True),
    "run": id_field("A run's id: with checkpoint_step, that checkpoint's agents play.", nullable=True),
    "checkpoint_step": Field("integer", "The step of the run's checkpoint.", nullable=True, minimum=0, maximum=ID_MAX, strict=True),
    "task": Field("object", "The task's fields, as a dataset row of the environment (math_tool: question, answer).", required=True),
    "with_base": Field("boolean", "Play the base models beside the checkpoint too."),
    "temperature": Field("number", "0 is greedy (what evaluation uses).", minimum=0.0, maximum=2.0),
    "max_new_tokens": Field("integer", "Per turn; null uses the run's.", nullable=True, minimum=1, maximum=services.PLAYGROUND_MAX_TOKENS),
}

ABLATION_FIELDS = {
    "ablation": Field("string", "role_swap (the agents' trained policies exchanged between roles), untrained (the base weights), "
                                "or alone:<agent> (one agent plays by itself, where the environment allows it).",
                      required=True, max_length=200),
}

JOB_KINDS = tuple(Job.Kind.values)
JOB_STATUSES = tuple(Job.Status.values)


def job_json(request: ApiRequest, job: Job) -> dict[str, Any]:
    return {
        "id": job.pk, "kind": job.kind, "status": job.status,
        "run": job.run_id, "checkpoint_step": (job.params or {}).get("checkpoint_step"),
        "dataset": job.dataset_id, "topology": job.topology_id, "owner": job.owner.username if job.owner else None,
        "created": stamp(job.created), "started": stamp(job.started), "finished": stamp(job.finished),
        "error": job.error, "result": job.result or {},
        "api_url": absolute(request, reverse("api_job", args=[job.pk])),
    }


def _accepted(request: ApiRequest, job: Job) -> JsonResponse:
    response = JsonResponse(job_json(request, job), status=202)
    response["Location"] = absolute(request, reverse("api_job", args=[job.pk]))
    return response


def _checkpoint(run: Run, step: int | None) -> Checkpoint | None:
    if step is None:
        return None
    checkpoint = run.checkpoints.filter(step=step).first()
    if checkpoint is None:
        steps = ", ".join(str(s) for s in run.checkpoints.order_by("step").values_list("step", flat=True)) or "none"
        raise ApiError(400, f"checkpoint_step: run #{run.pk} has no checkpoint at step {step} (its checkpoints: {steps})",
                       fields={"checkpoint_step": [f"Run #{run.pk} has no checkpoint at step {step} (its checkpoints: {steps})."]})
    return checkpoint


def evaluation_launch(request: ApiRequest, run: Run) -> HttpResponse:
    """Queue an evaluation of one of the run's checkpoints (or its base models) on a dataset; every
    problem with the body (types, the dataset, the checkpoint) in one 400."""
    body, problems = json_fields(request, EVALUATION_FIELDS)
    dataset = checkpoint = None
    if "dataset" in body:
        dataset = Dataset.objects.filter(team=request.team, pk=int(body["dataset"])).first()
        if dataset is None:
            problems["dataset"] = ["Not one of your team's datasets."]
        elif dataset.status != Dataset.Status.VALID:
            problems["dataset"] = [f"{dataset.name} is invalid: {dataset.status_message}"]
    if body.get("checkpoint_step") is not None:
        try:
            checkpoint = _checkpoint(run, int(body["checkpoint_step"]))
        except ApiError as exc:
            problems.update(exc.fields)
    if problems or dataset is None:  # (a missing dataset is a problem already: it is required)
        raise invalid_fields(problems)
    job = services.evaluation_request(run=run, user=request.user, dataset=dataset, checkpoint=checkpoint)
    return _accepted(request, job)


def ablation_list(request: ApiRequest, run: Run) -> HttpResponse:
    """The ablations the run allows now and its ablation jobs, newest first."""
    jobs = run.jobs.filter(kind=Job.Kind.EVALUATE, params__has_key="ablation").select_related("owner").order_by("-created", "-pk")
    return JsonResponse({"available": [a.to_dict() for a in ablations.run_ablations(run=run)],
                         "jobs": [{**job_json(request, j), "ablation": j.params["ablation"]} for j in jobs]})


def ablation_launch(request: ApiRequest, run: Run) -> HttpResponse:
    """Queue an ablation of a finished team run; 400 naming why when the run or its environment
    does not allow it. The job is an evaluation; its results carry `ablation`."""
    body = json_body(request, ABLATION_FIELDS)
    try:
        job = ablations.ablation_request(run=run, user=request.user, key=body["ablation"])
    except ValidationError as exc:
        raise invalid_fields({"ablation": exc.messages}) from None
    return _accepted(request, job)


@endpoint("POST")
def playground(request: ApiRequest) -> HttpResponse:
    body = json_body(request, PLAYGROUND_FIELDS)
    topology = checkpoint = None
    if body.get("topology") is not None:
        if body.get("run") is not None:
            raise ApiError(400, "Give a topology, or a run and checkpoint_step, not both.", fields={"run": ["Not with topology."]})
        topology = Topology.objects.filter(team=request.team, pk=int(body["topology"])).first()
        if topology is None:
            raise ApiError(400, "topology: no topology with this id in your team", fields={"topology": ["Not one of your team's topologies."]})
    elif body.get("run") is not None:
        run = Run.objects.filter(team=request.team, pk=int(body["run"])).first()
        if run is None:
            raise ApiError(400, "run: no run with this id in your team", fields={"run": ["Not one of your team's runs."]})
        if body.get("checkpoint_step") is None:
            raise ApiError(400, "checkpoint_step: which of the run's checkpoints plays", fields={"checkpoint_step": ["This field is required with run."]})
        checkpoint = _checkpoint(run, int(body["checkpoint_step"]))
    else:
        raise ApiError(400, "Give a topology, or a run and checkpoint_step.", fields={"topology": ["This field is required without run."]})
    config = services.playground_config(topology=topology, checkpoint=checkpoint)
    env = environments.environment_load(name=config.topology.environment, env_args=config.topology.env_args, args_field="topology")
    values = {k: v if isinstance(v, str) else json.dumps(v) for k, v in body["task"].items()}
    row = services.playground_row(environment_fields=tuple(env.required_fields), values=values)
    max_new_tokens = body.get("max_new_tokens")
    job = services.playground_start(
        team=request.team, user=request.user, row=row, topology=topology, checkpoint=checkpoint,
        with_base=bool(body.get("with_base", False)), temperature=float(body.get("temperature", 0.0)),
        max_new_tokens=None if max_new_tokens is None else int(max_new_tokens),
    )
    return _accepted(request, job)


@endpoint("GET")
def jobs(request: ApiRequest) -> HttpResponse:
    rows = Job.objects.filter(team=request.team).select_related("owner").order_by("-created", "-pk")
    for name, allowed in (("kind", JOB_KINDS), ("status", JOB_STATUSES)):
        value = request.GET.get(name)
        if value:
            if value not in allowed:
                raise ApiError(400, f"{name}: one of {', '.join(allowed)}", fields={name: [f"One of: {', '.join(allowed)}."]})
            rows = rows.filter(**{name: value})
    return page_of(request, rows, job_json)


@endpoint("GET")
def job_detail(request: ApiRequest, pk: int) -> HttpResponse:
    return JsonResponse(job_json(request, Job.objects.select_related("owner").get(pk=pk, team=request.team)))

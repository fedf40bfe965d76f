"""Evaluations, ablations and playground sessions over the JSON API, and the jobs they become.

    GET  POST /api/v1/runs/<id>/evaluations/   the run's held-out evaluations and evaluation jobs; evaluate a checkpoint
    GET  POST /api/v1/runs/<id>/ablations/     the ablations a finished team run allows, and its ablation jobs; queue one
    POST /api/v1/runs/<id>/artifacts/merged/   export an agent of a checkpoint merged into its base model: safetensors or GGUF
    POST /api/v1/playground/                   play one task with a topology's base models or a checkpoint
    GET  /api/v1/jobs/?kind=&status=           the team's jobs, newest first
    GET  /api/v1/jobs/<id>/                    one job: its status, and its result once it has one

The POSTs answer 202 with the job; poll its `api_url` until `status` is succeeded or failed.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal

from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from ninja import Field, Router, Schema, Status

from training.events import summary
from webapp.api.app import Id, In, Page, Paging, Query, answers, body_doc, page_of, read_body
from webapp.api.http import ApiError, absolute, invalid_fields
from webapp.catalog import environments
from webapp.catalog import selectors as catalog
from webapp.core.values import ID_MAX
from webapp.jobs import ablations, services
from webapp.jobs.selectors import team_jobs
from webapp.models import Checkpoint, Dataset, Job, Run
from webapp.runs import selectors
from webapp.runs.selectors import run_jobs, team_run

router = Router(tags=["jobs"])

JobKind = Literal[tuple(Job.Kind.values)]  # type: ignore[valid-type]
JobStatus = Literal[tuple(Job.Status.values)]  # type: ignore[valid-type]


class JobOut(Schema):
    id: int
    kind: JobKind
    status: JobStatus
    run: int | None
    checkpoint_step: int | None
    dataset: int | None
    topology: int | None
    owner: str | None
    created: datetime
    started: datetime | None
    finished: datetime | None
    error: str
    result: dict[str, Any] = Field(description="evaluations, or the playground's lanes and turns")
    api_url: str

    @staticmethod
    def resolve_run(obj: Job) -> int | None:
        return obj.run_id

    @staticmethod
    def resolve_checkpoint_step(obj: Job) -> int | None:
        return (obj.params or {}).get("checkpoint_step")

    @staticmethod
    def resolve_dataset(obj: Job) -> int | None:
        return obj.dataset_id

    @staticmethod
    def resolve_topology(obj: Job) -> int | None:
        return obj.topology_id

    @staticmethod
    def resolve_owner(obj: Job) -> str | None:
        return obj.owner.username if obj.owner else None

    @staticmethod
    def resolve_result(obj: Job) -> dict[str, Any]:
        return obj.result or {}

    @staticmethod
    def resolve_api_url(obj: Job, context: dict[str, Any]) -> str:
        return absolute(context["request"], reverse("api_job", args=[obj.pk]))


def accepted(request: HttpRequest, response: HttpResponse, job: Job) -> Status:
    """202 with the queued job and its URL in `Location`."""
    response["Location"] = absolute(request, reverse("api_job", args=[job.pk]))
    return Status(202, job)


def _checkpoint(run: Run, step: int) -> Checkpoint:
    checkpoint = selectors.run_checkpoint(run=run, step=step)
    if checkpoint is None:
        steps = ", ".join(map(str, selectors.run_checkpoint_steps(run=run))) or "none"
        message = f"run #{run.pk} has no checkpoint at step {step} (its checkpoints: {steps})"
        raise ApiError(400, f"checkpoint_step: {message}", fields={"checkpoint_step": [message[0].upper() + message[1:] + "."]})
    return checkpoint


# == a run's evaluations ===============================================================================


class EvaluationIn(In):
    dataset: Id = Field(description="The id of a valid dataset of the team, for the run's environment; its held-out split is played.")
    checkpoint_step: int | None = Field(None, ge=0, le=ID_MAX, description="The step of one of the run's checkpoints; null "
                                                                          "evaluates the base models.")


class TrainingEvaluation(Schema):
    step: int
    temperature: float
    team_success: float
    agents: dict[str, Any]
    n: int | None


class EvaluationJob(Schema):
    id: int
    status: str
    checkpoint_step: int | None
    dataset: str | None
    ablation: str | None = Field(description="role_swap, untrained or alone:<agent> for an ablation; null otherwise")
    created: datetime
    error: str
    results: list[dict[str, Any]]


class Evaluations(Schema):
    training: list[TrainingEvaluation]
    jobs: list[EvaluationJob]


def evaluations_of(run: Run) -> dict[str, Any]:
    return {
        "training": [{"step": e.step, "temperature": e.temperature, "team_success": e.team_success, "agents": e.agents,
                      "n": (e.data or {}).get("n")} for e in run.evaluations.order_by("step", "temperature")],
        "jobs": [{"id": j.pk, "status": j.status, "checkpoint_step": j.params.get("checkpoint_step"), "dataset": j.params.get("dataset_name"),
                  "ablation": j.params.get("ablation"), "created": j.created, "error": j.error,
                  "results": [summary(r) for r in (j.result or {}).get("evaluations", [])]}
                 for j in run_jobs(run=run, kind=Job.Kind.EVALUATE)],
    }


class EvaluationsOut(Schema):
    results: Evaluations


@router.get("/runs/{int:id}/evaluations/", response=answers({200: EvaluationsOut}, 404), url_name="api_run_evaluations",
            summary="The run's held-out evaluations and evaluation jobs")
def run_evaluations(request: HttpRequest, id: int) -> Any:
    return {"results": evaluations_of(team_run(team=request.team, pk=id))}  # type: ignore[attr-defined]


@router.post("/runs/{int:id}/evaluations/", response=answers({202: JobOut}, 400, 404, 415), openapi_extra=body_doc(EvaluationIn),
             summary="Evaluate a checkpoint (or the base models) on a dataset's held-out split")
def evaluation_launch(request: HttpRequest, response: HttpResponse, id: int) -> Any:
    """Every problem with the body (types, the dataset, the checkpoint) in one 400."""
    run = team_run(team=request.team, pk=id)  # type: ignore[attr-defined]
    body, problems = read_body(request, EvaluationIn)
    dataset = checkpoint = None
    if "dataset" in body:
        dataset = catalog.team_dataset(team=request.team, pk=body["dataset"])  # type: ignore[attr-defined]
        if dataset is None:
            problems["dataset"] = ["Not one of your team's datasets."]
        elif dataset.status != Dataset.Status.VALID:
            problems["dataset"] = [f"{dataset.name} is invalid: {dataset.status_message}"]
    if body.get("checkpoint_step") is not None:
        try:
            checkpoint = _checkpoint(run, body["checkpoint_step"])
        except ApiError as exc:
            problems.update(exc.fields)
    if problems or dataset is None:  # (a missing dataset is a problem already: it is required)
        raise invalid_fields(problems)
    return accepted(request, response, services.evaluation_request(run=run, user=request.user, dataset=dataset, checkpoint=checkpoint))


# == a run's ablations =================================================================================


class AblationIn(In):
    ablation: str = Field(max_length=200, description="role_swap (the agents' trained policies exchanged between roles), untrained "
                                                      "(the base weights), or alone:<agent> (one agent plays by itself, where the "
                                                      "environment allows it).")


class Ablation(Schema):
    kind: Literal["role_swap", "untrained", "alone"]
    agent: str | None
    key: str
    label: str


class AblationJob(JobOut):
    ablation: str

    @staticmethod
    def resolve_ablation(obj: Job) -> str:
        return obj.params["ablation"]


class AblationsOut(Schema):
    available: list[Ablation]
    jobs: list[AblationJob]


@router.get("/runs/{int:id}/ablations/", response=answers({200: AblationsOut}, 404), url_name="api_run_ablations",
            summary="The ablations the finished team run allows now, and its ablation jobs (newest first)")
def run_ablations(request: HttpRequest, id: int) -> Any:
    run = team_run(team=request.team, pk=id)  # type: ignore[attr-defined]
    return {"available": [a.to_dict() for a in ablations.run_ablations(run=run)], "jobs": list(selectors.run_ablation_jobs(run=run))}


@router.post("/runs/{int:id}/ablations/", response=answers({202: JobOut}, 400, 404, 415), openapi_extra=body_doc(AblationIn),
             summary="Evaluate the run's team with its roles swapped, untrained, or one agent alone, on its held-out tasks "
                     "(an evaluation job; each result carries `ablation`)")
def ablation_launch(request: HttpRequest, response: HttpResponse, id: int) -> Any:
    """400 naming why when the run or its environment does not allow it (another team's run is a
    404 whatever the body)."""
    run = team_run(team=request.team, pk=id)  # type: ignore[attr-defined]
    body, problems = read_body(request, AblationIn)
    if problems:
        raise invalid_fields(problems)
    try:
        job = ablations.ablation_request(run=run, user=request.user, key=body["ablation"])
    except ValidationError as exc:
        raise invalid_fields({"ablation": exc.messages}) from None
    return accepted(request, response, job)


# == a run's merged exports ===========================================================================


class ExportIn(In):
    checkpoint_step: int = Field(ge=0, le=ID_MAX, description="The step of one of the run's checkpoints.")
    agent: str = Field(max_length=200, description="The checkpoint's policy (a LoRA adapter) to merge into its base model.")
    format: Literal["safetensors", "gguf"] = Field("safetensors", description="safetensors (a Hugging Face folder), or gguf (one "
                                                                              "file for llama.cpp and Ollama, with a Modelfile).")
    dtype: Literal[tuple(services.MERGE_DTYPES)] = Field("bfloat16", description="safetensors: bfloat16, or trained (the dtype it "  # type: ignore[valid-type]
                                                                                 "was trained in).")
    gguf_type: Literal[tuple(services.GGUF_TYPES)] = Field("q8_0", description="gguf: q8_0 (about half of f16's size) or f16.")  # type: ignore[valid-type]

    model_config = {**In.model_config, "json_schema_extra": {"examples": [{"checkpoint_step": 10, "agent": "solver", "format": "gguf"}]}}


@router.post("/runs/{int:id}/artifacts/merged/", response=answers({202: JobOut}, 400, 404, 415), openapi_extra=body_doc(ExportIn),
             url_name="api_run_export", summary="Merge an agent's adapter at a checkpoint into its base model (the run page's Merge): "
                                                "safetensors or GGUF; the same export again while it is queued, running or kept")
def run_export(request: HttpRequest, response: HttpResponse, id: int) -> Any:
    run = team_run(team=request.team, pk=id)  # type: ignore[attr-defined]
    body, problems = read_body(request, ExportIn)
    checkpoint = None
    if "checkpoint_step" in body:
        try:
            checkpoint = _checkpoint(run, body["checkpoint_step"])
        except ApiError as exc:
            problems.update(exc.fields)
    if problems or checkpoint is None:
        raise invalid_fields(problems)
    if body.get("format") == "gguf":
        job = services.gguf_request(run=run, user=request.user, checkpoint=checkpoint, agent=body["agent"],
                                    gguf_type=body.get("gguf_type", "q8_0"))
    else:
        job = services.merge_request(run=run, user=request.user, checkpoint=checkpoint, agent=body["agent"],
                                     dtype=body.get("dtype", "bfloat16"))
    return accepted(request, response, job)  # (a ValidationError of the service, e.g. a full model's agent: a 400 naming the field)


# == the playground ====================================================================================


class PlaygroundIn(In):
    topology: Id | None = Field(None, description="A topology's id: its base models play (give this or run and checkpoint_step).")
    run: Id | None = Field(None, description="A run's id: with checkpoint_step, that checkpoint's agents play.")
    checkpoint_step: int | None = Field(None, ge=0, le=ID_MAX, description="The step of the run's checkpoint.")
    task: dict[str, Any] = Field(description="The task's fields, as a dataset row of the environment (math_tool: question, answer).")
    with_base: bool = Field(False, description="Play the base models beside the checkpoint too.")
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="0 is greedy (what evaluation uses).")
    max_new_tokens: int | None = Field(None, ge=1, le=services.PLAYGROUND_MAX_TOKENS, description="Per turn; null uses the run's.")

    model_config = {**In.model_config, "json_schema_extra": {"examples": [{"topology": 1, "task": {"question": "What is 6*7?", "answer": "42"}}]}}


@router.post("/playground/", response=answers({202: JobOut}, 400, 415), url_name="api_playground",
             summary="Play one task with a topology's base models, or with a run's checkpoint")
def playground(request: HttpRequest, response: HttpResponse, body: PlaygroundIn) -> Any:
    team = request.team  # type: ignore[attr-defined]
    topology = checkpoint = None
    if body.topology is not None:
        if body.run is not None:
            raise ApiError(400, "Give a topology, or a run and checkpoint_step, not both.", fields={"run": ["Not with topology."]})
        topology = catalog.team_topology(team=team, pk=body.topology)
        if topology is None:
            raise ApiError(400, "topology: no topology with this id in your team", fields={"topology": ["Not one of your team's topologies."]})
    elif body.run is not None:
        try:
            run = team_run(team=team, pk=body.run)
        except Run.DoesNotExist:
            raise ApiError(400, "run: no run with this id in your team", fields={"run": ["Not one of your team's runs."]}) from None
        if body.checkpoint_step is None:
            raise ApiError(400, "checkpoint_step: which of the run's checkpoints plays", fields={"checkpoint_step": ["This field is required with run."]})
        checkpoint = _checkpoint(run, body.checkpoint_step)
    else:
        raise ApiError(400, "Give a topology, or a run and checkpoint_step.", fields={"topology": ["This field is required without run."]})
    config = services.playground_config(topology=topology, checkpoint=checkpoint)
    env = environments.environment_load(name=config.topology.environment, env_args=config.topology.env_args, args_field="topology")
    values = {k: v if isinstance(v, str) else json.dumps(v) for k, v in body.task.items()}
    job = services.playground_start(
        team=team, user=request.user, row=services.playground_row(environment_fields=tuple(env.required_fields), values=values),
        topology=topology, checkpoint=checkpoint, with_base=body.with_base, temperature=body.temperature,
        max_new_tokens=body.max_new_tokens,
    )
    return accepted(request, response, job)


# == jobs ==============================================================================================


class JobQuery(Paging):
    kind: JobKind | None = Field(None, description="Only this kind.")
    status: JobStatus | None = Field(None, description="Only this status.")


@router.get("/jobs/", response=answers({200: Page[JobOut]}, 400, 404), url_name="api_jobs",
            summary="The team's evaluation, export and playground jobs, newest first")
def jobs(request: HttpRequest, query: Query[JobQuery]) -> Any:
    return page_of(request, team_jobs(team=request.team, kind=query.kind, status=query.status), query)  # type: ignore[attr-defined]


@router.get("/jobs/{int:id}/", response=answers({200: JobOut}, 404), url_name="api_job", summary="One job; poll it until it has finished")
def job_detail(request: HttpRequest, id: int) -> Any:
    return team_jobs(team=request.team).get(pk=id)  # type: ignore[attr-defined]

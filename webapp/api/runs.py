"""The runs API under /api/v1/runs/, and the API's index: `Authorization: Bearer <token>`.

The API is for notebooks and scripts. Tokens are personal, belong to one team, and are created
and revoked on the API tokens page. Only the bearer token authenticates (a browser session does
not, so no CSRF exposure); everything is scoped to the token's team: another team's run is a 404,
as on the pages. The catalog, jobs and experiments have their modules beside this one.

    GET  /api/v1/                                   who am I, and the endpoints
    GET  /api/v1/runs/?status=&tag=&q=&sort=&page=  runs, filtered like the run list
    POST /api/v1/runs/preview/                      the same body: a launch's dry run (resolved config, duration estimate)
    POST /api/v1/runs/                              launch: a YAML config (body), or JSON {config, topology, dataset, conversations, start_from, name, tags, notes}
    GET  /api/v1/runs/<id>/                         one run: config, final metrics, evaluations, artifacts
    PATCH /api/v1/runs/<id>/                        tags, notes, archived (as the run page's actions)
    POST /api/v1/runs/<id>/cancel/
    POST /api/v1/runs/<id>/resume/                  a new run from a failed or cancelled run's latest checkpoint
    POST /api/v1/runs/<id>/queue/                   {"direction": "up"|"down"}: move a queued run among its team's (team admins)
    GET  POST /api/v1/runs/<id>/warm-start/         the SFT set a finished run's best episodes give; an SFT run on it
    GET  /api/v1/runs/<id>/metrics/?after=&limit=   metric points by step (paginated)
    GET  /api/v1/runs/<id>/rollouts/?after=&limit=&step=   episodes (paginated)
    GET  /api/v1/runs/<id>/artifacts/<file>         config.yaml, metrics.csv, metrics.jsonl, rollouts.jsonl,
                                                    checkpoints/<step>/<agent>.zip, merged/<job>.zip
(a run's evaluations and ablations are in `jobs.py`.)
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from django.core.exceptions import PermissionDenied, RequestDataTooBig, ValidationError
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from ninja import Field, Query, Router, Schema, Status

from training.config import ConfigError
from webapp.api.app import Id, In, Page, Paging, answers, body_doc, page_of, read_body
from webapp.api.http import PER_PAGE_MAX, ApiError, absolute, invalid_fields
from webapp.api.jobs import Evaluations, evaluations_of
from webapp.artifacts import files as artifacts
from webapp.artifacts import services as artifact_services
from webapp.artifacts.downloads import checkpoint_download, merged_download, run_file_download
from webapp.catalog import selectors as catalog
from webapp.core import trust
from webapp.core.console import printable
from webapp.core.values import ID_MAX
from webapp.history import selectors as history
from webapp.history import services as history_services
from webapp.models import Dataset, Job, Membership, Run
from webapp.runs import estimates, lineage, queue, selectors, warmstart
from webapp.runs import services as run_services

router = Router(tags=["runs"])

METRICS_LIMIT_MAX = 1000
ROLLOUTS_LIMIT_MAX = 100
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")  # (text/plain is a 415: it says nothing of YAML)
START_FROM_KEYS = frozenset({"run", "step", "agents"})


class Named(Schema):
    id: int
    name: str


class RunOut(Schema):
    id: int
    name: str
    status: Literal[tuple(Run.Status.values)]  # type: ignore[valid-type]
    step: int
    total_steps: int
    environment: str
    specialization: str
    algorithm: Literal["grpo", "sft"]
    topology: Named | None
    dataset: Named | None
    owner: str | None
    tags: list[str]
    notes: str
    archived: bool
    created: datetime
    started: datetime | None
    finished: datetime | None
    final_metrics: dict[str, Any]
    error: str
    resumed_from: int | None
    url: str
    api_url: str

    @staticmethod
    def resolve_owner(obj: Run) -> str | None:
        return obj.owner.username if obj.owner else None

    @staticmethod
    def resolve_tags(obj: Run) -> list[str]:
        return [t.name for t in obj.tags.all()]

    @staticmethod
    def resolve_final_metrics(obj: Run) -> dict[str, Any]:
        return obj.final_metrics or {}

    @staticmethod
    def resolve_error(obj: Run) -> str:
        return obj.error_message

    @staticmethod
    def resolve_resumed_from(obj: Run) -> int | None:
        return obj.resumed_from_id

    @staticmethod
    def resolve_url(obj: Run, context: dict[str, Any]) -> str:
        return absolute(context["request"], obj.get_absolute_url())

    @staticmethod
    def resolve_api_url(obj: Run, context: dict[str, Any]) -> str:
        return absolute(context["request"], reverse("api_run", args=[obj.pk]))


class StartedFrom(Schema):
    run: int | None = Field(description="null: the checkpoint is no longer one of the team's")
    step: int


class Artifacts(Schema):
    files: dict[str, str]
    checkpoints: list[dict[str, Any]]
    merged: list[dict[str, Any]]


class RunDetail(RunOut):
    config_yaml: str
    phase: str = Field(description="What a running run is doing: loading, training, evaluating, checkpointing, ... (empty otherwise).")
    phase_detail: str = Field(description="The engine's sentence about it, e.g. 'Evaluating at step 10: 50/100 held-out tasks'.")
    phase_progress: float | None = Field(description="Share of the phase done (0..1), when the engine knows.")
    eta: datetime | None = Field(description="When the engine expects the run to finish.")
    eta_seconds: float | None = Field(description="Seconds from now to `eta`.")
    queue_position: int | None = Field(description="A queued run's place in the shared queue (1: next to start); null otherwise.")
    waiting_for: str = Field(description="What a queued run waits for, in a sentence (its place and the workers serving its queue).")
    evaluations: Evaluations
    started_from: StartedFrom | None
    warm_started: list[int] = Field(description="Runs started from one of this run's checkpoints.")
    artifacts: Artifacts

    @staticmethod
    def resolve_phase_progress(obj: Run) -> float | None:
        return obj.phase_progress

    @staticmethod
    def resolve_eta_seconds(obj: Run) -> float | None:
        return obj.eta_seconds()

    @staticmethod
    def resolve_queue_position(obj: Run) -> int | None:
        return queue.run_queue_position(run=obj)

    @staticmethod
    def resolve_waiting_for(obj: Run) -> str:
        return queue.run_waiting_for(run=obj)

    @staticmethod
    def resolve_evaluations(obj: Run) -> dict[str, Any]:
        return evaluations_of(obj)

    @staticmethod
    def resolve_started_from(obj: Run) -> dict[str, Any] | None:
        origin = lineage.run_origin(run=obj)
        return {"run": origin.run.pk if origin.run else None, "step": origin.step} if origin else None

    @staticmethod
    def resolve_warm_started(obj: Run) -> list[int]:
        return [child.pk for child in lineage.run_descendants(run=obj)]

    @staticmethod
    def resolve_artifacts(obj: Run, context: dict[str, Any]) -> dict[str, Any]:
        request = context["request"]

        def url(name: str, *args: Any) -> str:
            return absolute(request, reverse(name, args=[obj.pk, *args]))

        return {
            "files": {name: url("api_run_file", name) for name in ("config.yaml", "metrics.csv", "metrics.jsonl", "rollouts.jsonl")},
            "checkpoints": [{"step": c.checkpoint.step, "on_disk": c.on_disk,
                             "policies": [{"name": p.name, "kind": p.kind, "bytes": p.size,
                                           "url": url("api_checkpoint_download", c.checkpoint.step, p.name)} for p in c.policies]}
                            for c in artifacts.run_artifacts(run=obj)],
            "merged": [{"job": j.pk, "agent": j.params.get("agent"), "checkpoint_step": j.params.get("checkpoint_step"), "status": j.status,
                        "url": url("api_merged_download", j.pk) if j.status == Job.Status.SUCCEEDED and j.output else None}
                       for j in selectors.run_jobs(run=obj, kind=Job.Kind.MERGE)],
        }


def _run(request: HttpRequest, pk: int) -> Run:
    return selectors.team_run(team=request.team, pk=pk)  # type: ignore[attr-defined]


# == the index =========================================================================================


@router.get("/", response=answers({200: dict[str, Any]}), url_name="api_index",
            summary="Who the token is: user, team, and the endpoints")
def index(request: HttpRequest) -> Any:
    token = request.api_token  # type: ignore[attr-defined]
    return {
        "user": request.user.username, "team": {"id": token.team.pk, "name": token.team.name},
        "token": {"name": token.name, "prefix": token.prefix},
        **{name: absolute(request, reverse(f"api_{name}"))
           for name in ("runs", "models", "agents", "topologies", "datasets", "graders", "tasks", "experiments", "jobs",
                                                               "playground")},
        "openapi": absolute(request, reverse("api_openapi")),
    }


# == listing and launching =============================================================================


def _filter(description: str) -> Any:
    return Field(None, description=f"{description} (as on the run list: a value it does not know is ignored, text past 200 "
                                   "characters is cut)")


class RunQuery(Paging):
    q: str | None = _filter("Text in the name, notes or tags")
    status: str | None = _filter("A run status")
    tag: str | None = _filter("A tag")
    topology: str | None = _filter("A topology's id")
    dataset: str | None = _filter("A dataset's id")
    owner: str | None = _filter("A user's id")
    environment: str | None = _filter("An environment")
    specialization: str | None = _filter("A specialization")
    created_from: str | None = _filter("Created on or after this day (YYYY-MM-DD)")
    created_to: str | None = _filter("Created on or before this day (YYYY-MM-DD)")
    sort: str | None = _filter("created, -created, name, status, or a final metric, e.g. -eval/team_success")
    archived: str | None = _filter("`all` or `only`")
    per_page: int = Field(25, ge=1, le=PER_PAGE_MAX, description="Results per page (default 25).")


@router.get("/runs/", response=answers({200: Page[RunOut]}, 400, 404), url_name="api_runs",
            summary="The team's runs, filtered and sorted like the run list")
def runs(request: HttpRequest, query: Query[RunQuery]) -> Any:
    filters = history.RunFilter.from_query(request.GET)
    if filters.problems:
        raise invalid_fields({name: [problem] for name, problem in filters.problems})
    return page_of(request, history.run_search(team=request.team, filters=filters), query)  # type: ignore[attr-defined]


class LaunchIn(In):
    config: str | dict[str, Any] = Field({}, description="The run config: YAML text, or the same sections as an object (with a "
                                         "topology: the other sections, e.g. optim, grpo, generation; empty: the defaults).")
    topology: Id | None = Field(None, description="A topology of the team: it gives the model and topology sections (and the "
                                                  "name, unless given).")
    name: str = Field("", max_length=200, description="The run's name (default: the config's).")
    dataset: Id | None = Field(None, description="A dataset of the team: the run trains on it.")
    conversations: Id | None = Field(None, description="A conversations dataset of the team: the run is supervised fine-tuning on "
                                                       "it (algorithm sft).")
    start_from: dict[str, Any] | None = Field(None, description='Start from a finished run\'s weights (model.init_from): {"run": id, '
                                              '"step": its checkpoint\'s step (absent or 0: the last), "agents": {policy: the '
                                              "checkpoint's folder}}.")
    tags: list[str] | str = Field([], description="Tags: a list, or one comma-separated string.")
    notes: str = Field("", description="Free text shown on the run page.")

    model_config = {**In.model_config, "json_schema_extra": {"examples": [
        {"topology": 1, "dataset": 1, "tags": ["api"], "config": {"optim": {"steps": 2, "tasks_per_step": 2}, "grpo": {"k": 2}}}]}}


class LaunchQuery(Schema):
    dataset: Id | None = Field(None, description="A dataset of the team (YAML bodies).")
    topology: Id | None = Field(None, description="A topology of the team: its model and agents (YAML bodies).")


LAUNCH_BODY = body_doc(LaunchIn, **{"application/yaml": {"schema": {
    "type": "object", "description": "The run config: a YAML mapping of its sections (model, topology, data, grpo, optim, ...)."}}})


@router.post("/runs/", response=answers({201: RunOut}, 400, 413, 415), openapi_extra=LAUNCH_BODY,
             summary="Launch a run: a YAML config as the body, or JSON {config, topology, dataset, name, tags, notes}")
def run_launch(request: HttpRequest, response: HttpResponse, query: Query[LaunchQuery]) -> Any:
    """Parse (YAML or JSON), one service call, the queued run."""
    launch, parts = _launch_parts(request, query)
    run = run_services.run_launch(team=request.team, user=request.user, tree=launch.tree, name=launch.name, notes=launch.notes,  # type: ignore[attr-defined]
                                  tags=", ".join(launch.tags) if isinstance(launch.tags, list) else launch.tags, **parts)
    response["Location"] = absolute(request, reverse("api_run", args=[run.pk]))
    return Status(201, run)


class RunPreview(Schema):
    name: str
    config_yaml: str = Field(description="The config as the run would be launched with it, every default filled in.")
    steps: int
    estimate_seconds: float | None = Field(description="Roughly how long it takes at the team's recent seconds per step on this "
                                                       "environment; null without recent runs.")


@router.post("/runs/preview/", response=answers({200: RunPreview}, 400, 413, 415), openapi_extra=LAUNCH_BODY, url_name="api_run_preview",
             summary="A launch's dry run (the run form's preview): the resolved config and roughly how long it takes, or every "
                     "problem with it; nothing is saved")
def run_preview(request: HttpRequest, query: Query[LaunchQuery]) -> Any:
    launch, parts = _launch_parts(request, query)
    config = run_services.run_config_build(team=request.team, tree=launch.tree, name=launch.name, **parts)  # type: ignore[attr-defined]
    estimate = estimates.run_estimate(team=request.team, config=config)  # type: ignore[attr-defined]
    return {"name": config.name, "config_yaml": config.to_yaml(), "steps": config.optim.steps,
            "estimate_seconds": estimate.total_seconds() if estimate is not None else None}


def _launch_parts(request: HttpRequest, query: LaunchQuery) -> tuple[_Launch, dict[str, Any]]:
    """The launch as sent, and its topology, dataset and overrides (conversations, start_from) as
    `run_config_build` takes them; a 400 naming every object that is not the team's."""
    launch = _launch_request(request, query)
    team = request.team  # type: ignore[attr-defined]
    problems: dict[str, list[str]] = {}
    topology = dataset = conversations = None
    if launch.dataset is not None and (dataset := catalog.team_dataset(team=team, pk=launch.dataset)) is None:
        problems["dataset"] = ["no dataset with this id in your team"]
    if launch.topology is not None and (topology := catalog.team_topology(team=team, pk=launch.topology)) is None:
        problems["topology"] = ["no topology with this id in your team"]
    if launch.conversations is not None and (
            conversations := catalog.team_dataset(team=team, pk=launch.conversations, kind=Dataset.Kind.CHATS)) is None:
        problems["conversations"] = ["no conversations dataset with this id in your team"]
    if problems:
        raise invalid_fields(problems)
    return launch, {"dataset": dataset, "topology": topology, "overrides": _source_overrides(request, conversations, launch.start_from)}


class _Launch(LaunchIn):
    tree: dict[str, Any]


def _launch_request(request: HttpRequest, query: LaunchQuery) -> _Launch:
    """The launch as sent: a JSON body, or a YAML config with its options in the query."""
    try:
        body = request.body
    except RequestDataTooBig:
        raise ApiError(413, f"The request body is too large; a run config may be at most {trust.MAX_CONFIG_BYTES:,} bytes.") from None
    content_type = request.content_type or ""
    options: dict[str, Any] = query.model_dump(exclude_none=True)
    if content_type == "application/json":
        sent, problems = read_body(request, LaunchIn)
        if problems:
            raise invalid_fields(problems)
        launch = LaunchIn.model_validate({**options, **sent})
        config = launch.config
        tree = trust.yaml_load(config, field="config") if isinstance(config, str) else config
    elif content_type in YAML_TYPES or not content_type:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ApiError(400, f"body: not valid UTF-8 (byte {exc.start})", fields={"body": [f"Not valid UTF-8 (byte {exc.start})."]}) from None
        launch, tree = LaunchIn.model_validate(options), trust.yaml_load(text, field="yaml")
    else:
        raise ApiError(415, f"Send the config as YAML ({YAML_TYPES[0]}) or JSON (application/json), not {content_type}.")
    if not isinstance(tree, dict):
        raise ConfigError("config", "the config must be a YAML mapping of sections (model, topology, data, grpo, ...)")
    return _Launch(**launch.model_dump(), tree=tree)


def _source_overrides(request: Any, conversations: Dataset | None, start: dict[str, Any] | None) -> dict[str, Any]:
    """`conversations` and `start_from` of a launch as config fields (`run_services.run_source_overrides`)."""
    if start is None:
        return run_services.run_source_overrides(team=request.team, conversations=conversations)
    unknown = sorted(set(start) - START_FROM_KEYS)
    if unknown:  # a misspelt `step` would otherwise start from the last checkpoint, silently
        raise ValidationError({"start_from": f"unknown key '{printable(unknown[0], limit=60)}'; allowed: {', '.join(sorted(START_FROM_KEYS))}"})
    run_id, step, agents = start.get("run"), start.get("step") or 0, start.get("agents") or {}
    if not isinstance(run_id, int) or isinstance(run_id, bool) or not 1 <= run_id <= ID_MAX or not isinstance(step, int) or step < 0:
        raise ValidationError({"start_from": "give {\"run\": a run id, \"step\": a checkpoint step (optional)}"})
    if not isinstance(agents, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in agents.items()):
        raise ValidationError({"start_from": "`agents` maps each policy to a folder name: {\"solver\": \"writer\"}"})
    checkpoint = run_services.run_checkpoint_pick(team=request.team, run_id=run_id, step=step)
    return run_services.run_source_overrides(team=request.team, conversations=conversations, start_from=checkpoint, agents=agents)


# == one run ===========================================================================================


@router.get("/runs/{int:id}/", response=answers({200: RunDetail}, 404), url_name="api_run",
            summary="One run, with its config, evaluations and artifacts")
def run_detail(request: HttpRequest, id: int) -> Any:
    return _run(request, id)


@router.post("/runs/{int:id}/cancel/", response=answers({200: RunOut}, 404), url_name="api_run_cancel",
             summary="Cancel a queued or running run (a finished one is left as it is)")
def run_cancel(request: HttpRequest, id: int) -> Any:
    return run_services.run_cancel(run=_run(request, id), actor=request.user)


class RunChange(In):
    tags: list[str] | str = Field(description="The run's tags (replacing them): a list, or one comma-separated string.")
    notes: str = Field(description="Free text shown on the run page.")
    archived: bool = Field(description="Hidden from the run list (a queued or running run cannot be).")

    model_config = {**In.model_config, "json_schema_extra": {"examples": [{"tags": ["baseline"], "notes": "the good one"}]}}


@router.patch("/runs/{int:id}/", response=answers({200: RunOut}, 400, 404, 415), openapi_extra=body_doc(RunChange, partial=True),
              summary="Change a run's tags, notes or archived flag: only the fields given (the run page's tag, notes and archive "
                      "actions)")
def run_change(request: HttpRequest, id: int) -> Any:
    run = _run(request, id)
    body, problems = read_body(request, RunChange, partial=True)
    if problems:
        raise invalid_fields(problems)
    with transaction.atomic():  # all of it or nothing
        if "tags" in body:
            tags = body["tags"]
            history_services.run_tags_set(run=run, text=", ".join(tags) if isinstance(tags, list) else tags)
        if "notes" in body:
            history_services.run_notes_set(run=run, notes=body["notes"])
        if "archived" in body:
            history_services.run_archive(run=run, archived=body["archived"])
    return _run(request, id)


@router.post("/runs/{int:id}/resume/", response=answers({201: RunOut}, 400, 404), url_name="api_run_resume",
             summary="Resume a failed or cancelled run from its latest checkpoint: a new run (the run page's Resume); while that "
                     "resume is queued or running, the same one again")
def run_resume(request: HttpRequest, response: HttpResponse, id: int) -> Any:
    new = run_services.run_resume(run=_run(request, id), user=request.user)
    response["Location"] = absolute(request, reverse("api_run", args=[new.pk]))
    return Status(201, _run(request, new.pk))


class QueueMove(In):
    direction: Literal["up", "down"] = Field(description="up: one place ahead of the team's previous queued run; down: behind its next.")


@router.post("/runs/{int:id}/queue/", response=answers({200: RunDetail}, 400, 403, 404, 415), openapi_extra=body_doc(QueueMove),
             url_name="api_run_queue_move", summary="Move a queued run up or down among its team's queued runs (the run page's "
                                                    "arrows; team admins and staff): other teams' runs keep their places")
def run_queue_move(request: HttpRequest, id: int) -> Any:
    run = _run(request, id)
    body, problems = read_body(request, QueueMove)
    if problems:
        raise invalid_fields(problems)
    try:
        queue.run_queue_move(run=run, user=request.user, direction=body["direction"])
    except PermissionDenied as exc:
        raise ApiError(403, str(exc)) from None
    return _run(request, id)


class WarmStartQuery(Schema):
    threshold: float | None = Field(None, description="null: the episodes that succeeded; 0..1: those whose team reward reaches it.")


class WarmStartSet(Schema):
    rule: str = Field(description="Which episodes: succeeded, or team reward ≥ threshold.")
    stored: int = Field(description="Episodes the run stored.")
    episodes: int = Field(description="Of them, those that qualify.")
    counts: dict[str, int] = Field(description="Agent -> its examples.")
    duplicates: int = Field(description="Chosen candidates left out as identical to an earlier one.")
    left_out: int = Field(description="Rows past the upload limits (the oldest episodes').")
    truncated: int = Field(description="Chosen candidates left out because the length cap cut them.")
    samples: dict[str, list[dict[str, str]]] = Field(description="A few examples per agent, shortened: the prompt's end, the completion.")
    checkpoints: list[int] = Field(description="The steps of the run's kept checkpoints an SFT run may start from.")


def _warm_set(run: Run, threshold: float | None) -> dict[str, Any]:
    try:
        episodes = warmstart.warm_start_set(run=run, threshold=threshold)
    except ValidationError as exc:
        raise ApiError(400, " ".join(exc.messages), fields=exc.message_dict if hasattr(exc, "error_dict") else {"run": exc.messages}) from None
    return {"rule": episodes.rule, "stored": episodes.stored, "episodes": episodes.episodes, "counts": episodes.counts,
            "duplicates": episodes.duplicates, "left_out": episodes.left_out, "truncated": episodes.truncated,
            "samples": episodes.samples(), "checkpoints": [c.step for c in warmstart.warm_start_checkpoints(run=run)]}


@router.get("/runs/{int:id}/warm-start/", response=answers({200: WarmStartSet}, 400, 404), url_name="api_run_warm_start",
            summary="What a warm start from this finished run learns from: its best episodes as an SFT set (the Warm start page's preview)")
def run_warm_start_set(request: HttpRequest, id: int, query: Query[WarmStartQuery]) -> Any:
    return _warm_set(_run(request, id), query.threshold)


class WarmStartIn(In):
    threshold: float | None = Field(None, description="null: the episodes that succeeded; 0..1: those whose team reward reaches it.")
    start_from: int | None = Field(None, ge=0, le=ID_MAX, description="The step of one of the run's kept checkpoints; null: the "
                                                                     "weights the run itself started from.")
    steps: int = Field(20, ge=1, le=100_000, description="SFT steps.")
    batch_size: int = Field(8, ge=1, le=4096, description="Examples per step for each trained policy.")
    lr: float | None = Field(None, gt=0, description="Learning rate; null: the run's own.")
    name: str = Field("", max_length=200, description="Default: the run's name · SFT on its episodes.")

    model_config = {**In.model_config, "json_schema_extra": {"examples": [{"threshold": 0.5, "steps": 20}]}}


@router.post("/runs/{int:id}/warm-start/", response=answers({201: RunOut}, 400, 404, 415), openapi_extra=body_doc(WarmStartIn),
             summary="Warm start from this run: its best episodes stored as a conversations dataset and an SFT run queued on them "
                     "(the same run again while one with these settings is queued or running)")
def run_warm_start(request: HttpRequest, response: HttpResponse, id: int) -> Any:
    run = _run(request, id)
    body, problems = read_body(request, WarmStartIn)
    start_from = None
    if body.get("start_from") is not None:
        kept = {c.step: c for c in warmstart.warm_start_checkpoints(run=run)}
        start_from = kept.get(body["start_from"])
        if start_from is None:
            problems["start_from"] = [f"Not a kept checkpoint of run #{run.pk} (its steps: {', '.join(map(str, kept)) or 'none'})."]
    if problems:
        raise invalid_fields(problems)
    new = warmstart.warm_start_launch(run=run, user=request.user, start_from=start_from,
                                      **{k: v for k, v in body.items() if k != "start_from"})  # ValidationError, ConfigError: 400
    response["Location"] = absolute(request, reverse("api_run", args=[new.pk]))
    return Status(201, _run(request, new.pk))


class MetricPoint(Schema):
    step: int
    time: datetime
    values: dict[str, Any]
    agents: dict[str, Any]


class Points(Schema):
    results: list[MetricPoint]
    next: str | None


class MetricsQuery(Schema):
    after: int = Field(-1, ge=-1, description="Only steps after this one.")
    limit: int = Field(500, ge=1, le=METRICS_LIMIT_MAX, description="At most this many (500).")


@router.get("/runs/{int:id}/metrics/", response=answers({200: Points}, 400, 404), url_name="api_run_metrics",
            summary="Metric points with step > after, in step order")
def run_metrics(request: HttpRequest, id: int, query: Query[MetricsQuery]) -> Any:
    run = _run(request, id)
    rows = selectors.run_metric_points(run=run, after=query.after, limit=query.limit)
    more, rows = len(rows) > query.limit, rows[: query.limit]
    base = reverse("api_run_metrics", args=[run.pk])
    return {"results": [{"step": s, "time": t, "values": v, "agents": a} for s, t, v, a in rows],
            "next": absolute(request, f"{base}?after={rows[-1][0]}&limit={query.limit}") if more else None}


class Episode(Schema):
    id: int
    step: int
    episode: int
    success: bool
    team_reward: float
    data: dict[str, Any]


class Episodes(Schema):
    results: list[Episode]
    next: str | None


class RolloutsQuery(Schema):
    after: int = Field(0, ge=0, description="Only episodes after this id.")
    limit: int = Field(20, ge=1, le=ROLLOUTS_LIMIT_MAX, description="At most this many (20).")
    step: int | None = Field(None, ge=0, description="Only this training step.")


@router.get("/runs/{int:id}/rollouts/", response=answers({200: Episodes}, 400, 404), url_name="api_run_rollouts",
            summary="Episodes with id > after, in recording order")
def run_rollouts(request: HttpRequest, id: int, query: Query[RolloutsQuery]) -> Any:
    run = _run(request, id)
    page = selectors.run_rollout_rows(run=run, after=query.after, limit=query.limit, step=query.step)
    more, page = len(page) > query.limit, page[: query.limit]
    base = reverse("api_run_rollouts", args=[run.pk])
    extra = f"&step={query.step}" if query.step is not None else ""
    return {"results": [{"id": i, "step": s, "episode": e, "success": ok, "team_reward": r, "data": d} for i, s, e, ok, r, d in page],
            "next": absolute(request, f"{base}?after={page[-1][0]}&limit={query.limit}{extra}") if more else None}


# == files =============================================================================================


def _file(description: str, *media: str) -> dict[str, Any]:
    return {"responses": {200: {"description": description, "content": {m: {"schema": {"type": "string", "format": "binary"}}
                                                                         for m in media}}}}


@router.get("/runs/{int:id}/artifacts/checkpoints/{int:step}/{str:name}.zip", response=answers({}, 404),
            url_name="api_checkpoint_download", summary="One policy of a checkpoint, zipped",
            openapi_extra=_file("A zip", "application/zip"))
def checkpoint_file(request: HttpRequest, id: int, step: int, name: str) -> HttpResponse:
    run = _run(request, id)
    return checkpoint_download(request, run=run, checkpoint=selectors.run_checkpoint(run=run, step=step), name=name)


@router.get("/runs/{int:id}/artifacts/merged/{int:job}.zip", response=answers({}, 404), url_name="api_merged_download",
            summary="A merged export, zipped", openapi_extra=_file("A zip", "application/zip"))
def merged_file(request: HttpRequest, id: int, job: int) -> HttpResponse:
    return merged_download(request, job=selectors.run_jobs(run=_run(request, id), kind=Job.Kind.MERGE).get(pk=job))


def _team_admin(request: HttpRequest) -> None:
    """Deleting files is a team admin's (or site staff's), as on the pages."""
    user = request.user
    if not (user.is_staff or Membership.objects.filter(team=request.team, user=user, role=Membership.Role.ADMIN).exists()):  # type: ignore[attr-defined]
        raise ApiError(403, "Only a team admin can delete checkpoints and exports.")


@router.delete("/runs/{int:id}/artifacts/checkpoints/{int:step}/", response=answers({204: None}, 400, 403, 404),
               url_name="api_checkpoint_delete", summary="Delete one of a finished run's older checkpoints from disk (team admins; "
                                                         "400 naming what still needs it, e.g. a run started from it)")
def checkpoint_delete(request: HttpRequest, id: int, step: int) -> Any:
    run = _run(request, id)
    checkpoint = selectors.run_checkpoint(run=run, step=step)
    if checkpoint is None:
        raise ApiError(404, f"Run #{run.pk} has no checkpoint at step {step}.")
    _team_admin(request)
    artifact_services.checkpoint_delete(checkpoint=checkpoint, actor=request.user)  # ValidationError: 400 with why
    return Status(204, None)


@router.delete("/runs/{int:id}/artifacts/merged/{int:job}/", response=answers({204: None}, 400, 403, 404), url_name="api_export_delete",
               summary="Delete a finished merged export's files (team admins); the job stays, marked deleted")
def export_delete(request: HttpRequest, id: int, job: int) -> Any:
    export = selectors.run_jobs(run=_run(request, id), kind=Job.Kind.MERGE).get(pk=job)
    _team_admin(request)
    artifact_services.export_delete(job=export, actor=request.user)
    return Status(204, None)


@router.get("/runs/{int:id}/artifacts/{str:name}", response=answers({}, 404), url_name="api_run_file",
            summary="One of the run's files: config.yaml, metrics.csv, metrics.jsonl or rollouts.jsonl",
            openapi_extra=_file("The file", "application/yaml", "text/csv", "application/x-ndjson"))
def run_file(request: HttpRequest, id: int, name: str) -> HttpResponse:
    return run_file_download(request, run=_run(request, id), name=name)

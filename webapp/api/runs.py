"""The runs API under /api/v1/runs/, and the API's index: `Authorization: Bearer <token>`.

The API is for notebooks and scripts. Tokens are personal, belong to one team, and are created
and revoked on the API tokens page. Only the bearer token authenticates (a browser session does
not, so no CSRF exposure); everything is scoped to the token's team: another team's run is a 404,
as on the pages. The catalog, jobs and experiments have their modules beside this one.

    GET  /api/v1/                                   who am I, and the endpoints
    GET  /api/v1/runs/?status=&tag=&q=&sort=&page=  runs, filtered like the run list
    POST /api/v1/runs/                              launch: a YAML config (body), or JSON {config, topology, dataset, conversations, start_from, name, tags, notes}
    GET  /api/v1/runs/<id>/                         one run: config, final metrics, evaluations, artifacts
    POST /api/v1/runs/<id>/cancel/
    GET  /api/v1/runs/<id>/metrics/?after=&limit=   metric points by step (paginated)
    GET  /api/v1/runs/<id>/rollouts/?after=&limit=&step=   episodes (paginated)
    GET  /api/v1/runs/<id>/evaluations/             held-out evaluations and evaluation jobs
    GET  /api/v1/runs/<id>/ablations/               the ablations a finished team run allows, its ablation jobs (POST: queue one)
    GET  /api/v1/runs/<id>/artifacts/<file>         config.yaml, metrics.csv, metrics.jsonl, rollouts.jsonl,
                                                    checkpoints/<step>/<agent>.zip, merged/<job>.zip
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import RequestDataTooBig, ValidationError
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse

from training.config import ConfigError
from webapp.api import jobs as api_jobs
from webapp.api.http import PER_PAGE_MAX, ApiError, ApiRequest, Field, absolute, endpoint, error, id_field, json_body, query_int
from webapp.artifacts import files as artifacts
from webapp.artifacts.downloads import checkpoint_download, merged_download, run_file_download
from webapp.core import trust
from webapp.core.console import printable
from webapp.core.values import ID_MAX
from webapp.history import selectors as history
from webapp.models import Dataset, Job, MetricPoint, Rollout, Run, Topology
from webapp.runs import lineage
from webapp.runs import services as run_services

METRICS_LIMIT_MAX = 1000


ROLLOUTS_LIMIT_MAX = 100


LAUNCH_FIELDS = {
    "config": Field(("string", "object"), "The run config: YAML text, or the same sections as an object (with a topology: "
                    "the other sections, e.g. optim, grpo, generation; empty: the defaults)."),
    "topology": id_field("A topology of the team: it gives the model and topology sections (and the name, unless given).",
                         nullable=True),
    "name": Field("string", "The run's name (default: the config's).", max_length=200),
    "dataset": id_field("A dataset of the team: the run trains on it.", nullable=True),
    "conversations": id_field("A conversations dataset of the team: the run is supervised fine-tuning on it (algorithm sft).",
                              nullable=True),
    "start_from": Field("object", "Start from a finished run's weights (model.init_from): {\"run\": id, \"step\": its checkpoint's "
                        "step (absent or 0: the last), \"agents\": {policy: the checkpoint's folder}}.", nullable=True),
    "tags": Field(("array", "string"), "Tags: a list, or one comma-separated string."),
    "notes": Field("string", "Free text shown on the run page."),
}

START_FROM_KEYS = frozenset({"run", "step", "agents"})


YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml", "text/plain")


def _run(request: ApiRequest, pk: int) -> Run:
    return Run.objects.select_related("owner", "topology", "dataset").get(pk=pk, team=request.team)


def run_json(request: HttpRequest, run: Run) -> dict[str, Any]:
    return {
        "id": run.pk,
        "name": run.name,
        "status": run.status,
        "step": run.step,
        "total_steps": run.total_steps,
        "environment": run.environment,
        "specialization": run.specialization,
        "algorithm": run.algorithm,
        "topology": {"id": run.topology.pk, "name": run.topology.name} if run.topology else None,
        "dataset": {"id": run.dataset.pk, "name": run.dataset.name} if run.dataset else None,
        "owner": run.owner.username if run.owner else None,
        "tags": [t.name for t in run.tags.all()],
        "notes": run.notes,
        "archived": run.archived,
        "created": run.created.isoformat(),
        "started": run.started.isoformat() if run.started else None,
        "finished": run.finished.isoformat() if run.finished else None,
        "final_metrics": run.final_metrics,
        "error": run.error_message,
        "resumed_from": run.resumed_from_id,
        "url": absolute(request, run.get_absolute_url()),
        "api_url": absolute(request, reverse("api_run", args=[run.pk])),
    }


# == endpoints =========================================================================================


@endpoint("GET")
def index(request: ApiRequest) -> HttpResponse:
    return JsonResponse({
        "user": request.user.username,
        "team": {"id": request.team.pk, "name": request.team.name},
        "token": {"name": request.api_token.name, "prefix": request.api_token.prefix},
        "runs": absolute(request, reverse("api_runs")),
        **{name: absolute(request, reverse(f"api_{name}")) for name in ("models", "agents", "topologies", "datasets", "experiments", "jobs", "playground")},
        "openapi": absolute(request, reverse("api_openapi")),
    })


@endpoint("GET", "POST")
def runs(request: ApiRequest) -> HttpResponse:
    if request.method == "POST":
        return _launch(request)
    filters = history.RunFilter.from_query(request.GET)
    if filters.problems:
        raise ApiError(400, " ".join(f"{name}: {problem}" for name, problem in filters.problems),
                       fields={name: [problem] for name, problem in filters.problems})
    per_page = query_int(request, "per_page", 25, low=1, high=PER_PAGE_MAX) or 25
    paginator = Paginator(history.run_search(team=request.team, filters=filters), per_page)
    number = query_int(request, "page", 1, low=1) or 1
    if number > paginator.num_pages:
        raise ApiError(404, f"page: there are {paginator.num_pages} page(s).", fields={"page": [f"At most {paginator.num_pages}."]})
    page = paginator.page(number)

    def link(number: int) -> str:
        return absolute(request, f"{reverse('api_runs')}?{filters.query_string()}&page={number}&per_page={per_page}")

    return JsonResponse({
        "count": page.paginator.count,
        "page": page.number,
        "pages": page.paginator.num_pages,
        "next": link(page.next_page_number()) if page.has_next() else None,
        "previous": link(page.previous_page_number()) if page.has_previous() else None,
        "results": [run_json(request, run) for run in page],
    })


def _launch(request: ApiRequest) -> HttpResponse:
    try:
        body = request.body
    except RequestDataTooBig:
        return error(413, f"The request body is too large; a run config may be at most {trust.MAX_CONFIG_BYTES:,} bytes.")
    content_type = request.content_type or ""
    options: dict[str, Any] = dict(request.GET.items())
    for key in ("dataset", "topology", "conversations"):
        if key in options:
            options[key] = query_int(request, key, None, low=1, high=ID_MAX)
    try:
        if content_type == "application/json":
            payload = json_body(request, LAUNCH_FIELDS)
            options.update({k: v for k, v in payload.items() if k != "config"})
            config: Any = payload.get("config") or {}
            tree = trust.yaml_load(config, field="config") if isinstance(config, str) else config
        elif content_type in YAML_TYPES or not content_type:
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError as exc:
                return error(400, f"body: not valid UTF-8 (byte {exc.start})", field="body")
            tree = trust.yaml_load(text, field="yaml")
        else:
            return error(415, f"Send the config as YAML ({YAML_TYPES[0]}) or JSON (application/json), not {content_type}.")
    except ConfigError as exc:
        return error(400, str(exc), field=exc.field)
    if not isinstance(tree, dict):
        return error(400, "config: the config must be a YAML mapping of sections (model, topology, data, grpo, ...)", field="config")
    dataset = None
    if options.get("dataset") is not None:
        dataset = Dataset.objects.filter(team=request.team, pk=int(options["dataset"])).first()
        if dataset is None:
            return error(400, "dataset: no dataset with this id in your team", field="dataset")
    topology = None
    if options.get("topology") is not None:
        topology = Topology.objects.filter(team=request.team, pk=int(options["topology"])).first()
        if topology is None:
            return error(400, "topology: no topology with this id in your team", field="topology")
    try:
        overrides = _source_overrides(request, options)
    except ValidationError as exc:
        field, messages = next(iter(exc.message_dict.items()))
        return error(400, f"{field}: {' '.join(messages)}", field=field)
    tags = options.get("tags") or ""
    try:
        run = run_services.run_launch(
            team=request.team, user=request.user, tree=tree, name=str(options.get("name") or "")[:200], dataset=dataset,
            tags=", ".join(map(str, tags)) if isinstance(tags, list) else str(tags), notes=str(options.get("notes") or ""),
            topology=topology, overrides=overrides,
        )
    except ConfigError as exc:  # every field at fault, found in one pass; the first one named in `error`
        first, *others = exc.problems
        fields: dict[str, list[str]] = {}
        for problem in [first, *others[:run_services.MAX_CONFIG_PROBLEMS]]:
            fields.setdefault(problem.field, []).append(problem.message)
        return error(400, str(first), field=first.field, fields=fields)
    except ValidationError as exc:
        field = next(iter(exc.message_dict), None) if hasattr(exc, "error_dict") else None
        return error(400, " ".join(exc.messages), field=field)
    response = JsonResponse(run_json(request, run), status=201)
    response["Location"] = run_json(request, run)["api_url"]
    return response


def _source_overrides(request: ApiRequest, options: dict[str, Any]) -> dict[str, Any]:
    """`conversations` and `start_from` of a launch as config fields (`run_services.run_source_overrides`)."""
    conversations = None
    if options.get("conversations") is not None:
        conversations = Dataset.objects.filter(team=request.team, pk=int(options["conversations"]), kind=Dataset.Kind.CHATS).first()
        if conversations is None:
            raise ValidationError({"conversations": "no conversations dataset with this id in your team"})
    start = options.get("start_from")
    if start is None:
        return run_services.run_source_overrides(team=request.team, conversations=conversations)
    if not isinstance(start, dict):
        raise ValidationError({"start_from": "give {\"run\": a run id, \"step\": a checkpoint step (optional), \"agents\": a mapping (optional)}"})
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


@endpoint("GET")
def run_detail(request: ApiRequest, pk: int) -> HttpResponse:
    run = _run(request, pk)
    data = run_json(request, run)
    origin = lineage.run_origin(run=run)
    data["started_from"] = {"run": origin.run.pk if origin.run else None, "step": origin.step} if origin else None
    data["warm_started"] = [child.pk for child in lineage.run_descendants(run=run)]
    data["config_yaml"] = run.config_yaml
    data["evaluations"] = _evaluations(run)
    data["artifacts"] = _artifact_links(request, run)
    return JsonResponse(data)


@endpoint("POST")
def run_cancel(request: ApiRequest, pk: int) -> HttpResponse:
    run = run_services.run_cancel(run=_run(request, pk), actor=request.user)
    return JsonResponse(run_json(request, run))


@endpoint("GET")
def run_metrics(request: ApiRequest, pk: int) -> HttpResponse:
    """Metric points with step > `after`, at most `limit` (default 500); `next` continues."""
    run = _run(request, pk)
    after = query_int(request, "after", -1, low=-1)
    limit = query_int(request, "limit", 500, low=1, high=METRICS_LIMIT_MAX) or 500
    rows = list(MetricPoint.objects.filter(run=run, step__gt=after).order_by("step").values_list("step", "time", "values", "agents")[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    base = reverse("api_run_metrics", args=[run.pk])
    return JsonResponse({
        "results": [{"step": s, "time": t.isoformat(), "values": v, "agents": a} for s, t, v, a in rows],
        "next": absolute(request, f"{base}?after={rows[-1][0]}&limit={limit}") if more else None,
    })


@endpoint("GET")
def run_rollouts(request: ApiRequest, pk: int) -> HttpResponse:
    """Episodes with id > `after` in recording order, at most `limit` (default 20); `step` filters."""
    run = _run(request, pk)
    after = query_int(request, "after", 0, low=0)
    limit = query_int(request, "limit", 20, low=1, high=ROLLOUTS_LIMIT_MAX) or 20
    rows = Rollout.objects.filter(run=run, id__gt=after).order_by("id")
    step = query_int(request, "step", None, low=0)
    if step is not None:
        rows = rows.filter(step=step)
    page = list(rows.values_list("id", "step", "episode", "success", "team_reward", "data")[: limit + 1])
    more = len(page) > limit
    page = page[:limit]
    base = reverse("api_run_rollouts", args=[run.pk])
    extra = f"&step={step}" if step is not None else ""
    return JsonResponse({
        "results": [{"id": i, "step": s, "episode": e, "success": ok, "team_reward": r, "data": d} for i, s, e, ok, r, d in page],
        "next": absolute(request, f"{base}?after={page[-1][0]}&limit={limit}{extra}") if more else None,
    })


@endpoint("GET", "POST")
def run_evaluations(request: ApiRequest, pk: int) -> HttpResponse:
    """GET: the run's held-out evaluations and evaluation jobs; POST: queue an evaluation job."""
    run = _run(request, pk)
    if request.method == "POST":
        return api_jobs.evaluation_launch(request, run)
    return JsonResponse({"results": _evaluations(run)})


@endpoint("GET", "POST")
def run_ablations(request: ApiRequest, pk: int) -> HttpResponse:
    """GET: the ablations the run allows and its ablation jobs; POST: queue one."""
    run = _run(request, pk)
    if request.method == "POST":
        return api_jobs.ablation_launch(request, run)
    return api_jobs.ablation_list(request, run)


def _evaluations(run: Run) -> dict[str, Any]:
    return {
        "training": [
            {"step": e.step, "temperature": e.temperature, "team_success": e.team_success, "agents": e.agents, "n": (e.data or {}).get("n")}
            for e in run.evaluations.order_by("step", "temperature")
        ],
        "jobs": [
            {"id": j.pk, "status": j.status, "checkpoint_step": j.params.get("checkpoint_step"), "dataset": j.params.get("dataset_name"),
             "ablation": j.params.get("ablation"),
             "created": j.created.isoformat(), "error": j.error,
             "results": [{k: v for k, v in r.items() if k != "examples"} for r in (j.result or {}).get("evaluations", [])]}
            for j in run.jobs.filter(kind=Job.Kind.EVALUATE).order_by("-created")
        ],
    }


def _artifact_links(request: HttpRequest, run: Run) -> dict[str, Any]:
    def url(path: str) -> str:
        return absolute(request, reverse("api_run_file", args=[run.pk, path]))

    files = {name: url(name) for name in ("config.yaml", "metrics.csv", "metrics.jsonl", "rollouts.jsonl")}
    checkpoints = [
        {"step": c.checkpoint.step, "on_disk": c.on_disk,
         "policies": [{"name": p.name, "kind": p.kind, "bytes": p.size,
                       "url": absolute(request, reverse("api_checkpoint_download", args=[run.pk, c.checkpoint.step, p.name]))}
                      for p in c.policies]}
        for c in artifacts.run_artifacts(run=run)
    ]
    merged = [
        {"job": j.pk, "agent": j.params.get("agent"), "checkpoint_step": j.params.get("checkpoint_step"), "status": j.status,
         "url": absolute(request, reverse("api_merged_download", args=[run.pk, j.pk])) if j.status == Job.Status.SUCCEEDED and j.output else None}
        for j in run.jobs.filter(kind=Job.Kind.MERGE).order_by("-created")
    ]
    return {"files": files, "checkpoints": checkpoints, "merged": merged}


@endpoint("GET")
def run_file(request: ApiRequest, pk: int, name: str) -> HttpResponse:
    return run_file_download(request, run=_run(request, pk), name=name)


@endpoint("GET")
def checkpoint_file(request: ApiRequest, pk: int, step: int, name: str) -> HttpResponse:
    run = _run(request, pk)
    return checkpoint_download(request, run=run, checkpoint=run.checkpoints.filter(step=step).first(), name=name)


@endpoint("GET")
def merged_file(request: ApiRequest, pk: int, job_id: int) -> HttpResponse:
    run = _run(request, pk)
    return merged_download(request, job=Job.objects.get(pk=job_id, run=run, kind=Job.Kind.MERGE))


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default

"""The catalog over the JSON API: model sources, agents, topologies and datasets, each exposed by
one call of `crud`: a schema for what a read answers, one for a body, the team's rows, and the
same forms and services as the pages, so that a script meets the same validation, limits, audit
trail and blockers as a person.

    GET  POST         /api/v1/models/            GET PATCH DELETE  /api/v1/models/<id>/
    GET  POST         /api/v1/agents/            GET PATCH DELETE  /api/v1/agents/<id>/
    GET  POST         /api/v1/topologies/        GET PATCH DELETE  /api/v1/topologies/<id>/
    GET  POST         /api/v1/datasets/          GET PATCH DELETE  /api/v1/datasets/<id>/
    GET  POST         /api/v1/graders/           GET PATCH DELETE  /api/v1/graders/<id>/      POST /api/v1/graders/try/
    GET  POST         /api/v1/tasks/             GET PATCH DELETE  /api/v1/tasks/<id>/        POST /api/v1/tasks/try/
    (a dataset is uploaded as multipart/form-data, or made by a generator from JSON; a grader or
    task is tried on a dataset's first rows without saving, as the pages' Try button does)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from django.core.exceptions import ValidationError
from django.db.models import Model, QuerySet
from django.forms import BaseForm
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import reverse
from ninja import Field, Router, Schema, Status

from agents.graders import KINDS as GRADER_KINDS
from webapp.api.app import Id, In, Page, QueryPaging, answers, body_doc, page_of, read_body
from webapp.api.http import ApiError, absolute
from webapp.catalog import conversations, graders, selectors, services
from webapp.catalog.forms import (
    AgentForm,
    ConversationsUploadForm,
    DatasetGeneratorForm,
    DatasetUploadEditForm,
    DatasetUploadForm,
    GraderForm,
    ModelSourceForm,
    TaskForm,
    TopologyForm,
)
from webapp.core.bodylimit import upload_view
from webapp.models import Agent, Dataset, Grader, ModelSource, Task, Team, Topology

router = Router(tags=["catalog"], by_alias=True)  # (a dataset's `schema` is `schema_` in Python)

Problems = dict[str, list[str]]


# == one entity's CRUD =================================================================================


@dataclass(frozen=True)
class Entity:
    """What `crud` needs to know of a catalog object."""

    noun: str  # in the document: "model source"
    path: str  # under /api/v1/: "models"
    name: str  # URL names: api_<path>, api_<name>
    out: type[Schema]  # what a read answers
    rows: Callable[[Team], QuerySet[Any] | list[Any]]  # the team's, in list order
    blocker: Callable[[Any], str | None]  # why it cannot be deleted now
    delete: Callable[[Any, Any], None]  # (object, actor)
    body: type[In] | None = None  # what a create or change sends; None: no generic create or change
    save: Callable[[Any, Any, dict[str, Any], Problems], Model] | None = None  # (request, object or None, body, problems)
    saved: type[Schema] | None = None  # what a create or change answers, where it says more than a read
    detail: type[Schema] | None = None  # what a detail read answers, where it says more than a list's row
    patch: bool = True
    create: bool = True  # False: the collection's POST is a route of its own


def crud(router: Router, entity: Entity) -> None:
    """List (paged, oldest first), create, read, change (only the fields given) and delete (409
    naming what still uses it) of one catalog entity, under /api/v1/<path>/."""
    saved, detail = entity.saved or entity.detail or entity.out, entity.detail or entity.out
    collection, item = f"/{entity.path}/", f"/{entity.path}/{{int:id}}/"

    def one(request: HttpRequest, id: int) -> Any:
        rows = entity.rows(request.team)  # type: ignore[attr-defined]
        if isinstance(rows, QuerySet):
            return rows.get(pk=id)
        found = next((obj for obj in rows if obj.pk == id), None)
        if found is None:
            raise Http404
        return found

    @router.get(collection, response=answers({200: Page[entity.out]}, 400, 404), url_name=f"api_{entity.path}",  # type: ignore[name-defined]
                operation_id=f"{entity.name}_list", summary=f"The team's {entity.noun}s, oldest first")
    def listing(request: HttpRequest, paging: QueryPaging) -> Any:
        return page_of(request, entity.rows(request.team), paging)  # type: ignore[attr-defined]

    if entity.create and entity.body is not None and entity.save is not None:
        body, save = entity.body, entity.save

        @router.post(collection, response=answers({201: saved}, 400, 413, 415), operation_id=f"{entity.name}_create",
                     summary=f"Create a {entity.noun}", openapi_extra=body_doc(body))
        def create(request: HttpRequest, response: HttpResponse) -> Any:
            return created(request, response, saved, save(request, None, *read_body(request, body)))

    @router.get(item, response=answers({200: detail}, 404), url_name=f"api_{entity.name}", operation_id=f"{entity.name}_read",
                summary=f"One {entity.noun}")
    def read(request: HttpRequest, id: int) -> Any:
        return one(request, id)

    if entity.patch and entity.body is not None and entity.save is not None:
        body, save = entity.body, entity.save

        @router.patch(item, response=answers({200: saved}, 400, 404, 415), operation_id=f"{entity.name}_change",
                      summary=f"Change a {entity.noun}: only the fields given", openapi_extra=body_doc(body, partial=True))
        def change(request: HttpRequest, id: int) -> Any:
            obj = one(request, id)
            return save(request, obj, *read_body(request, body, partial=True))

    @router.delete(item, response=answers({204: None}, 404, 409), operation_id=f"{entity.name}_delete",
                   summary=f"Delete a {entity.noun}")
    def delete(request: HttpRequest, id: int) -> Any:
        obj = one(request, id)
        blocker = entity.blocker(obj)
        if blocker:
            raise ApiError(409, blocker)
        entity.delete(obj, request.user)
        return Status(204, None)


def created(request: HttpRequest, response: HttpResponse, schema: type[Schema], obj: Model) -> Status:
    """201 with the new object and its URL in `Location`."""
    response["Location"] = url_of(request, obj)
    return Status(201, obj)


URL_NAMES = {ModelSource: "api_model", Agent: "api_agent", Topology: "api_topology", Dataset: "api_dataset", Grader: "api_grader",
             Task: "api_task"}


def url_of(request: HttpRequest, obj: Model) -> str:
    return absolute(request, reverse(URL_NAMES[type(obj)], args=[obj.pk]))


def form_data(values: dict[str, Any]) -> dict[str, Any]:
    """JSON values as the pages' forms read them: null as empty, lists and objects as their text."""
    data: dict[str, Any] = {}
    for key, value in values.items():
        if value is None:
            data[key] = ""
        elif key == "tools":
            data[key] = ", ".join(value)
        elif key == "agents":
            data[key] = [str(v) for v in value]
        elif isinstance(value, (dict, list)):  # (JSON is YAML: the forms' YAML fields read it)
            data[key] = json.dumps(value)
        else:
            data[key] = value
    return data


def checked(form: BaseForm, problems: Problems) -> dict[str, Any]:
    """The form's cleaned data, or every problem at once: the body's own (unknown fields, wrong
    types and bounds, missing ones), then the form's for the other fields."""
    errors = dict(problems)
    for key, messages in form.errors.items():
        errors.setdefault(key, [str(m) for m in messages])
    if errors:
        raise ValidationError(errors)
    return form.cleaned_data


class Out(Schema):
    """What every catalog object answers besides its own fields: its URL in the API."""

    api_url: str

    @staticmethod
    def resolve_api_url(obj: Model, context: dict[str, Any]) -> str:
        return url_of(context["request"], obj)


# == model sources =====================================================================================


class ModelSourceIn(In):
    name: str = Field(max_length=100, description="Unique within the team.")
    source: str = Field(max_length=500, description="bundled:smollm2-135m-instruct, tiny-random:llama, local:<folder in the team's "
                                                     "model folders> or hf:org/name.")
    notes: str = Field("", description="Free text.")

    model_config = {**In.model_config, "json_schema_extra": {"examples": [{"name": "Smol", "source": "tiny-random:llama"}]}}


class ModelSourceOut(Out):
    id: int
    name: str
    source: str
    notes: str
    agents: list[str] = Field(description="Names of the agents that use it.")
    created: datetime

    @staticmethod
    def resolve_agents(obj: ModelSource) -> list[str]:
        return sorted(obj.agents.values_list("name", flat=True))


def _model_source_save(request: Any, source: ModelSource | None, body: dict[str, Any], problems: Problems) -> ModelSource:
    current = {"name": source.name, "source": source.source, "notes": source.notes} if source else {}
    form = ModelSourceForm(form_data({**current, **body}), instance=source or ModelSource(team=request.team))
    return services.model_source_save(team=request.team, instance=source, actor=request.user, **checked(form, problems))


crud(router, Entity(
    noun="model source", path="models", name="model", out=ModelSourceOut, body=ModelSourceIn, save=_model_source_save,
    rows=lambda team: selectors.team_catalog(team=team, model=ModelSource),
    blocker=lambda source: selectors.model_source_delete_blocker(source=source),
    delete=lambda source, actor: services.model_source_delete(source=source, actor=actor),
))


# == agents ============================================================================================


class AgentIn(In):
    name: str = Field(max_length=40, description="Unique within the team; letters, digits, - and _.")
    role: str = Field(max_length=60, description="The environment role it plays (math_tool: tool or reasoner).")
    instructions: str = Field("", description="System prompt for the role.")
    model_source: Id = Field(description="The id of one of the team's model sources.")
    temperature: float | None = Field(None, ge=0.0, le=5.0, description="Sampling temperature in training; null uses the run's.")
    max_new_tokens: int | None = Field(None, ge=1, le=4096, description="Completion cap per turn; null uses the run's.")
    tools: list[str] = Field([], description="Names of the tools the agent may call.")
    trainable: bool = Field(True, description="Untrainable agents act but are never updated.")

    model_config = {**In.model_config, "json_schema_extra": {"examples": [
        {"name": "coder", "role": "tool", "model_source": 1, "tools": ["python"], "temperature": 0.7}]}}


class AgentOut(Out):
    id: int
    name: str
    role: str
    instructions: str
    model_source: int
    temperature: float | None
    max_new_tokens: int | None
    tools: list[str]
    trainable: bool
    created: datetime
    updated: datetime

    @staticmethod
    def resolve_model_source(obj: Agent) -> int:
        return obj.model_source_id

    @staticmethod
    def resolve_tools(obj: Agent) -> list[str]:
        return list(obj.tools or [])


def _agent_save(request: Any, agent: Agent | None, body: dict[str, Any], problems: Problems) -> Agent:
    if agent is None:
        form = AgentForm(form_data({"trainable": True, **body}), instance=Agent(team=request.team), team=request.team)
        return services.agent_create(team=request.team, actor=request.user, **checked(form, problems))
    current = {name: getattr(agent, name) for name in AgentIn.model_fields if name != "model_source"}
    form = AgentForm(form_data({**current, "model_source": agent.model_source_id, **body}), instance=agent, team=request.team)
    return services.agent_update(agent=agent, **checked(form, problems))


crud(router, Entity(
    noun="agent", path="agents", name="agent", out=AgentOut, body=AgentIn, save=_agent_save,
    rows=lambda team: selectors.team_catalog(team=team, model=Agent),
    blocker=lambda agent: selectors.agent_delete_blocker(agent=agent),
    delete=lambda agent, actor: services.agent_delete(agent=agent, actor=actor),
))


# == topologies ========================================================================================


class TopologyIn(In):
    name: str = Field(max_length=100, description="Unique within the team.")
    environment: str = Field(max_length=200, description="An installed environment, e.g. math_tool.")
    env_args: dict[str, Any] = Field({}, description='Environment arguments, e.g. {"level": 2}.')
    specialization: Literal["single", "prompt", "lora", "full"] = Field("lora", description="How the agents' weights are shared.")
    max_turns: int = Field(None, ge=1, le=64, description="Turns per episode (default: one per agent).",  # type: ignore[assignment]
                           json_schema_extra=lambda schema: schema.pop("default"))
    agents: list[Id] = Field(description="Agent ids in acting order; each role must exist in the environment.")

    model_config = {**In.model_config, "json_schema_extra": {"examples": [
        {"name": "pair", "environment": "math_tool", "env_args": {"level": 2}, "specialization": "lora", "agents": [2, 1]}]}}


class TopologyOut(Out):
    id: int
    name: str
    environment: str
    env_args: dict[str, Any]
    specialization: Literal["single", "prompt", "lora", "full"]
    max_turns: int
    agents: list[int] = Field(description="Agent ids in acting order.")
    created: datetime
    updated: datetime

    @staticmethod
    def resolve_env_args(obj: Topology) -> dict[str, Any]:
        return obj.env_args or {}

    @staticmethod
    def resolve_agents(obj: Topology) -> list[int]:
        return [a.pk for a in obj.ordered_agents()]


class TopologySaved(TopologyOut):
    """What a create or change answers: the topology and, as the page shows after saving, the notes
    its author should read."""

    notes: list[str] = Field(description="What the author should know, e.g. an agent with tools whose model's chat template "
                                         "has no tool support.")

    @staticmethod
    def resolve_notes(obj: Topology) -> list[str]:
        return selectors.tool_template_notes(agents=obj.ordered_agents())


def _topology_save(request: Any, topology: Topology | None, body: dict[str, Any], problems: Problems) -> Topology:
    if topology is None:
        defaults = {"env_args": {}, "specialization": "lora", "max_turns": max(len(body.get("agents") or []), 1)}
        form = TopologyForm(form_data({**defaults, **body}), instance=Topology(team=request.team), team=request.team)
        return services.topology_create(team=request.team, actor=request.user, **checked(form, problems))
    current = {name: getattr(topology, name) for name in TopologyIn.model_fields if name != "agents"}
    current["agents"] = [a.pk for a in topology.ordered_agents()]
    form = TopologyForm(form_data({**current, **body}), instance=topology, team=request.team)
    return services.topology_update(topology=topology, **checked(form, problems))


crud(router, Entity(
    noun="topology", path="topologies", name="topology", out=TopologyOut, saved=TopologySaved, body=TopologyIn, save=_topology_save,
    rows=lambda team: selectors.team_catalog(team=team, model=Topology),
    blocker=lambda topology: selectors.topology_delete_blocker(topology=topology),
    delete=lambda topology, actor: services.topology_delete(topology=topology, actor=actor),
))


# == datasets ==========================================================================================


class GeneratorIn(In):
    name: str = Field(max_length=100, description="Unique within the team.")
    environment: str = Field(max_length=200, description="An installed environment with a generator, e.g. math_tool.")
    env_args: dict[str, Any] = Field({}, description='Generator arguments, e.g. {"level": 2}.')
    size: int = Field(ge=1, le=10_000_000, description="Training tasks to generate.")
    eval_size: int = Field(ge=0, le=1_000_000, description="Held-out tasks to generate.")

    model_config = {**In.model_config, "json_schema_extra": {"examples": [
        {"name": "L2", "environment": "math_tool", "env_args": {"level": 2}, "size": 64, "eval_size": 16}]}}


class UploadIn(In):
    name: str = Field(max_length=100, description="Unique within the team.")
    environment: str = Field(max_length=200, description="The environment whose fields every row must have.")
    eval_fraction: float = Field(0.1, ge=0.0, le=0.9, description="Share of rows held out for evaluation (default 0.1).")


class DatasetOut(Out):
    id: int
    name: str
    kind: Literal[tuple(Dataset.Kind.values)]  # type: ignore[valid-type]
    environment: str
    env_args: dict[str, Any]
    size: int | None
    eval_size: int | None
    original_filename: str
    format: str
    size_bytes: int
    eval_fraction: float
    row_count: int
    status: Literal[tuple(Dataset.Status.values)]  # type: ignore[valid-type]
    status_message: str
    created: datetime

    @staticmethod
    def resolve_env_args(obj: Dataset) -> dict[str, Any]:
        return obj.env_args or {}


class DatasetDetail(DatasetOut):
    schema_: list[str] = Field(alias="schema", description="Field names, in file order.")
    preview: list[dict[str, Any]] = Field(description="The first rows.")

    @staticmethod
    def resolve_schema_(obj: Dataset) -> list[str]:
        return list(obj.schema or [])

    @staticmethod
    def resolve_preview(obj: Dataset) -> list[dict[str, Any]]:
        return list(obj.preview or [])


class DatasetIn(In):
    name: str = Field(max_length=100, description="Unique within the team.")
    eval_fraction: float = Field(ge=0.0, le=0.9, description="An uploaded file's share of rows held out for evaluation.")
    environment: str = Field(max_length=200, description="A generator's environment.")
    env_args: dict[str, Any] = Field(description="A generator's arguments.")
    size: int = Field(ge=1, le=10_000_000, description="A generator's training tasks.")
    eval_size: int = Field(ge=0, le=1_000_000, description="A generator's held-out tasks.")


UPLOAD_CHANGES = ("name", "eval_fraction")


def _dataset_save(request: Any, dataset: Dataset | None, body: dict[str, Any], problems: Problems) -> Dataset:
    """A dataset's change, as its page saves it: an uploaded file's name and split, a generator's settings."""
    assert dataset is not None  # (no generic create: POST /datasets/ is its own route)
    if dataset.kind != Dataset.Kind.GENERATOR:
        problems = {**problems, **{k: ["An uploaded dataset changes only its name and eval_fraction; upload a new file for the rest."]
                                   for k in body if k not in UPLOAD_CHANGES}}
        form = DatasetUploadEditForm(form_data({"name": dataset.name, "eval_fraction": dataset.eval_fraction,
                                                **{k: v for k, v in body.items() if k in UPLOAD_CHANGES}}), instance=dataset)
        return services.dataset_upload_update(dataset=dataset, **checked(form, problems))
    if "eval_fraction" in body:
        problems = {**problems, "eval_fraction": ["A generator dataset has eval_size, not eval_fraction."]}
    current = {"name": dataset.name, "environment": dataset.environment, "env_args": dataset.env_args or {}, "size": dataset.size,
               "eval_size": dataset.eval_size}
    form = DatasetGeneratorForm(form_data({**current, **{k: v for k, v in body.items() if k != "eval_fraction"}}), instance=dataset)
    return services.dataset_generator_update(dataset=dataset, **checked(form, problems))


crud(router, Entity(
    noun="dataset", path="datasets", name="dataset", out=DatasetOut, detail=DatasetDetail, body=DatasetIn, save=_dataset_save,
    saved=DatasetDetail, create=False,
    rows=lambda team: selectors.team_catalog(team=team, model=Dataset),
    blocker=lambda dataset: selectors.dataset_delete_blocker(dataset=dataset),
    delete=lambda dataset, actor: services.dataset_delete(dataset=dataset, actor=actor),
))

_UPLOAD = {**UploadIn.model_json_schema(), "required": ["name", "environment", "file"]}
_UPLOAD["properties"] = {**_UPLOAD["properties"], "file": {"type": "string", "format": "binary",
                                                           "description": "JSONL or CSV with a header row, UTF-8."}}


@router.post("/datasets/", response=answers({201: DatasetDetail}, 400, 413, 415), operation_id="dataset_create",
             summary="Upload a JSONL/CSV file (multipart/form-data), or make a generator dataset (JSON)",
             openapi_extra=body_doc(GeneratorIn, **{"multipart/form-data": {"schema": _UPLOAD}}))
@upload_view
def datasets(request: HttpRequest, response: HttpResponse) -> Any:
    team, user = request.team, request.user  # type: ignore[attr-defined]
    if (request.content_type or "") == "multipart/form-data":  # a file, with name, environment and eval_fraction beside it
        unknown = sorted(set(request.POST) - set(UploadIn.model_fields)) + sorted(set(request.FILES) - {"file"})
        data = request.POST.copy()
        data.setdefault("eval_fraction", "0.1")
        fields = checked(DatasetUploadForm(data, request.FILES),
                         {k: [f"Unknown field; send file, {', '.join(UploadIn.model_fields)}."] for k in unknown})
        dataset = services.dataset_upload(team=team, upload=fields.pop("file"), actor=user, **fields)
    else:
        body, problems = read_body(request, GeneratorIn)
        dataset = services.dataset_generator_create(
            team=team, actor=user, **checked(DatasetGeneratorForm(form_data({"env_args": {}, **body})), problems))
    return created(request, response, DatasetDetail, dataset)


# == graders and tasks =================================================================================


class GraderIn(In):
    name: str = Field(max_length=40, description="Unique within the team; a letter, then letters, digits, - or _. The run page "
                                                 "charts its part of the reward under this name.")
    kind: Literal[tuple(GRADER_KINDS)] = Field(description="; ".join(f"{k}: {v}" for k, v in GRADER_KINDS.items()) + ".")  # type: ignore[valid-type]
    description: str = Field("", max_length=500, description="Free text.")
    settings: dict[str, Any] = Field({}, description='The kind\'s settings, e.g. {"column": "answer"}, {"pattern": "..."}, '
                                                     '{"tolerance": 0.01}, {"schema": {...}}, {"weights": {"grader": 1.0}}.')
    code: str = Field("", description="A python grader's code: def grade(completion, row): ... returning a number, or "
                                      "{score, parts}; it runs in the sandbox.")
    try_dataset: Id | None = Field(None, description="A dataset of the team: the grader is tried on its first rows (saving "
                                                     "refuses a grader that fails there).")
    try_answer: str = Field("", description="The completion graded against each of those rows.")

    model_config = {**In.model_config, "json_schema_extra": {"examples": [
        {"name": "correct", "kind": "python", "code": "def grade(completion, row):\n    return float(row['answer'] in completion)\n"}]}}


class GraderOut(Out):
    id: int
    name: str
    kind: str
    description: str
    settings: dict[str, Any]
    code: str
    created: datetime
    updated: datetime

    @staticmethod
    def resolve_settings(obj: Grader) -> dict[str, Any]:
        return obj.settings if isinstance(obj.settings, dict) else {}


class TaskIn(In):
    name: str = Field(max_length=100, description="Unique within the team.")
    description: str = Field("", max_length=500, description="Free text.")
    dataset: Id | None = Field(None, description="The team's dataset it is written for (tried on its first rows).")
    roles: list[dict[str, Any]] = Field(description="In turn order: each role's name, its prompt over the row's columns "
                                                    "({question}), sees_turns (true, false or a list of roles) and its grader.")
    team_grader: str = Field("", max_length=40, description="The grader of the team reward (empty: none).")
    team_role: str = Field("", max_length=60, description="The role whose latest answer the team grader scores.")
    rounds: int = Field(1, ge=1, le=8, description="How many times the roles take their turns.")
    try_answers: dict[str, str] = Field({}, description="Role -> an answer to try on the dataset's first rows (saving refuses a "
                                                        "grader that fails there).")

    model_config = {**In.model_config, "json_schema_extra": {"examples": [
        {"name": "qa", "dataset": 1, "roles": [{"name": "answerer", "prompt": "Question: {question}", "grader": "correct"}],
         "team_grader": "correct", "team_role": "answerer"}]}}


class TaskOut(Out):
    id: int
    name: str
    description: str
    dataset: int | None
    roles: list[dict[str, Any]]
    team_grader: str
    team_role: str
    rounds: int
    topologies: list[int] = Field(description="The team's topologies that play it.")
    created: datetime
    updated: datetime

    @staticmethod
    def resolve_dataset(obj: Task) -> int | None:
        return obj.dataset_id

    @staticmethod
    def resolve_roles(obj: Task) -> list[dict[str, Any]]:
        return [r for r in obj.roles if isinstance(r, dict)] if isinstance(obj.roles, list) else []

    @staticmethod
    def resolve_topologies(obj: Task) -> list[int]:
        return [t.pk for t in graders.task_topologies(task=obj)]


class GradeOut(Schema):
    graded: str = Field(description="What was graded: `answer` (a grader's try), a role, or `team`.")
    grader: str
    score: float
    parts: dict[str, float]
    error: str | None = Field(description="Why there is no score (it raised, timed out, returned what is not a number).")


class TriedOut(Schema):
    row: dict[str, Any]
    prompts: dict[str, str] = Field(description="Role -> the prompt it sees for this row (a task's try).")
    grades: list[GradeOut]

    @staticmethod
    def resolve_grades(obj: services.TriedRow) -> list[dict[str, Any]]:
        return [{"graded": what, "grader": name, "score": g.score, "parts": dict(g.parts), "error": g.error} for what, name, g in obj.grades]


class Tried(Schema):
    results: list[TriedOut] = Field(description="One per sample row (one empty row without a dataset).")
    failed: list[str] = Field(description="Every grade that failed, with its row: what Save would refuse.")


def _tried(rows: list[services.TriedRow]) -> dict[str, Any]:
    return {"results": rows, "failed": [f"row {i}: {problem}" for i, t in enumerate(rows, 1) for problem in t.failed]}


def _grader_form(request: Any, grader: Grader | None, body: dict[str, Any], problems: Problems) -> tuple[GraderForm, dict[str, Any]]:
    current = {name: getattr(grader, name) for name in GRADER_FIELDS} if grader else {}
    form = GraderForm(form_data({**current, **body}), instance=grader or Grader(team=request.team), team=request.team)
    return form, checked(form, problems)


GRADER_FIELDS = ("name", "kind", "description", "settings", "code")


def _grader_save(request: Any, grader: Grader | None, body: dict[str, Any], problems: Problems) -> Grader:
    _, data = _grader_form(request, grader, body, problems)
    dataset, answer = data.pop("try_dataset"), data.pop("try_answer")
    return services.grader_save(team=request.team, instance=grader, actor=request.user, try_on=dataset, answer=answer, **data)


crud(router, Entity(
    noun="grader", path="graders", name="grader", out=GraderOut, body=GraderIn, save=_grader_save,
    rows=lambda team: graders.graders_of(team=team),
    blocker=lambda grader: graders.grader_delete_blocker(grader=grader),
    delete=lambda grader, actor: services.grader_delete(grader=grader, actor=actor),
))


@router.post("/graders/try/", response=answers({200: Tried}, 400, 415), url_name="api_grader_try", operation_id="grader_try", openapi_extra=body_doc(GraderIn),
             summary="Try a grader (unsaved) on a dataset's first rows with an answer: each row's score and parts (the page's Try)")
def grader_try(request: HttpRequest) -> Any:
    form, data = _grader_form(request, None, *read_body(request, GraderIn))
    return _tried(services.grader_try(team=request.team, grader=form.instance, dataset=data["try_dataset"],  # type: ignore[attr-defined]
                                      answer=data["try_answer"]))


TASK_FIELDS = ("name", "description", "roles", "team_grader", "team_role", "rounds")


def _task_form(request: Any, task: Task | None, body: dict[str, Any], problems: Problems) -> tuple[TaskForm, dict[str, Any]]:
    current: dict[str, Any] = {name: getattr(task, name) for name in TASK_FIELDS} if task else {"rounds": 1}
    if task is not None:
        current["dataset"] = task.dataset_id
    form = TaskForm(form_data({**current, **body}), instance=task or Task(team=request.team), team=request.team)
    return form, checked(form, problems)


def _task_save(request: Any, task: Task | None, body: dict[str, Any], problems: Problems) -> Task:
    _, data = _task_form(request, task, body, problems)
    answers_ = data.pop("try_answers")
    return services.task_save(team=request.team, instance=task, actor=request.user, answers=answers_, **data)


crud(router, Entity(
    noun="task", path="tasks", name="task", out=TaskOut, body=TaskIn, save=_task_save,
    rows=lambda team: graders.tasks_of(team=team),
    blocker=lambda task: graders.task_delete_blocker(task=task),
    delete=lambda task, actor: services.task_delete(task=task, actor=actor),
))


@router.post("/tasks/try/", response=answers({200: Tried}, 400, 415), url_name="api_task_try", operation_id="task_try", openapi_extra=body_doc(TaskIn),
             summary="Try a task (unsaved) on its dataset's first rows: each role's prompt, and each grader on the answers given "
                     "(the page's Try)")
def task_try(request: HttpRequest) -> Any:
    form, data = _task_form(request, None, *read_body(request, TaskIn))
    return _tried(services.task_try(team=request.team, task=form.instance, answers=data["try_answers"]))  # type: ignore[attr-defined]


# == the pages' other catalog actions ==================================================================


@router.post("/agents/{int:id}/duplicate/", response=answers({201: AgentOut}, 404), url_name="api_agent_duplicate",
             operation_id="agent_duplicate", summary="Copy an agent under a free name (<name>-copy), as the agent list's Duplicate")
def agent_duplicate(request: HttpRequest, response: HttpResponse, id: int) -> Any:
    agent = selectors.team_catalog(team=request.team, model=Agent).get(pk=id)  # type: ignore[attr-defined]
    return created(request, response, AgentOut, services.agent_duplicate(agent=agent, actor=request.user))


@router.post("/topologies/{int:id}/duplicate/", response=answers({201: TopologySaved}, 404), url_name="api_topology_duplicate",
             operation_id="topology_duplicate", summary="Copy a topology under a free name, with the same agents in the same order")
def topology_duplicate(request: HttpRequest, response: HttpResponse, id: int) -> Any:
    topology = selectors.team_catalog(team=request.team, model=Topology).get(pk=id)  # type: ignore[attr-defined]
    return created(request, response, TopologySaved, services.topology_duplicate(topology=topology, actor=request.user))


@router.post("/datasets/{int:id}/revalidate/", response=answers({200: DatasetDetail}, 404), url_name="api_dataset_revalidate",
             operation_id="dataset_revalidate", summary="Check a dataset again against its environment (after a plugin changed, "
                                                        "or its file was restored), as the dataset page's Revalidate")
def dataset_revalidate(request: HttpRequest, id: int) -> Any:
    dataset = selectors.team_catalog(team=request.team, model=Dataset).get(pk=id)  # type: ignore[attr-defined]
    if dataset.kind == Dataset.Kind.CHATS:
        conversations.conversations_revalidate(dataset=dataset)
    else:
        services.dataset_revalidate(dataset=dataset)
    return selectors.team_catalog(team=request.team, model=Dataset).get(pk=id)  # type: ignore[attr-defined]


class TaskTopologyIn(In):
    model_source: Id = Field(description="The team's model source every new agent runs on.")
    specialization: Literal["single", "prompt", "lora", "full"] = Field("lora", description="How the agents' weights are shared "
                                                                                          "(one role: single).")


@router.post("/tasks/{int:id}/topology/", response=answers({201: TopologySaved}, 400, 404, 415), url_name="api_task_topology",
             operation_id="task_topology", openapi_extra=body_doc(TaskTopologyIn),
             summary="A topology that plays the task: one new agent per role on the model given, in turn order (the task page's button)")
def task_topology(request: HttpRequest, response: HttpResponse, id: int) -> Any:
    task = next((t for t in graders.tasks_of(team=request.team) if t.pk == id), None)  # type: ignore[attr-defined]
    if task is None:
        raise Http404
    body, problems = read_body(request, TaskTopologyIn)
    source = None
    if "model_source" in body:
        source = selectors.team_catalog(team=request.team, model=ModelSource).filter(pk=body["model_source"]).first()  # type: ignore[attr-defined]
        if source is None:
            problems["model_source"] = ["Not one of your team's model sources."]
    if problems or source is None:
        raise ValidationError(problems)
    topology = services.task_topology_create(task=task, model_source=source, specialization=body.get("specialization", "lora"),
                                             actor=request.user)
    return created(request, response, TopologySaved, topology)


_CONVERSATIONS = {"type": "object", "required": ["name", "environment", "file"], "properties": {
    "name": {"type": "string", "maxLength": 100, "description": "Unique within the team."},
    "environment": {"type": "string", "maxLength": 200, "description": "The environment of the topologies these conversations train."},
    "file": {"type": "string", "format": "binary", "description": "JSONL of conversations (TRL's `messages` format), UTF-8."}}}


@router.post("/datasets/conversations/", response=answers({201: DatasetDetail}, 400, 413, 415), url_name="api_conversations_upload",
             operation_id="conversations_upload", summary="Upload a conversations file for SFT (multipart/form-data), as the "
                                                          "conversations upload page does",
             openapi_extra={"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": _CONVERSATIONS}}}})
@upload_view
def conversations_upload(request: HttpRequest, response: HttpResponse) -> Any:
    if (request.content_type or "") != "multipart/form-data":
        raise ApiError(415, f"Send the file as multipart/form-data, not {request.content_type or 'nothing'}.")
    unknown = sorted(set(request.POST) - {"name", "environment"}) + sorted(set(request.FILES) - {"file"})
    fields = checked(ConversationsUploadForm(request.POST, request.FILES),
                     {k: ["Unknown field; send file, name, environment."] for k in unknown})
    dataset = conversations.conversations_upload(team=request.team, upload=fields.pop("file"), actor=request.user, **fields)  # type: ignore[attr-defined]
    return created(request, response, DatasetDetail, dataset)

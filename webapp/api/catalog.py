"""The catalog over the JSON API: model sources, agents, topologies and datasets, each exposed by
one call of `crud`: a schema for what a read answers, one for a body, the team's rows, and the
same forms and services as the pages, so that a script meets the same validation, limits, audit
trail and blockers as a person.

    GET  POST         /api/v1/models/            GET PATCH DELETE  /api/v1/models/<id>/
    GET  POST         /api/v1/agents/            GET PATCH DELETE  /api/v1/agents/<id>/
    GET  POST         /api/v1/topologies/        GET PATCH DELETE  /api/v1/topologies/<id>/
    GET  POST         /api/v1/datasets/          GET DELETE        /api/v1/datasets/<id>/
    (a dataset is uploaded as multipart/form-data, or made by a generator from JSON)
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
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from ninja import Field, Router, Schema, Status

from webapp.api.app import Id, In, Page, QueryPaging, answers, body_doc, page_of, read_body
from webapp.api.http import ApiError, absolute
from webapp.catalog import selectors, services
from webapp.catalog.forms import AgentForm, DatasetGeneratorForm, DatasetUploadForm, ModelSourceForm, TopologyForm
from webapp.core.bodylimit import upload_view
from webapp.models import Agent, Dataset, ModelSource, Team, Topology

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
    rows: Callable[[Team], QuerySet[Any]]  # the team's, in list order
    blocker: Callable[[Any], str | None]  # why it cannot be deleted now
    delete: Callable[[Any, Any], None]  # (object, actor)
    body: type[In] | None = None  # what a create or change sends; None: no generic create or change
    save: Callable[[Any, Any, dict[str, Any], Problems], Model] | None = None  # (request, object or None, body, problems)
    saved: type[Schema] | None = None  # what a create or change answers, where it says more than a read
    detail: type[Schema] | None = None  # what a detail read answers, where it says more than a list's row
    patch: bool = True


def crud(router: Router, entity: Entity) -> None:
    """List (paged, oldest first), create, read, change (only the fields given) and delete (409
    naming what still uses it) of one catalog entity, under /api/v1/<path>/."""
    saved, detail = entity.saved or entity.detail or entity.out, entity.detail or entity.out
    collection, item = f"/{entity.path}/", f"/{entity.path}/{{int:id}}/"

    def one(request: HttpRequest, id: int) -> Any:
        return entity.rows(request.team).get(pk=id)  # type: ignore[attr-defined]

    @router.get(collection, response=answers({200: Page[entity.out]}, 400, 404), url_name=f"api_{entity.path}",  # type: ignore[name-defined]
                operation_id=f"{entity.name}_list", summary=f"The team's {entity.noun}s, oldest first")
    def listing(request: HttpRequest, paging: QueryPaging) -> Any:
        return page_of(request, entity.rows(request.team), paging)  # type: ignore[attr-defined]

    if entity.body is not None and entity.save is not None:
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


URL_NAMES = {ModelSource: "api_model", Agent: "api_agent", Topology: "api_topology", Dataset: "api_dataset"}


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
        elif isinstance(value, dict):
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


crud(router, Entity(
    noun="dataset", path="datasets", name="dataset", out=DatasetOut, detail=DatasetDetail, patch=False,
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

"""The catalog over the JSON API: model sources, agents, topologies and datasets.

Writes go through the same forms and services as the pages, so a script meets the same
validation, limits, audit trail and blockers as a person; each body is first checked against the
field lists below, which the OpenAPI document (`webapp/api/openapi.py`) is made from.

    GET  POST         /api/v1/models/            GET PATCH DELETE  /api/v1/models/<id>/
    GET  POST         /api/v1/agents/            GET PATCH DELETE  /api/v1/agents/<id>/
    GET  POST         /api/v1/topologies/        GET PATCH DELETE  /api/v1/topologies/<id>/
    GET  POST         /api/v1/datasets/          GET DELETE        /api/v1/datasets/<id>/
    (a dataset is uploaded as multipart/form-data, or made by a generator from JSON)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import Model
from django.http import HttpResponse, JsonResponse
from django.urls import reverse

from webapp.api.http import ApiError, ApiRequest, Field, absolute, endpoint, id_field, json_fields, out_of_bounds, page_of, stamp
from webapp.catalog import selectors as catalog_selectors
from webapp.catalog import services
from webapp.catalog.forms import AgentForm, DatasetGeneratorForm, DatasetUploadForm, ModelSourceForm, TopologyForm
from webapp.core.bodylimit import upload_view
from webapp.core.values import ID_MAX
from webapp.models import Agent, Dataset, ModelSource, Topology

MODEL_SOURCE_FIELDS = {
    "name": Field("string", "Unique within the team.", required=True, max_length=100),
    "source": Field("string", "bundled:smollm2-135m-instruct, tiny-random:llama, local:<folder in the team's model folders> or hf:org/name.",
                    required=True, max_length=500),
    "notes": Field("string", "Free text."),
}

AGENT_FIELDS = {
    "name": Field("string", "Unique within the team; letters, digits, - and _.", required=True, max_length=40),
    "role": Field("string", "The environment role it plays (math_tool: tool or reasoner).", required=True, max_length=60),
    "instructions": Field("string", "System prompt for the role."),
    "model_source": id_field("The id of one of the team's model sources.", required=True),
    "temperature": Field("number", "Sampling temperature in training; null uses the run's.", nullable=True, minimum=0.0, maximum=5.0),
    "max_new_tokens": Field("integer", "Completion cap per turn; null uses the run's.", nullable=True, minimum=1, maximum=4096),
    "tools": Field("array", "Names of the tools the agent may call.", items="string"),
    "trainable": Field("boolean", "Untrainable agents act but are never updated."),
}

TOPOLOGY_FIELDS = {
    "name": Field("string", "Unique within the team.", required=True, max_length=100),
    "environment": Field("string", "An installed environment, e.g. math_tool.", required=True, max_length=200),
    "env_args": Field("object", 'Environment arguments, e.g. {"level": 2}.'),
    "specialization": Field("string", "How the agents' weights are shared.", enum=("single", "prompt", "lora", "full")),
    "max_turns": Field("integer", "Turns per episode.", minimum=1, maximum=64),
    "agents": Field("array", "Agent ids in acting order; each role must exist in the environment.", required=True, items="integer",
                    item_minimum=1, item_maximum=ID_MAX),
}

Fields = tuple[dict[str, Any], dict[str, list[str]]]
"""What `json_fields` answers: (the properties that passed, the problems by field)."""

GENERATOR_FIELDS = {
    "name": Field("string", "Unique within the team.", required=True, max_length=100),
    "environment": Field("string", "An installed environment with a generator, e.g. math_tool.", required=True, max_length=200),
    "env_args": Field("object", 'Generator arguments, e.g. {"level": 2}.'),
    "size": Field("integer", "Training tasks to generate.", required=True, minimum=1, maximum=10_000_000),
    "eval_size": Field("integer", "Held-out tasks to generate.", required=True, minimum=0, maximum=1_000_000),
}

UPLOAD_FIELDS = {
    "name": Field("string", "Unique within the team.", required=True, max_length=100),
    "environment": Field("string", "The environment whose fields every row must have.", required=True, max_length=200),
    "eval_fraction": Field("number", "Share of rows held out for evaluation (default 0.1).", minimum=0.0, maximum=0.9),
}


# == serializers ======================================================================================


def model_source_json(request: ApiRequest, source: ModelSource) -> dict[str, Any]:
    return {
        "id": source.pk, "name": source.name, "source": source.source, "notes": source.notes,
        "agents": sorted(source.agents.values_list("name", flat=True)), "created": stamp(source.created),
        "api_url": absolute(request, reverse("api_model", args=[source.pk])),
    }


def agent_json(request: ApiRequest, agent: Agent) -> dict[str, Any]:
    return {
        "id": agent.pk, "name": agent.name, "role": agent.role, "instructions": agent.instructions,
        "model_source": agent.model_source_id, "temperature": agent.temperature, "max_new_tokens": agent.max_new_tokens,
        "tools": list(agent.tools or []), "trainable": agent.trainable,
        "created": stamp(agent.created), "updated": stamp(agent.updated),
        "api_url": absolute(request, reverse("api_agent", args=[agent.pk])),
    }


def topology_json(request: ApiRequest, topology: Topology) -> dict[str, Any]:
    return {
        "id": topology.pk, "name": topology.name, "environment": topology.environment, "env_args": topology.env_args or {},
        "specialization": topology.specialization, "max_turns": topology.max_turns,
        "agents": [a.pk for a in topology.ordered_agents()],
        "created": stamp(topology.created), "updated": stamp(topology.updated),
        "api_url": absolute(request, reverse("api_topology", args=[topology.pk])),
    }


def topology_saved_json(request: ApiRequest, topology: Topology) -> dict[str, Any]:
    """What a create or change answers: the topology and, as the page shows after saving, the notes
    its author should read (an agent's tools that its model's chat template cannot render)."""
    return {**topology_json(request, topology), "notes": catalog_selectors.tool_template_notes(agents=topology.ordered_agents())}


def dataset_json(request: ApiRequest, dataset: Dataset, *, detail: bool = False) -> dict[str, Any]:
    data = {
        "id": dataset.pk, "name": dataset.name, "kind": dataset.kind, "environment": dataset.environment,
        "env_args": dataset.env_args or {}, "size": dataset.size, "eval_size": dataset.eval_size,
        "original_filename": dataset.original_filename, "format": dataset.format, "size_bytes": dataset.size_bytes,
        "eval_fraction": dataset.eval_fraction, "row_count": dataset.row_count, "status": dataset.status,
        "status_message": dataset.status_message, "created": stamp(dataset.created),
        "api_url": absolute(request, reverse("api_dataset", args=[dataset.pk])),
    }
    if detail:
        data.update(schema=list(dataset.schema or []), preview=list(dataset.preview or []))
    return data


# == shared shapes ====================================================================================


def _delete(obj: Model, blocker: str | None, delete: Callable[[], None]) -> HttpResponse:
    """204 when deleted; 409 naming what still uses it."""
    if blocker:
        raise ApiError(409, blocker)
    delete()
    return HttpResponse(status=204)


def _created(payload: dict[str, Any]) -> JsonResponse:
    response = JsonResponse(payload, status=201)
    response["Location"] = payload["api_url"]
    return response


def _form_data(values: dict[str, Any]) -> dict[str, Any]:
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
        elif isinstance(value, float) and value.is_integer() and key in ("max_new_tokens", "model_source", "max_turns", "size", "eval_size"):
            data[key] = str(int(value))
        else:
            data[key] = value
    return data


# == model sources ====================================================================================


@endpoint("GET", "POST")
def models(request: ApiRequest) -> HttpResponse:
    if request.method == "GET":
        return page_of(request, ModelSource.objects.filter(team=request.team).order_by("pk"), model_source_json)
    body = json_fields(request, MODEL_SOURCE_FIELDS, bounds=False)
    return _created(model_source_json(request, _model_source_save(request, ModelSource(team=request.team), body, new=True)))


@endpoint("GET", "PATCH", "DELETE")
def model_detail(request: ApiRequest, pk: int) -> HttpResponse:
    source = ModelSource.objects.get(pk=pk, team=request.team)
    if request.method == "DELETE":
        return _delete(source, catalog_selectors.model_source_delete_blocker(source=source),
                       lambda: services.model_source_delete(source=source, actor=request.user))
    if request.method == "PATCH":
        source = _model_source_save(request, source, json_fields(request, MODEL_SOURCE_FIELDS, partial=True, bounds=False), new=False)
    return JsonResponse(model_source_json(request, source))


def _model_source_save(request: ApiRequest, source: ModelSource, fields: Fields, *, new: bool) -> ModelSource:
    body, problems = fields
    current = {"name": source.name, "source": source.source, "notes": source.notes}
    form = ModelSourceForm(_form_data({**current, **body}), instance=source)
    _check(form, body, MODEL_SOURCE_FIELDS, problems)
    return services.model_source_save(team=request.team, instance=None if new else source, actor=request.user, **form.cleaned_data)


# == agents ===========================================================================================


@endpoint("GET", "POST")
def agents(request: ApiRequest) -> HttpResponse:
    if request.method == "GET":
        return page_of(request, Agent.objects.filter(team=request.team).order_by("pk"), agent_json)
    body, problems = json_fields(request, AGENT_FIELDS, bounds=False)
    form = AgentForm(_form_data({"trainable": True, **body}), instance=Agent(team=request.team), team=request.team)
    _check(form, body, AGENT_FIELDS, problems)
    return _created(agent_json(request, services.agent_create(team=request.team, actor=request.user, **form.cleaned_data)))


@endpoint("GET", "PATCH", "DELETE")
def agent_detail(request: ApiRequest, pk: int) -> HttpResponse:
    agent = Agent.objects.get(pk=pk, team=request.team)
    if request.method == "DELETE":
        return _delete(agent, catalog_selectors.agent_delete_blocker(agent=agent), lambda: services.agent_delete(agent=agent, actor=request.user))
    if request.method == "PATCH":
        body, problems = json_fields(request, AGENT_FIELDS, partial=True, bounds=False)
        current = {name: getattr(agent, name) for name in AGENT_FIELDS if name != "model_source"}
        current["model_source"] = agent.model_source_id
        form = AgentForm(_form_data({**current, **body}), instance=agent, team=request.team)
        _check(form, body, AGENT_FIELDS, problems)
        agent = services.agent_update(agent=agent, **form.cleaned_data)
    return JsonResponse(agent_json(request, agent))


# == topologies =======================================================================================


@endpoint("GET", "POST")
def topologies(request: ApiRequest) -> HttpResponse:
    if request.method == "GET":
        return page_of(request, Topology.objects.filter(team=request.team).order_by("pk"), topology_json)
    body, problems = json_fields(request, TOPOLOGY_FIELDS, bounds=False)
    defaults = {"env_args": {}, "specialization": "lora", "max_turns": max(len(body.get("agents") or []), 1)}
    form = TopologyForm(_form_data({**defaults, **body}), instance=Topology(team=request.team), team=request.team)
    _check(form, body, TOPOLOGY_FIELDS, problems)
    return _created(topology_saved_json(request, services.topology_create(team=request.team, actor=request.user, **form.cleaned_data)))


@endpoint("GET", "PATCH", "DELETE")
def topology_detail(request: ApiRequest, pk: int) -> HttpResponse:
    topology = Topology.objects.get(pk=pk, team=request.team)
    if request.method == "DELETE":
        return _delete(topology, catalog_selectors.topology_delete_blocker(topology=topology),
                       lambda: services.topology_delete(topology=topology, actor=request.user))
    if request.method == "PATCH":
        body, problems = json_fields(request, TOPOLOGY_FIELDS, partial=True, bounds=False)
        current = {name: getattr(topology, name) for name in TOPOLOGY_FIELDS if name != "agents"}
        current["agents"] = [a.pk for a in topology.ordered_agents()]
        form = TopologyForm(_form_data({**current, **body}), instance=topology, team=request.team)
        _check(form, body, TOPOLOGY_FIELDS, problems)
        topology = services.topology_update(topology=topology, **form.cleaned_data)
        return JsonResponse(topology_saved_json(request, topology))
    return JsonResponse(topology_json(request, topology))


# == datasets =========================================================================================


@upload_view
@endpoint("GET", "POST")
def datasets(request: ApiRequest) -> HttpResponse:
    if request.method == "GET":
        return page_of(request, Dataset.objects.filter(team=request.team).order_by("pk"), dataset_json)
    if (request.content_type or "") == "multipart/form-data":
        return _upload(request)
    body, problems = json_fields(request, GENERATOR_FIELDS, bounds=False)
    form = DatasetGeneratorForm(_form_data({"env_args": {}, **body}))
    _check(form, body, GENERATOR_FIELDS, problems)
    dataset = services.dataset_generator_create(team=request.team, actor=request.user, **form.cleaned_data)
    return _created(dataset_json(request, dataset, detail=True))


def _upload(request: ApiRequest) -> HttpResponse:
    """A JSONL or CSV file (`file`) with `name`, `environment` and `eval_fraction` beside it."""
    unknown = sorted(set(request.POST) - set(UPLOAD_FIELDS)) + sorted(set(request.FILES) - {"file"})
    data = request.POST.copy()
    data.setdefault("eval_fraction", "0.1")
    form = DatasetUploadForm(data, request.FILES)
    _check(form, {}, UPLOAD_FIELDS, {k: [f"Unknown field; send file, {', '.join(UPLOAD_FIELDS)}."] for k in unknown})
    dataset = services.dataset_upload(team=request.team, upload=form.cleaned_data.pop("file"), actor=request.user, **form.cleaned_data)
    return _created(dataset_json(request, dataset, detail=True))


@endpoint("GET", "DELETE")
def dataset_detail(request: ApiRequest, pk: int) -> HttpResponse:
    dataset = Dataset.objects.get(pk=pk, team=request.team)
    if request.method == "DELETE":
        return _delete(dataset, catalog_selectors.dataset_delete_blocker(dataset=dataset),
                       lambda: services.dataset_delete(dataset=dataset, actor=request.user))
    return JsonResponse(dataset_json(request, dataset, detail=True))


def _check(form: Any, body: dict[str, Any], spec: dict[str, Field], problems: dict[str, list[str]] | None = None) -> None:
    """Every problem at once, or nothing: the body's own (`json_fields`: unknown fields, wrong
    types, missing ones), then the form's for the other fields, then the body's bounds (in case the
    form has none for a field the document bounds)."""
    errors = dict(problems or {})
    for key, messages in form.errors.items():
        errors.setdefault(key, [str(m) for m in messages])
    for key, messages in out_of_bounds(body, spec).items():
        errors.setdefault(key, messages)
    if errors:
        raise ValidationError(errors)

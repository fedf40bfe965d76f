"""The OpenAPI 3.1 document of the JSON API, served at /api/v1/openapi.json (no token needed: it
describes the endpoints, it holds no data).

The request bodies are made from the same field lists the endpoints check bodies against
(`webapp/api/catalog.py`, `jobs.py`, `views.py`), and `tests/webapp/api/test_openapi.py` runs
schemathesis against this document: every generated request must get an answer the document
allows, in status, content type and shape, and never a 5xx.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET

from webapp.api import jobs, routes
from webapp.api.http import PER_PAGE_MAX, QUERY_NAMES, Field
from webapp.api.runs import LAUNCH_FIELDS, METRICS_LIMIT_MAX, ROLLOUTS_LIMIT_MAX
from webapp.core.values import ID_MAX
from webapp.models import Job, Run

JSON = "application/json"


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(kind: str, **extra: Any) -> dict[str, Any]:
    return {"type": [kind, "null"], **extra}


def obj(properties: Mapping[str, Any], *, required: bool = True) -> dict[str, Any]:
    """An object schema; every property is present in the answers (`required`)."""
    out: dict[str, Any] = {"type": "object", "properties": dict(properties)}
    if required:
        out["required"] = list(properties)
    return out


def body_schema(fields: Mapping[str, Field], *, partial: bool = False) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object", "additionalProperties": False,
        "properties": {name: field.schema() for name, field in fields.items()},
    }
    required = [name for name, field in fields.items() if field.required and not partial]
    if required:
        schema["required"] = required
    return schema


def json_body(fields: Mapping[str, Field], *, partial: bool = False) -> dict[str, Any]:
    return {"required": True, "content": {JSON: {"schema": body_schema(fields, partial=partial)}}}


def answer(description: str, schema: dict[str, Any] | None = None, media: str = JSON) -> dict[str, Any]:
    return {"description": description, **({"content": {media: {"schema": schema}}} if schema is not None else {})}


ERRORS = {
    "400": "Bad input: `fields` names each problem.",
    "401": "No valid API token.",
    "404": "Not found, or not your team's.",
    "409": "In use: the message says by what.",
    "413": "The body is too large.",
    "415": "The body is not of a type this endpoint reads.",
}


def operation(summary: str, ok: Mapping[str, dict[str, Any]], *errors: str, **extra: Any) -> dict[str, Any]:
    responses = dict(ok)
    for code in ("401", *errors):
        responses[code] = answer(ERRORS[code], ref("Error"))
    return {"summary": summary, "responses": responses, **extra}


def query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


PAGING = [
    query("page", {"type": "integer", "minimum": 1}, "Page number (1 is the first); past the last page is a 404."),
    query("per_page", {"type": "integer", "minimum": 1, "maximum": PER_PAGE_MAX}, "Results per page."),
]


def page(item: str) -> dict[str, Any]:
    return obj({
        "count": {"type": "integer"}, "page": {"type": "integer"}, "pages": {"type": "integer"},
        "next": nullable("string"), "previous": nullable("string"), "results": {"type": "array", "items": ref(item)},
    })


ID = {"name": "id", "in": "path", "required": True, "schema": {"type": "integer", "minimum": 1}, "description": "An id; one past the database's range is a 404."}
RUN_ID = {**ID, "description": "A run of the token's team."}
STAMP = {"type": "string", "format": "date-time"}
MAYBE_STAMP = nullable("string", format="date-time")


SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object", "required": ["error", "field", "fields"],
        "properties": {
            "error": {"type": "string", "description": "What is wrong, in a sentence."},
            "field": nullable("string", description="The first field at fault, if any."),
            "fields": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}},
                       "description": "Every field at fault with its messages (`__all__`: the object as a whole)."},
        },
    },
    "Job": obj({
        "id": {"type": "integer"}, "kind": {"type": "string", "enum": list(Job.Kind.values)},
        "status": {"type": "string", "enum": list(Job.Status.values)}, "run": nullable("integer"),
        "checkpoint_step": nullable("integer"), "dataset": nullable("integer"), "topology": nullable("integer"),
        "owner": nullable("string"), "created": STAMP, "started": MAYBE_STAMP, "finished": MAYBE_STAMP,
        "error": {"type": "string"}, "result": {"type": "object", "description": "evaluations, or the playground's lanes and turns"},
        "api_url": {"type": "string"},
    }),
    "Run": obj({
        "id": {"type": "integer"}, "name": {"type": "string"}, "status": {"type": "string", "enum": list(Run.Status.values)},
        "step": {"type": "integer"}, "total_steps": {"type": "integer"}, "environment": {"type": "string"},
        "specialization": {"type": "string"}, "algorithm": {"type": "string", "enum": ["grpo", "sft"]},
        "topology": {"oneOf": [{"type": "null"}, obj({"id": {"type": "integer"}, "name": {"type": "string"}})]},
        "dataset": {"oneOf": [{"type": "null"}, obj({"id": {"type": "integer"}, "name": {"type": "string"}})]},
        "owner": nullable("string"), "tags": {"type": "array", "items": {"type": "string"}}, "notes": {"type": "string"},
        "archived": {"type": "boolean"}, "created": STAMP, "started": MAYBE_STAMP, "finished": MAYBE_STAMP,
        "final_metrics": {"type": "object"}, "error": {"type": "string"}, "resumed_from": nullable("integer"),
        "url": {"type": "string"}, "api_url": {"type": "string"},
    }),
    "Evaluations": obj({
        "training": {"type": "array", "items": obj({
            "step": {"type": "integer"}, "temperature": {"type": "number"}, "team_success": {"type": "number"},
            "agents": {"type": "object"}, "n": nullable("integer"),
        })},
        "jobs": {"type": "array", "items": obj({
            "id": {"type": "integer"}, "status": {"type": "string"}, "checkpoint_step": nullable("integer"),
            "dataset": nullable("string"), "created": STAMP, "error": {"type": "string"},
            "ablation": nullable("string", description="role_swap, untrained or alone:<agent> for an ablation; null otherwise"),
            "results": {"type": "array", "items": {"type": "object"}},
        })},
    }),
    "RunDetail": {"allOf": [ref("Run"), obj({
        "config_yaml": {"type": "string"}, "evaluations": ref("Evaluations"),
        "started_from": {"oneOf": [{"type": "null"}, obj({"run": nullable("integer", description="null: the checkpoint is no longer "
                                                                                             "one of the team's"), "step": {"type": "integer"}})]},
        "warm_started": {"type": "array", "items": {"type": "integer"}, "description": "Runs started from one of this run's checkpoints."},
        "artifacts": obj({
            "files": {"type": "object", "additionalProperties": {"type": "string"}},
            "checkpoints": {"type": "array", "items": {"type": "object"}},
            "merged": {"type": "array", "items": {"type": "object"}},
        }),
    })]},
}

TEXT_FILTER = {"type": "string"}
RUN_FILTERS = [
    query(name, TEXT_FILTER, f"{description} (as on the run list: a value it does not know is ignored, text past 200 characters is cut)")
    for name, description in (
        ("q", "Text in the name, notes or tags"), ("status", "A run status"), ("tag", "A tag"),
        ("topology", "A topology's id"), ("dataset", "A dataset's id"), ("owner", "A user's id"),
        ("environment", "An environment"), ("specialization", "A specialization"),
        ("created_from", "Created on or after this day (YYYY-MM-DD)"), ("created_to", "Created on or before this day (YYYY-MM-DD)"),
        ("sort", "created, -created, name, status, or a final metric, e.g. -eval/team_success"),
        ("archived", "`all` or `only`"),
    )
]

PATHS: dict[str, Any] = {
    "/api/v1/": {"get": operation("Who the token is: user, team, and the endpoints", {"200": answer("Who", {"type": "object"})})},
    "/api/v1/runs/": {
        "get": operation("The team's runs, filtered and sorted like the run list", {"200": answer("A page", page("Run"))},
                         "400", "404", parameters=[*RUN_FILTERS, PAGING[0], {**PAGING[1], "description": "Results per page (default 25)."}]),
        "post": operation(
            "Launch a run: a YAML config as the body, or JSON {config, topology, dataset, name, tags, notes}",
            {"201": answer("The queued run (Location: its URL)", ref("Run"))}, "400", "413", "415",
            parameters=[query("dataset", {"type": "integer", "minimum": 1, "maximum": ID_MAX}, "A dataset of the team (YAML bodies)."),
                        query("topology", {"type": "integer", "minimum": 1, "maximum": ID_MAX},
                              "A topology of the team: its model and agents (YAML bodies).")],
            requestBody={"required": True, "content": {
                "application/yaml": {"schema": {"type": "object", "description": "The run config: a YAML mapping of its sections "
                                                                                  "(model, topology, data, grpo, optim, ...)."}},
                JSON: {"schema": body_schema(LAUNCH_FIELDS)},
            }},
        ),
    },
    "/api/v1/runs/{id}/": {"parameters": [RUN_ID], "get": operation("One run, with its config, evaluations and artifacts",
                                                                      {"200": answer("The run", ref("RunDetail"))}, "404")},
    "/api/v1/runs/{id}/cancel/": {"parameters": [RUN_ID], "post": operation(
        "Cancel a queued or running run (a finished one is left as it is)", {"200": answer("The run", ref("Run"))}, "404")},
    "/api/v1/runs/{id}/metrics/": {"parameters": [RUN_ID], "get": operation(
        "Metric points with step > after, in step order", {"200": answer("Points", obj({
            "results": {"type": "array", "items": obj({"step": {"type": "integer"}, "time": STAMP,
                                                        "values": {"type": "object"}, "agents": {"type": "object"}})},
            "next": nullable("string"),
        }))}, "400", "404",
        parameters=[query("after", {"type": "integer", "minimum": -1}, "Only steps after this one."),
                    query("limit", {"type": "integer", "minimum": 1, "maximum": METRICS_LIMIT_MAX}, "At most this many (500).")])},
    "/api/v1/runs/{id}/rollouts/": {"parameters": [RUN_ID], "get": operation(
        "Episodes with id > after, in recording order", {"200": answer("Episodes", obj({
            "results": {"type": "array", "items": obj({
                "id": {"type": "integer"}, "step": {"type": "integer"}, "episode": {"type": "integer"},
                "success": {"type": "boolean"}, "team_reward": {"type": "number"}, "data": {"type": "object"}})},
            "next": nullable("string"),
        }))}, "400", "404",
        parameters=[query("after", {"type": "integer", "minimum": 0}, "Only episodes after this id."),
                    query("limit", {"type": "integer", "minimum": 1, "maximum": ROLLOUTS_LIMIT_MAX}, "At most this many (20)."),
                    query("step", {"type": "integer", "minimum": 0}, "Only this training step.")])},
    "/api/v1/runs/{id}/evaluations/": {
        "parameters": [RUN_ID],
        "get": operation("The run's held-out evaluations and evaluation jobs",
                         {"200": answer("Evaluations", obj({"results": ref("Evaluations")}))}, "404"),
        "post": operation("Evaluate a checkpoint (or the base models) on a dataset's held-out split",
                          {"202": answer("The queued job (Location: its URL)", ref("Job"))}, "400", "404", "415",
                          requestBody=json_body(jobs.EVALUATION_FIELDS)),
    },
    "/api/v1/runs/{id}/ablations/": {
        "parameters": [RUN_ID],
        "get": operation("The ablations the finished team run allows now, and its ablation jobs (newest first)",
                         {"200": answer("Ablations", obj({
                             "available": {"type": "array", "items": obj({
                                 "kind": {"type": "string", "enum": ["role_swap", "untrained", "alone"]}, "agent": nullable("string"),
                                 "key": {"type": "string"}, "label": {"type": "string"}})},
                             "jobs": {"type": "array", "items": {"allOf": [ref("Job"), obj({"ablation": {"type": "string"}})]}},
                         }))}, "404"),
        "post": operation("Evaluate the run's team with its roles swapped, untrained, or one agent alone, on its held-out "
                          "tasks (an evaluation job; each result carries `ablation`)",
                          {"202": answer("The queued job (Location: its URL)", ref("Job"))}, "400", "404", "415",
                          requestBody=json_body(jobs.ABLATION_FIELDS)),
    },
    "/api/v1/runs/{id}/artifacts/{name}": {
        "parameters": [RUN_ID, {"name": "name", "in": "path", "required": True,
                                "schema": {"type": "string", "enum": ["config.yaml", "metrics.csv", "metrics.jsonl", "rollouts.jsonl"]}}],
        "get": operation("One of the run's files", {"200": {"description": "The file", "content": {
            "application/yaml": {}, "text/csv": {}, "application/x-ndjson": {}}}}, "404"),
    },
    "/api/v1/runs/{id}/artifacts/checkpoints/{step}/{name}.zip": {
        "parameters": [RUN_ID, {"name": "step", "in": "path", "required": True, "schema": {"type": "integer", "minimum": 0}},
                       {"name": "name", "in": "path", "required": True, "schema": {"type": "string", "pattern": "^[^/]+$"},
                        "description": "An agent's (or the shared) policy."}],
        "get": operation("One policy of a checkpoint, zipped", {"200": answer("A zip", {"type": "string", "format": "binary"},
                                                                              "application/zip")}, "404"),
    },
    "/api/v1/runs/{id}/artifacts/merged/{job}.zip": {
        "parameters": [RUN_ID, {"name": "job", "in": "path", "required": True, "schema": {"type": "integer", "minimum": 1}}],
        "get": operation("A merged export, zipped", {"200": answer("A zip", {"type": "string", "format": "binary"},
                                                                  "application/zip")}, "404"),
    },
    "/api/v1/playground/": {"post": operation(
        "Play one task with a topology's base models, or with a run's checkpoint",
        {"202": answer("The queued job (Location: its URL)", ref("Job"))}, "400", "415",
        requestBody=json_body(jobs.PLAYGROUND_FIELDS))},
    "/api/v1/jobs/": {"get": operation(
        "The team's evaluation, export and playground jobs, newest first", {"200": answer("A page", page("Job"))}, "400", "404",
        parameters=[query("kind", {"type": "string", "enum": list(jobs.JOB_KINDS)}, "Only this kind."),
                    query("status", {"type": "string", "enum": list(jobs.JOB_STATUSES)}, "Only this status."), *PAGING])},
    "/api/v1/jobs/{id}/": {"parameters": [ID], "get": operation("One job; poll it until it has finished",
                                                                 {"200": answer("The job", ref("Job"))}, "404")},
}


def document_for(server: str) -> dict[str, Any]:
    generated = routes.document_paths()
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Troupe API", "version": "1",
            "description": "Everything a team member can do from a script. Create a token on the API tokens page and send "
                           "`Authorization: Bearer <token>`; every object is your token's team's, another team's is a 404.",
        },
        "servers": [{"url": server}],
        "security": [{"token": []}],
        "components": {"securitySchemes": {"token": {"type": "http", "scheme": "bearer"},
                                           **generated["components"].get("securitySchemes", {})},
                       "schemas": {**SCHEMAS, **generated["components"].get("schemas", {})}},
        "paths": {**PATHS, **generated["paths"]},
    }


@csrf_exempt  # no cookie authenticates the API: a POST here is a 405, not a CSRF refusal
@login_not_required
@require_GET
def document(request: HttpRequest) -> JsonResponse:
    return JsonResponse(document_for(request.build_absolute_uri("/").rstrip("/")), json_dumps_params={"indent": 1})



for _path, _item in PATHS.items():
    for _method in ("get", "post", "patch", "delete"):
        if _method in _item:
            _parameters = [*_item.get("parameters", []), *_item[_method].get("parameters", [])]
            QUERY_NAMES[(_path, _method)] = frozenset(p["name"] for p in _parameters if p["in"] == "query")

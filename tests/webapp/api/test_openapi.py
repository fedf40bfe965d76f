"""The OpenAPI document at /api/v1/openapi.json describes the API as it is: every API URL with the
methods its view allows, and (schemathesis, property-based) for every request generated from the
document, valid or not, an answer the document allows in status, content type and shape, never a
5xx, and never a byte of another team's objects nor a change to them."""

from __future__ import annotations

import json
from typing import Any

import pytest
import schemathesis
from django.core import signals
from django.core.handlers.wsgi import WSGIHandler
from django.db import close_old_connections, connection
from django.urls import URLPattern, URLResolver, get_resolver
from hypothesis import HealthCheck, given, settings
from schemathesis import checks
from schemathesis.core.failures import Failure

from tests.webapp.conftest import make_world
from webapp.api.http import path_template
from webapp.api.openapi import document_for
from webapp.models import Agent, Dataset, Grader, Job, ModelSource, Run, Task, Topology
from webapp.teams import services as tokens

SECRET = "bravo-secret"
"""In the name of every object of the other team: no answer to Alpha's token may contain it."""


def api_urls() -> dict[str, tuple[str, ...]]:
    """OpenAPI path template -> methods, for every URL pattern under /api/v1/ (from the URLconf)."""
    out: dict[str, tuple[str, ...]] = {}

    def walk(patterns: list[Any], prefix: str) -> None:
        for p in patterns:
            if isinstance(p, URLResolver):
                walk(p.url_patterns, prefix + str(p.pattern))
            elif isinstance(p, URLPattern):
                route = prefix + str(p.pattern)
                if route.startswith("api/v1/"):
                    out[path_template(route)] = tuple(m.lower() for m in getattr(p.callback, "api_methods", ("GET",)))

    walk(get_resolver().url_patterns, "")
    return out


def test_the_document_lists_every_api_url_with_the_methods_its_view_allows(client):
    response = client.get("/api/v1/openapi.json")
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    doc = response.json()
    assert doc["openapi"].startswith("3.1") and doc["servers"] == [{"url": "http://testserver"}]
    documented = {path: tuple(sorted(k for k in ops if k != "parameters")) for path, ops in doc["paths"].items()}
    urls = api_urls()
    urls.pop("/api/v1/openapi.json")
    assert documented == {path: tuple(sorted(methods)) for path, methods in urls.items()}


def test_the_api_answers_json_404s_for_unknown_paths(client):
    response = client.get("/api/v1/no-such-thing/")
    assert response.status_code == 404 and response["Content-Type"] == "application/json" and "openapi" in response.json()["error"]
    assert client.get("/no-such-page/")["Content-Type"].startswith("text/html")


# == schemathesis =======================================================================================


@pytest.fixture
def teams(alice, bob, data_dir, enqueued, jobs_sent) -> dict[str, Any]:
    """Alpha (the token's team) and Bravo, each with a model, agents, a topology, a dataset and a
    run, and Bravo with a grader and a task; Bravo's names carry SECRET. Nothing is sent to a queue (enqueued, jobs_sent)."""
    make_world(alice.team)
    bravo = make_world(bob.team)
    for obj in (bravo.source, bravo.tool, bravo.reasoner, bravo.topology, bravo.dataset, bravo.run):
        type(obj).objects.filter(pk=obj.pk).update(name=f"{SECRET}-{obj.name}")
    Grader.objects.create(team=bob.team, name="secret", kind="exact", description=SECRET, settings={"column": "answer"})
    Task.objects.create(team=bob.team, name=f"{SECRET}-task", roles=[{"name": "a", "prompt": "{question}", "grader": "secret"}])
    return {"token": tokens.api_token_create(user=alice.user, team=alice.team, name="fuzz")[1], "bravo": bob.team}


def bravo_state(team) -> list[Any]:
    return [list(model.objects.filter(team=team).order_by("pk").values()) for model in (ModelSource, Agent, Topology, Dataset, Run, Job, Grader, Task)]


def leaks_nothing(ctx: Any, response: Any, case: Any) -> bool:
    """A check: the answer holds nothing of the other team's."""
    if SECRET in response.text:
        raise Failure(operation=case.operation.label, title="Another team's object in the answer",
                      message=f"{case.method} {case.formatted_path} answered with {SECRET}", code=response.status_code)
    return True


@pytest.fixture
def wsgi_app():
    """Django's WSGI handler, as Django's test client runs it: a request's end does not close the
    test's database connection (the test's transaction holds both teams' rows)."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield WSGIHandler()
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


CHECKS = [checks.not_a_server_error, checks.status_code_conformance, checks.content_type_conformance,
          checks.response_schema_conformance, checks.negative_data_rejection, leaks_nothing]


schema = schemathesis.openapi.from_dict(document_for("http://testserver"))

EXAMPLES = 8 if connection.vendor == "postgresql" else 40
"""Generated requests per operation. The suite lane (SQLite) explores with 40. The PostgreSQL lane
asks what only the database changes (it refuses NUL characters and integers past its column types,
where SQLite stores them): 8 per operation, the edge cases hypothesis tries first, at a fifth of the
cost; test_hostile_input.py sends such values (NUL characters, 64-digit numbers) to the API's query
parameters, names and bodies on PostgreSQL too."""


OPERATIONS = [result.ok() for result in schema.get_all_operations()]
"""Every operation of the document, one test each. A plain parametrize over them, not schemathesis'
`schema.parametrize()`, whose per-operation tests pytest-xdist does not see: under two workers only
one of them ran."""


@pytest.mark.slow
@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda operation: operation.label)
def test_no_generated_request_breaks_the_api_or_reaches_another_team(operation, teams, wsgi_app):
    @given(case=operation.as_strategy())
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    def one_request(case: Any) -> None:
        before = bravo_state(teams["bravo"])
        case.call_and_validate(app=wsgi_app, headers={"Authorization": f"Bearer {teams['token']}"}, checks=CHECKS)
        assert bravo_state(teams["bravo"]) == before

    one_request()


def test_a_server_error_under_the_api_is_json(rf):
    from webapp.api.http import server_error

    response = server_error(rf.get("/api/v1/runs/"))
    assert response.status_code == 500 and response["Content-Type"] == "application/json" and "log" in json.loads(response.content)["error"]
    assert server_error(rf.get("/runs/"))["Content-Type"].startswith("text/html")

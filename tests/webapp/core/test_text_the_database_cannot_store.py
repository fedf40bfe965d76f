"""Text that no database can store is refused with a 400 naming the field (issue 45, class 7).

A lone surrogate (`"\\ud800"`: half of a UTF-16 pair, which UTF-8 cannot encode) in a model's notes,
an agent's instructions or a conversations file gave 500s on SQLite and PostgreSQL alike; a NUL in
a conversations file's `agent` did on PostgreSQL (text and jsonb hold no NUL). Every way text comes
in is checked: every JSON body of the API (each field of each endpoint, keys included), YAML
configs, the forms' JSON fields, uploaded conversations; what the engine reports (model output) is
made storable instead. Run with DATABASE_URL pointing at PostgreSQL too (the `postgres` lane)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from tests.webapp.api.test_api import TINY_CONFIG, Api
from training.config import ConfigError
from webapp.api.openapi import document_for
from webapp.core import trust
from webapp.core.values import storable
from webapp.models import Agent, Dataset, Experiment, Grader, Job, ModelSource, Run, Task, Topology
from webapp.teams import services as tokens

SURROGATE, LOW_SURROGATE, NUL = "\ud800", "\udfff", "\x00"
ROWS = (ModelSource, Agent, Topology, Dataset, Run, Job, Experiment, Grader, Task)


@pytest.fixture
def api(alice) -> Api:
    return Api(tokens.api_token_create(user=alice.user, team=alice.team, name="notebook")[1])


def _rows() -> dict[str, list[dict[str, Any]]]:
    return {model.__name__: list(model.objects.order_by("pk").values()) for model in ROWS}


def _json_types(properties: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    """A body schema's fields with the JSON types each takes (null aside)."""
    return {name: tuple(o["type"] for o in prop.get("anyOf", [prop]) if o.get("type", "null") != "null") for name, prop in properties.items()}


def _endpoints(world: Any) -> list[tuple[str, str, dict[str, Any]]]:
    """(method, path, the fields of its JSON body with their JSON types) for every operation of the
    API's document that takes a JSON body: a new endpoint is in this test without a line here."""
    document = document_for("http://testserver")
    grader = Grader.objects.create(team=world.run.team, name="g", kind="exact", settings={"column": "answer"})
    task = Task.objects.create(team=world.run.team, name="t", roles=[{"name": "a", "prompt": "{question}", "grader": "g"}])
    experiment = Experiment.objects.create(team=world.run.team, name="e", spec_yaml="")  # (its body is read before its spec)
    ids = {"experiments": experiment.pk, "runs": world.run.pk, "models": world.source.pk, "agents": world.tool.pk, "topologies": world.topology.pk,
           "datasets": world.dataset.pk, "graders": grader.pk, "tasks": task.pk}
    out = []
    for path, item in document["paths"].items():
        for method, operation in item.items():
            content = (operation.get("requestBody") or {}).get("content", {}).get("application/json")
            if content is None:
                continue
            schema = content["schema"]
            if "$ref" in schema:
                schema = document["components"]["schemas"][schema["$ref"].rpartition("/")[2]]
            url = path.replace("{id}", str(ids[path.removeprefix("/api/v1/").split("/")[0]])) if "{id}" in path else path
            out.append((method.upper(), url, _json_types(schema["properties"])))
    return out


def _hostile(kind: Any, bad: str) -> list[tuple[Any, str]]:
    """(a value of this kind holding `bad`, where in it the error must point)."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    out: list[tuple[Any, str]] = []
    if "string" in kinds:
        out.append((f"ok{bad}ok", ""))
    if "array" in kinds:
        out.append(([f"x{bad}"], "[0]"))
    if "object" in kinds:
        out += [({"k": {"deep": f"{bad}"}}, ".k.deep"), ({f"k{bad}": 1}, "")]
    return out


@pytest.mark.parametrize("bad", [SURROGATE, LOW_SURROGATE, NUL], ids=["lone high surrogate", "lone low surrogate", "NUL"])
def test_every_text_field_of_every_api_body_refuses_what_no_database_stores(alice, alice_world, api, enqueued, jobs_sent, bad):
    Run.objects.filter(pk=alice_world.run.pk).update(status=Run.Status.SUCCEEDED)  # evaluations and ablations read their body
    endpoints = _endpoints(alice_world)
    before = _rows()
    tried = []
    for method, path, spec in endpoints:
        for field, declared in spec.items():
            for value, inside in _hostile(declared, bad):
                body = json.dumps({field: value})  # ensure_ascii: the character travels as a \\u escape, as a script sends it
                response = api.client.generic(method, path, body, content_type="application/json", headers=api.headers)
                tried.append((method, path, field))
                assert response.status_code == 400, (method, path, field, value, response.content[:300])
                named = response.json()["field"]
                assert named == f"body.{field}{inside}" or (inside == "" and named == f"body.{field}"), (path, field, named)
                assert "NUL" in response.json()["error"] or "surrogate" in response.json()["error"]
    assert {(m, p.split('/')[3]) for m, p, _ in tried} >= {('POST', 'graders'), ('PATCH', 'tasks'), ('POST', 'runs')}
    assert len(tried) > 40 and _rows() == before and enqueued == [] and jobs_sent == []


@pytest.mark.parametrize("text", ['name: "a\\ud800"\n', 'notes: "a\\udc00"\n', '"\\ud800": 1\n', 'grpo: {k: 4}\nname: "\\0"\n'])
def test_yaml_configs_refuse_it_too(alice, alice_world, api, enqueued, text):
    with pytest.raises(ConfigError, match="surrogate|NUL"):
        trust.yaml_load(text)
    response = api.post(reverse("api_runs"), TINY_CONFIG.replace("name: from a notebook\n", "") + text)
    assert response.status_code == 400 and response.json()["field"].startswith("yaml"), response.content
    assert Run.objects.count() == 1 and enqueued == []


def test_a_forms_json_field_refuses_it(alice, alice_world):
    response = alice.client.post(reverse("topology_edit", args=[alice_world.topology.pk]), {
        "name": "duo", "environment": "math_tool", "env_args": '{"level": "\\ud800"}', "specialization": "lora", "max_turns": 2,
        "agents": [alice_world.tool.pk, alice_world.reasoner.pk]})
    assert response.status_code in (200, 400) and "surrogate" in response.content.decode()
    assert Topology.objects.get(pk=alice_world.topology.pk).env_args == {"level": 1}


CONVERSATION = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}], "agent": "reasoner"}


@pytest.mark.parametrize(("change", "says"), [
    (lambda c: c["messages"][0].update(content="2+2?\ud800"), "line 2: `messages[0].content` contains a lone surrogate (U+D800)"),
    (lambda c: c["messages"][1].update(content="\udc004"), "line 2: `messages[1].content` contains a lone surrogate (U+DC00)"),
    (lambda c: c.update(agent="rea\x00soner"), "line 2:"),
    (lambda c: c.update(agent="rea\ud800soner"), "line 2:"),
])
def test_an_uploaded_conversation_holding_it_is_refused_with_its_line(alice, data_dir, change, says):
    bad = json.loads(json.dumps(CONVERSATION))
    change(bad)
    content = (json.dumps(CONVERSATION) + "\n" + json.dumps(bad) + "\n").encode()
    response = alice.client.post(reverse("dataset_upload_conversations"), {
        "name": "demos", "environment": "math_tool", "file": SimpleUploadedFile("demos.jsonl", content)})
    assert response.status_code == 200, response.status_code
    errors = " ".join(response.context["form"].errors["file"])
    assert says in errors, errors
    assert not Dataset.objects.filter(name="demos").exists()


def test_what_the_engine_reports_is_made_storable():
    assert storable({"a\x00": ["b\ud800c", "\udfff", 1.0, float("nan")], "ok": "😀"}) == {"a\ufffd": ["b\ufffdc", "\ufffd", 1.0, None], "ok": "😀"}


def test_real_text_in_any_script_still_passes():
    tree = trust.json_load('{"notes": "caf\\u00e9 \\ud83d\\ude80 \\u5b66\\u7fd2", "k\\u00e9y": ["\\u0416"]}')
    assert tree == {"notes": "café 🚀 学習", "kéy": ["Ж"]}  # a surrogate *pair* is one character: fine

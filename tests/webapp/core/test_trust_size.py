"""The trust boundary, size class: YAML aliases are refused before anything expands, and depth,
strings, lists, mappings and whole bodies are bounded, on every way in (API YAML and JSON, the
run form, its preview, the topology and dataset forms, the playground). Each refusal is a 400 or
a form error naming the field and the limit, and nothing is saved."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from tests.webapp.api.test_api import TINY_CONFIG, Api
from tests.webapp.core.test_trust_code import _form
from training.config import ConfigError
from webapp.core import trust
from webapp.models import Dataset, Run, Topology
from webapp.teams import services as tokens

LAUGHS = """
topology:
  env_args:
    a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
    b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
    c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
    d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
    e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
    f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
    g: [*f, *f, *f, *f, *f, *f, *f, *f, *f]
"""

ALIAS_SHAPES = [
    LAUGHS,
    "base: &b {k: 4}\ngrpo:\n  <<: *b\n",  # a merge key
    "grpo: &g {k: 4}\nother: *g\n",  # a plain alias of a mapping
    "name: &n run\ntags: [*n, *n]\n",  # an alias of a scalar
    "a: &x [&y [1], *y]\n",  # nested anchors
]

DEEP_YAML = "topology: {env_args: {x: " + "[" * 200 + "]" * 200 + "}}\n"
DEEP_JSON = '{"config": {"topology": {"env_args": {"x": ' + "[" * 5000 + "]" * 5000 + "}}}}"


@pytest.fixture
def api(alice) -> Api:
    return Api(tokens.api_token_create(user=alice.user, team=alice.team, name="notebook")[1])


@pytest.mark.parametrize("text", ALIAS_SHAPES)
def test_yaml_aliases_are_refused_before_they_expand(text):
    with pytest.raises(ConfigError, match=r"YAML aliases \(\*\w+\) are not accepted \(line \d+\)") as err:
        trust.yaml_load(text, field="yaml")
    assert err.value.field == "yaml"


@pytest.mark.parametrize(("text", "says"), [
    (DEEP_YAML, "nested more than 12 levels deep"),
    ("x: " + "a" * (trust.MAX_STRING + 1) + "\n", "characters; the limit is 20,000"),
    ("x: " + "9" * 5000 + "\n", "not valid YAML"),  # beyond Python's int digit limit: an error, not a 500
    ("x: [" + ", ".join("1" for _ in range(trust.MAX_ITEMS + 1)) + "]\n", "items; the limit is 512"),
    ("x: {" + ", ".join(f"k{i}: 1" for i in range(trust.MAX_ITEMS + 1)) + "}\n", "entries; the limit is 512"),
    ("{1: 2}\n", "keys must be text"),
    ("x: 2026-11-23\n", "must be plain data"),
    ("x: !!binary aGVsbG8=\n", "must be plain data"),
    ("x: !!python/object:os.system {}\n", "not valid YAML"),
    ("#" * (trust.MAX_CONFIG_BYTES + 1), "bytes; the limit is 65,536"),
    ("grpo: [unclosed\n", "not valid YAML"),
])
def test_yaml_is_bounded(text, says):
    with pytest.raises(ConfigError, match=says):
        trust.yaml_load(text, field="yaml")


@pytest.mark.parametrize("body", [DEEP_JSON, '{"config": ' + "9" * 5000 + "}", '{"a": ' + '"x", "a": ' * 10 + '"y"}' + " " * 200_000])
def test_json_is_bounded(body):
    with pytest.raises(ConfigError):
        trust.json_load(body.encode(), field="body")


def test_the_api_refuses_an_alias_bomb_deep_json_and_a_huge_body(alice, api):
    for body, content_type, field in ((TINY_CONFIG + LAUGHS, "application/yaml", "yaml"),
                                      (DEEP_JSON, "application/json", "body"),
                                      (TINY_CONFIG + "notes: '" + "x" * 70_000 + "'\n", "application/yaml", "yaml"),
                                      (json.dumps({"config": TINY_CONFIG + LAUGHS}), "application/json", "config")):
        response = api.post(reverse("api_runs"), body, content_type=content_type)
        assert response.status_code == 400, response.content
        error = response.json()["error"]
        assert response.json()["field"] == field and ("limit" in error or "aliases" in error or "nested more than" in error), error
    assert not Run.objects.exists()


def test_the_api_refuses_oversized_env_args(alice, api):
    big = json.dumps({"config": {**_tiny(), "topology": {**_tiny()["topology"], "env_args": {"blob": ["x" * 1000] * 100}}}})
    response = api.post(reverse("api_runs"), big, content_type="application/json")
    assert response.status_code == 400 and response.json()["field"] == "topology.env_args", response.content
    assert "limit is 16,384" in response.json()["error"]


@pytest.mark.parametrize("timeout_s", ["1e9", ".inf", "-1", "'3'"])
def test_a_sandbox_timeout_beyond_the_cap_is_refused_before_it_reaches_a_worker(alice, api, timeout_s):
    response = api.post(reverse("api_runs"), TINY_CONFIG + f"topology: {{environment: math_tool, env_args: {{timeout_s: {timeout_s}}}, "
                                                           "agents: [{name: tool, role: tool}]}\n")
    if timeout_s == ".inf":  # refused where the YAML is read: no config value may be infinite
        assert response.status_code == 400 and response.json()["field"] == "yaml.topology.env_args.timeout_s", response.content
        assert "finite" in response.json()["error"] and not Run.objects.exists()
        return
    assert response.status_code == 400 and response.json()["field"] == "topology.env_args", response.content
    assert "at most 30" in response.json()["error"] and not Run.objects.exists()


def test_the_run_form_and_preview_refuse_an_alias_bomb(alice, alice_world):
    response = alice.client.post(reverse("run_new"), _form(alice_world, LAUGHS))
    assert response.status_code == 200 and "aliases" in " ".join(response.context["form"].errors["advanced_yaml"])
    preview = alice.client.post(reverse("run_preview"), _form(alice_world, LAUGHS), headers={"HX-Request": "true"})
    assert preview.status_code == 200 and "aliases" in preview.content.decode()
    huge = alice.client.post(reverse("run_new"), _form(alice_world, "seed: 1\n" + "#" * trust.MAX_CONFIG_BYTES))
    assert "at most 65536 characters" in " ".join(huge.context["form"].errors["advanced_yaml"])
    assert Run.objects.count() == 1


@pytest.mark.parametrize("env_args", [
    "[" * 3000 + "]" * 3000,  # RecursionError in json.loads
    '{"level": ' + "9" * 5000 + "}",  # beyond the int digit limit
    '{"a": {"b": {"c": {"d": {"e": 1}}}}}',  # deeper than env_args may nest
    json.dumps({"blob": "x" * 17_000}),
    json.dumps({"xs": list(range(600))}),
])
def test_the_topology_and_dataset_forms_refuse_unbounded_env_args(alice, alice_world, env_args):
    response = alice.client.post(reverse("topology_create"), {"name": "big", "environment": "math_tool", "env_args": env_args,
                                                              "specialization": "lora", "max_turns": "2", "agents": [alice_world.tool.pk]})
    assert response.status_code == 200 and "env_args" in response.context["form"].errors
    response = alice.client.post(reverse("dataset_generate"), {"name": "big", "environment": "math_tool", "env_args": env_args,
                                                               "size": "8", "eval_size": "2"})
    assert response.status_code == 200 and "env_args" in response.context["form"].errors
    assert not Topology.objects.filter(name="big").exists() and not Dataset.objects.filter(name="big").exists()


def test_the_playground_refuses_a_deeply_nested_field(alice, alice_world, jobs_sent):
    response = alice.client.post(reverse("playground"), {"agents": f"t:{alice_world.topology.pk}", "task_question": "[" * 1000 + "]" * 1000,
                                                         "task_answer": "2", "temperature": "0", "max_new_tokens": "8"})
    assert response.status_code == 200 and jobs_sent == []
    assert "nested more than" in response.content.decode()


def test_an_agents_instructions_are_bounded(alice, alice_world):
    response = alice.client.post(reverse("agent_edit", args=[alice_world.tool.pk]), {
        "name": "tool", "role": "tool", "instructions": "x" * (trust.MAX_STRING + 1), "model_source": alice_world.source.pk,
        "temperature": "", "max_new_tokens": "", "tools": "python", "trainable": "on"})
    assert response.status_code == 200 and "instructions" in response.context["form"].errors
    alice_world.tool.refresh_from_db()
    assert alice_world.tool.instructions == "Write Python."


def _tiny() -> dict:
    import yaml

    return yaml.safe_load(TINY_CONFIG)

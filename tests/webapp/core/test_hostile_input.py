"""Hostile input is a clear error, never a 500 or a body that dies half-way (issue 31, class 6).

Filters with ids past what a database holds (64 digits) or digits `int` cannot read (`²`), dates
that are no date or the last day there is, NUL characters (PostgreSQL stores none: run these with
DATABASE_URL pointing at PostgreSQL too), JSON with a key given twice or NaN/Infinity, and names
with control or bidirectional characters."""

from __future__ import annotations

import json

import pytest
from django.contrib.messages import get_messages
from django.core.exceptions import ValidationError
from django.urls import reverse

from tests.webapp.api.test_api import TINY_CONFIG, Api
from training.config import ConfigError
from webapp.core import trust
from webapp.core.values import id_or_none
from webapp.models import Agent, ApiToken, ModelSource, Run
from webapp.teams import services as tokens

HUGE = "9" * 64
BAD_FILTERS = [
    ("owner", HUGE), ("topology", HUGE), ("dataset", HUGE), ("owner", "²"), ("dataset", "-1"),
    ("created_to", "9999-12-31T99:99"), ("created_from", "2024-13-45"), ("q", "a\x00b"), ("tag", "\x00"),
]


@pytest.fixture
def api(alice) -> Api:
    return Api(tokens.api_token_create(user=alice.user, team=alice.team, name="notebook")[1])


@pytest.mark.parametrize(("name", "value"), BAD_FILTERS)
def test_it_ignores_a_bad_run_list_filter_and_says_so(alice, alice_world, name, value):
    response = alice.client.get(reverse("run_list"), {name: value})
    assert response.status_code == 200
    said = [str(m) for m in get_messages(response.wsgi_request)]
    assert any(m.startswith(f"{name}: ") and m.endswith("Ignored.") for m in said), said
    assert alice_world.run.name in response.content.decode()  # the other filters still apply: none here


@pytest.mark.parametrize(("name", "value"), BAD_FILTERS)
def test_the_api_answers_a_bad_filter_with_a_400_naming_it(alice, alice_world, api, name, value):
    response = api.get(reverse("api_runs"), **{name: value})
    assert response.status_code == 400, response.content
    assert response.json()["field"] == name


@pytest.mark.parametrize(("name", "value"), BAD_FILTERS)
def test_the_csv_export_refuses_a_bad_filter_before_it_streams(alice, alice_world, name, value):
    response = alice.client.get(reverse("run_export"), {name: value})
    assert response.status_code == 400 and not response.streaming
    assert response.content.decode().startswith(f"{name}: ")


def test_the_last_day_there_is_is_a_filter_like_any_other(alice, alice_world, api):
    page = alice.client.get(reverse("run_list"), {"created_to": "9999-12-31", "created_from": "0001-01-01"})
    assert page.status_code == 200 and alice_world.run.name in page.content.decode()
    csv = alice.client.get(reverse("run_export"), {"created_to": "9999-12-31"})
    body = b"".join(csv.streaming_content).decode()
    assert csv.status_code == 200 and alice_world.run.name in body and body.endswith("\n")
    assert api.get(reverse("api_runs"), created_to="9999-12-31").json()["count"] == 1


def test_ids_in_other_query_strings_are_read_safely(alice, alice_world):
    run = alice_world.run
    for before in (HUGE, "²", "-3"):
        assert alice.client.get(reverse("run_rollouts", args=[run.pk]), {"before": before, "after": before}).status_code == 200
    for clone in (HUGE, "²"):
        assert alice.client.get(reverse("run_new"), {"clone": clone, "topology": HUGE}).status_code == 200
    for bad in (HUGE, "²"):
        compare = alice.client.get(reverse("run_compare_data"), {"ids": [str(run.pk), bad]})
        assert compare.status_code == 400 and "is not a run id" in compare.json()["error"]
    assert id_or_none(HUGE) is None and id_or_none(str(2**63 - 1)) == 2**63 - 1 and id_or_none(" 12 ") == 12


# == JSON and YAML bodies ===============================================================================


@pytest.mark.parametrize(("body", "says"), [
    ('{"name": "a", "name": "b"}', "appears twice"),
    ('{"outer": {"k": 1, "k": 2}}', "appears twice"),
    ('{"temperature": NaN}', "NaN is not a JSON number"),
    ('{"temperature": Infinity}', "Infinity is not a JSON number"),
    ('{"temperature": -Infinity}', "-Infinity is not a JSON number"),
    ('{"temperature": 1e999}', "finite"),
    ('{"name": "a\\u0000b"}', "NUL"),
    ('{"a\\u0000": 1}', "NUL"),
])
def test_json_bodies_refuse_what_parsers_accept_silently(body, says):
    with pytest.raises(ConfigError, match=says):
        trust.json_load(body)


@pytest.mark.parametrize(("text", "says"), [
    ("optim: {lr: .nan}\n", "finite"),
    ("optim: {lr: .inf}\n", "finite"),
    ('name: "a\\0b"\n', "NUL"),
])
def test_yaml_configs_refuse_them_too(text, says):
    with pytest.raises(ConfigError, match=says):
        trust.yaml_load(text)


def test_an_agent_temperature_of_nan_or_infinity_is_a_400(alice, alice_world, api):
    for literal in ("NaN", "Infinity", "1e400"):
        body = f'{{"name": "hot", "role": "tool", "model_source": {alice_world.source.pk}, "temperature": {literal}}}'
        response = api.post(reverse("api_agents"), body, content_type="application/json")
        assert response.status_code == 400, response.content
    assert not Agent.objects.filter(name="hot").exists()


def test_a_json_body_with_a_key_twice_is_a_400(alice, api, enqueued):
    body = f'{{"config": {json.dumps(TINY_CONFIG)}, "name": "first", "name": "second"}}'
    response = api.post(reverse("api_runs"), body, content_type="application/json")
    assert response.status_code == 400 and "appears twice" in response.json()["error"]
    assert not Run.objects.exists() and enqueued == []


# == names ===============================================================================================


@pytest.mark.parametrize("name", ["a\x00b", "invoice\u202efdp.exe", "a\u2066b", "zero\u200bwidth", "bell\x07", "line\u2028sep"])
def test_names_refuse_control_and_bidirectional_characters(alice, alice_world, api, enqueued, name):
    with pytest.raises(ConfigError, match="character"):
        trust.check_name(name)
    body = json.dumps({"config": TINY_CONFIG, "name": name})
    response = api.post(reverse("api_runs"), body, content_type="application/json")
    assert response.status_code == 400 and response.json()["field"] in ("name", "body.name"), response.content
    response = api.post(reverse("api_models"), json.dumps({"name": name, "source": "tiny-random:llama"}), content_type="application/json")
    assert response.status_code == 400, response.content
    with pytest.raises(ValidationError):
        tokens.api_token_create(user=alice.user, team=alice.team, name=name)
    model = ModelSource(team=alice.team, name=name, source="tiny-random:llama")
    with pytest.raises(ValidationError) as caught:
        model.full_clean()
    assert "name" in caught.value.message_dict
    assert not Run.objects.exclude(pk=alice_world.run.pk).exists() and enqueued == []
    assert ModelSource.objects.count() == 1 and ApiToken.objects.count() == 1  # the world's model, the fixture's token


def test_names_in_any_script_and_emoji_still_pass():
    for name in ("Résumé run", "学习率 sweep", "run 🚀", "Ωmega-2"):
        trust.check_name(name)


@pytest.mark.parametrize(("name", "says"), [("abc\u202etxt.exe", "bidirectional"), ("a\x00b", "Null characters")])
def test_the_run_form_refuses_a_bidi_or_nul_name(alice, alice_world, enqueued, name, says):
    data = {"name": name, "topology": alice_world.topology.pk, "dataset": alice_world.dataset.pk}
    response = alice.client.post(reverse("run_new"), data)
    assert response.status_code == 200 and says in response.content.decode()
    assert Run.objects.count() == 1 and enqueued == []


def test_a_playground_task_with_nul_is_refused_by_the_page(alice, alice_world, jobs_sent):
    for value in ("1+1?\x00", '["a\\u0000"]'):
        response = alice.client.post(reverse("playground"), {"agents": f"t:{alice_world.topology.pk}", "task_question": value,
                                                             "task_answer": "2"})
        assert response.status_code in (200, 400) and jobs_sent == [], response.status_code


def test_playground_tasks_with_nul_are_a_400(alice, alice_world, api, jobs_sent):
    body = json.dumps({"topology": alice_world.topology.pk, "task": {"question": "1+1?\u0000", "answer": "2"}})
    response = api.post(reverse("api_playground"), body, content_type="application/json")
    assert response.status_code == 400 and "NUL" in response.json()["error"], response.content
    assert jobs_sent == []


FUZZ = [HUGE, "a\x00b", "²", "-1", "9999-12-31T99:99", "1e999", "nan"]


def test_no_hostile_query_parameter_makes_a_page_or_the_api_fail(alice, alice_world, api):
    """Every page's and endpoint's query parameters, each given the values above: answered, never a 500."""
    run = alice_world.run.pk
    pages = {
        reverse("run_list"): ["page", "sort", "status", "archived", "environment", "specialization"],
        reverse("run_export"): ["sort", "status", "q"],
        reverse("team_audit"): ["verb", "actor", "object_type", "page"],
        reverse("run_rollouts", args=[run]): ["agent", "success", "step", "before", "after"],
        reverse("playground"): ["agents", "job"],
        reverse("run_new"): ["topology", "dataset", "clone"],
        reverse("dataset_list"): ["page"],
        reverse("dashboard"): ["page"],
    }
    failed = []
    for url, names in pages.items():
        for name in names:
            for value in FUZZ:
                response = alice.client.get(url, {name: value})
                if response.status_code >= 500:
                    failed.append((url, name, value))
    for value in FUZZ:
        response = alice.client.get(reverse("run_compare_data"), {"ids": [str(run), value], "metric": value})
        if response.status_code >= 500:
            failed.append(("compare", "ids", value))
    endpoints = {
        reverse("api_runs"): ["page", "per_page", "sort", "status", "archived"],
        reverse("api_jobs"): ["kind", "status", "page", "per_page"],
        reverse("api_run_metrics", args=[run]): ["after", "limit"],
        reverse("api_run_rollouts", args=[run]): ["after", "limit", "step"],
        reverse("api_models"): ["page", "per_page"],
    }
    for url, names in endpoints.items():
        for name in names:
            for value in FUZZ:
                response = api.get(url, **{name: value})
                if response.status_code >= 500:
                    failed.append((url, name, value))
    assert failed == []

"""Graders and tasks defined in the browser: tried on a dataset's first rows before they are
saved (a failing grader is refused with the reason, nothing saved), team-scoped, exported as YAML,
audited, played by a topology whose run snapshot holds the definition as it was at launch."""

from __future__ import annotations

import json

import pytest
import yaml
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from webapp.models import Agent, AuditEvent, Grader, ModelSource, Task, Topology
from webapp.runs import services as run_services

VERDICT = ("def grade(completion, row, turns):\n"
           "    said_ok = 'OK' in completion\n"
           "    right = row['answer'] in turns[-1]['text']\n"
           "    return (1.0 if said_ok == right else 0.0), {'said_ok': float(said_ok)}\n")
ROLES = ("- name: answerer\n  prompt: \"Question: {question}\"\n  grader: correct\n"
         "- name: checker\n  prompt: \"Is this right for {question}? Say OK or WRONG.\"\n  sees_turns: true\n  grader: verdict\n")


@pytest.fixture
def qa(alice):
    rows = "".join(json.dumps({"question": f"{i} + 1", "answer": str(i + 1)}) + "\n" for i in range(8))
    response = alice.client.post(reverse("dataset_upload"), {
        "name": "qa", "environment": "task", "eval_fraction": "0.25",
        "file": SimpleUploadedFile("qa.jsonl", rows.encode(), content_type="application/octet-stream")})
    assert response.status_code == 302, response.context["form"].errors
    return alice.team.datasets.get(name="qa")


def save_grader(persona, **data):
    return persona.client.post(reverse("grader_create"), {"name": "g", "kind": "python", "description": "", "settings": "", "code": "",
                                                          "try_dataset": "", "try_answer": "", **data})


def test_a_python_grader_is_tried_on_sample_rows_and_saved(alice, qa):
    tried = alice.client.post(reverse("grader_create"), {
        "name": "verdict", "kind": "python", "code": VERDICT, "settings": "timeout_s: 2", "try_dataset": qa.pk,
        "try_answer": "OK", "action": "try"}, HTTP_HX_REQUEST="true")
    assert tried.status_code == 200 and not Grader.objects.exists()
    body = tried.content.decode()
    assert body.lstrip().startswith('<div id="tried"') and "<html" not in body  # the partial only
    assert body.count("failed: raised IndexError: list index out of range") == 5  # 5 sample rows; a grader's try has no earlier turns
    tried = alice.client.post(reverse("grader_create"), {
        "name": "verdict", "kind": "python", "code": "def grade(completion, row):\n    return 0.5, {'len': len(completion)}",
        "try_dataset": qa.pk, "try_answer": "OK", "action": "try"}, HTTP_HX_REQUEST="true")
    body = tried.content.decode()
    assert body.count('<strong class="score">0.5</strong>') == 5 and "<code>len</code> 2.0" in body
    saved = save_grader(alice, name="verdict", code=VERDICT, try_dataset=qa.pk, try_answer="OK")
    assert saved.status_code == 200 and "It failed when tried, so it was not saved" in saved.content.decode()
    assert not Grader.objects.exists()
    saved = save_grader(alice, name="verdict", code=VERDICT)
    assert saved.status_code == 302 and Grader.objects.get(team=alice.team, name="verdict").spec()["code"] == VERDICT
    assert AuditEvent.objects.filter(team=alice.team, verb="create", object_type="grader").count() == 1


@pytest.mark.parametrize(("data", "says"), [
    ({"code": "def grade(c, r):\n    while True:\n        pass", "settings": "timeout_s: 0.3"}, "took longer than 0.3 s"),
    ({"code": "def grade(c, r):\n    return float('nan')"}, "not a finite number"),
    ({"code": "def grade(c, r):\n    return 'high'"}, "not a number"),
])
def test_a_grader_that_fails_on_the_sample_rows_is_refused_with_the_reason(alice, qa, data, says):
    response = save_grader(alice, try_dataset=qa.pk, try_answer="x", **data)
    assert response.status_code == 200 and says in response.content.decode() and not Grader.objects.exists()


def test_bad_settings_are_refused_naming_the_setting(alice):
    response = save_grader(alice, name="rx", kind="regex", settings="pattern: '('")
    assert response.status_code == 200 and "rx.pattern: is not a regular expression" in response.content.decode()
    response = save_grader(alice, name="mix", kind="combination", settings="weights: {nothere: 1}")
    assert "not a grader of this set" in response.content.decode() and not Grader.objects.exists()


def make_task(alice, qa):
    Grader.objects.create(team=alice.team, name="correct", kind="number", settings={"column": "answer"})
    Grader.objects.create(team=alice.team, name="verdict", kind="python", code=VERDICT)
    data = {"name": "qa-check", "description": "", "dataset": qa.pk, "roles": ROLES, "team_grader": "correct", "team_role": "answerer",
            "rounds": 1, "try_answers": "answerer: 'Answer: 1'\nchecker: OK"}
    return data


def test_a_two_role_task_is_tried_then_played_by_a_topology_whose_run_keeps_its_definition(alice, qa):
    data = make_task(alice, qa)
    from webapp.catalog import services

    first = services.task_try(team=alice.team, task=Task(team=alice.team, dataset=qa, roles=yaml.safe_load(ROLES), team_grader="correct",
                                                         team_role="answerer"), answers={"answerer": "Answer: 1", "checker": "OK"})[0]
    assert first.prompts == {"answerer": f"Question: {qa.preview[0]['question']}", "checker": f"Is this right for {qa.preview[0]['question']}? Say OK or WRONG."}
    grades = {(what, name): (g.score, g.parts) for what, name, g in first.grades}
    assert grades == {("answerer", "correct"): (1.0, {}), ("team", "correct"): (1.0, {}), ("checker", "verdict"): (1.0, {"said_ok": 1.0})}
    tried = alice.client.post(reverse("task_create"), {**data, "action": "try"}, HTTP_HX_REQUEST="true").content.decode()
    assert "Question: 0 + 1" in tried and "checker · <code>verdict</code>:" in tried and "<code>said_ok</code> 1.0" in tried
    assert not Task.objects.exists()
    saved = alice.client.post(reverse("task_create"), data)
    task = Task.objects.get(team=alice.team, name="qa-check")
    assert saved["Location"] == task.get_absolute_url() and task.role_names() == ["answerer", "checker"]

    model = ModelSource.objects.create(team=alice.team, name="Tiny", source="tiny-random:llama")
    made = alice.client.post(reverse("task_topology", args=[task.pk]), {"model_source": model.pk, "specialization": "lora"})
    topology = Topology.objects.get(team=alice.team, environment="task")
    assert made["Location"] == topology.get_absolute_url() and topology.env_args == {"task": "qa-check"}
    assert [(a.name, a.role) for a in topology.ordered_agents()] == [("answerer", "answerer"), ("checker", "checker")]

    config = run_services.run_config_build(topology=topology, dataset=qa, name="r1")
    definition = config.topology.env_args["definition"]
    assert definition["graders"]["verdict"]["code"] == VERDICT and definition["team"] == {"grader": "correct", "role": "answerer"}
    Grader.objects.filter(name="verdict").update(code="def grade(c, r):\n    return 0")
    assert config.topology.env_args["definition"]["graders"]["verdict"]["code"] == VERDICT  # the snapshot is the launch's
    assert yaml.safe_load(config.to_yaml())["topology"]["env_args"]["definition"]["roles"][1]["sees_turns"] is True

    export = alice.client.get(reverse("task_export", args=[task.pk]))
    assert yaml.safe_load(export.content)["topology"]["env_args"]["definition"]["graders"]["correct"]["kind"] == "number"
    assert AuditEvent.objects.filter(team=alice.team, verb="export", object_type="task").exists()


def test_an_agent_may_play_a_role_of_the_teams_tasks(alice, qa):
    from webapp.catalog import services

    Task.objects.create(team=alice.team, name="t", roles=[{"name": "judge", "prompt": "x"}])
    model = ModelSource.objects.create(team=alice.team, name="Tiny", source="tiny-random:llama")
    assert services.agent_create(team=alice.team, name="j", role="judge", model_source=model).role == "judge"
    assert Agent.objects.filter(role="judge").count() == 1


def test_another_teams_graders_and_tasks_are_404_and_not_reachable_by_name(alice, bob, qa):
    data = make_task(alice, qa)
    alice.client.post(reverse("task_create"), data)
    grader, task = Grader.objects.get(name="verdict"), Task.objects.get(name="qa-check")
    for name in ("grader_edit", "grader_export", "grader_delete"):
        assert bob.client.get(reverse(name, args=[grader.pk])).status_code == 404
    for name in ("task_edit", "task_export", "task_delete"):
        assert bob.client.get(reverse(name, args=[task.pk])).status_code == 404
    Topology.objects.create(team=bob.team, name="steal", environment="task", env_args={"task": "qa-check"})
    from training.config import ConfigError
    from webapp.catalog.graders import task_env_args

    with pytest.raises(ConfigError, match="which your team does not have"):
        task_env_args(team=bob.team, env_args={"task": "qa-check"})


def test_a_grader_a_task_uses_cannot_be_deleted(alice, qa):
    alice.client.post(reverse("task_create"), make_task(alice, qa))
    grader = Grader.objects.get(name="verdict")
    response = alice.client.post(reverse("grader_delete", args=[grader.pk]))
    assert response.status_code == 200 and "Used by qa-check" in response.content.decode() and Grader.objects.filter(pk=grader.pk).exists()

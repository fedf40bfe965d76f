"""Graders and tasks over the API (issue 47), through the catalog's one `crud` factory: a script
defines a Python grader and a two-role task on an uploaded dataset, tries each on the dataset's
first rows before saving (a grader that fails there is refused with the reason, nothing saved),
and meets the pages' blockers when it deletes."""

from __future__ import annotations

from django.urls import reverse

from tests.webapp.api.test_catalog_api import api  # noqa: F401 (the fixture)
from tests.webapp.catalog.test_graders_and_tasks import VERDICT, qa  # noqa: F401 (the fixture)
from webapp.models import AuditEvent, Grader, Task

CORRECT = "def grade(completion, row):\n    return float(row['answer'] in completion), {'len': len(completion)}\n"
ROLES = [{"name": "answerer", "prompt": "Question: {question}", "grader": "correct"},
         {"name": "checker", "prompt": "Is this right for {question}? Say OK or WRONG.", "sees_turns": True, "grader": "verdict"}]


def test_a_script_defines_tries_and_saves_graders_and_a_two_role_task(alice, api, qa):  # noqa: F811
    tried = api.send("POST", reverse("api_grader_try"), {"name": "correct", "kind": "python", "code": CORRECT, "try_dataset": qa.pk,
                                                         "try_answer": "it is 2"})
    assert tried.status_code == 200, tried.content
    results = tried.json()["results"]
    assert len(results) == 5 and tried.json()["failed"] == [] and not Grader.objects.exists()
    assert [r["grades"][0]["score"] for r in results] == [0.0, 1.0, 0.0, 0.0, 0.0] and results[0]["grades"][0]["parts"] == {"len": 7.0}

    refused = api.send("POST", reverse("api_graders"), {"name": "verdict", "kind": "python", "code": VERDICT, "try_dataset": qa.pk,
                                                        "try_answer": "OK"})  # no earlier turn in a grader's try: it raises
    assert refused.status_code == 400 and "It failed when tried, so it was not saved" in refused.json()["fields"]["code"][0]
    assert not Grader.objects.exists()
    for name, code in (("correct", CORRECT), ("verdict", VERDICT)):
        saved = api.send("POST", reverse("api_graders"), {"name": name, "kind": "python", "code": code})
        assert saved.status_code == 201, saved.content
    assert saved["Location"].endswith(reverse("api_grader", args=[saved.json()["id"]])) and saved.json()["code"] == VERDICT
    bad = api.send("POST", reverse("api_graders"), {"name": "9lives", "kind": "dice", "settings": []})
    assert bad.status_code == 400 and set(bad.json()["fields"]) == {"kind", "settings", "name"}, bad.json()  # every problem at once

    task = {"name": "qa-pair", "dataset": qa.pk, "roles": ROLES, "team_grader": "correct", "team_role": "answerer"}
    tried = api.send("POST", reverse("api_task_try"), {**task, "try_answers": {"answerer": "2", "checker": "OK"}})
    assert tried.status_code == 200, tried.content
    first = tried.json()["results"][1]  # the row whose answer is 2
    assert first["prompts"]["answerer"] == "Question: 1 + 1"
    assert [(g["graded"], g["score"]) for g in first["grades"]] == [("answerer", 1.0), ("team", 1.0), ("checker", 1.0)]
    assert not Task.objects.exists()
    created = api.send("POST", reverse("api_tasks"), task)
    assert created.status_code == 201, created.content
    assert created.json()["roles"] == ROLES and created.json()["dataset"] == qa.pk and created.json()["topologies"] == []
    task_id = created.json()["id"]
    changed = api.send("PATCH", reverse("api_task", args=[task_id]), {"rounds": 2, "description": "two rounds"})
    assert changed.status_code == 200 and changed.json()["rounds"] == 2 and changed.json()["roles"] == ROLES
    wrong = api.send("PATCH", reverse("api_task", args=[task_id]), {"team_grader": "nobody"})
    assert wrong.status_code == 400 and wrong.json()["field"] == "team_grader"
    assert Task.objects.get(pk=task_id).team_grader == "correct"  # nothing half-saved

    listing = api.get(reverse("api_graders")).json()
    assert listing["count"] == 2 and [g["name"] for g in listing["results"]] == ["correct", "verdict"]
    assert api.get(reverse("api_tasks")).json()["results"][0]["name"] == "qa-pair"
    used = api.send("DELETE", reverse("api_grader", args=[saved.json()["id"]]))
    assert used.status_code == 409 and "Used by qa-pair" in used.json()["error"]
    assert api.send("DELETE", reverse("api_task", args=[task_id])).status_code == 204
    assert api.send("DELETE", reverse("api_grader", args=[saved.json()["id"]])).status_code == 204
    assert AuditEvent.objects.filter(team=alice.team, verb="create", object_type="grader", actor=alice.user).count() == 2


def test_another_team_s_graders_and_tasks_are_404s(alice, bob, api):  # noqa: F811
    grader = Grader.objects.create(team=bob.team, name="theirs", kind="exact", settings={"column": "answer"})
    task = Task.objects.create(team=bob.team, name="theirs", roles=[{"name": "a", "prompt": "{q}", "grader": "theirs"}])
    for url in (reverse("api_grader", args=[grader.pk]), reverse("api_task", args=[task.pk])):
        assert api.get(url).status_code == 404 and api.send("DELETE", url).status_code == 404
        assert api.send("PATCH", url, {"description": "mine"}).status_code == 404
    assert api.get(reverse("api_graders")).json()["count"] == 0 and Grader.objects.get(pk=grader.pk).description == ""

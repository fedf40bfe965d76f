"""What the run page does, the API does (issue 46, class 4), through the same services: tags,
notes and archive (PATCH /api/v1/runs/<id>/), resume (POST .../resume/). And a run launch sent as
text/plain is a 415, not read as YAML: the content type says nothing of YAML."""

from __future__ import annotations

from django.urls import reverse

from tests.webapp.api.test_api import TINY_CONFIG
from tests.webapp.api.test_catalog_api import api  # noqa: F401 (the fixture)
from tests.webapp.runs.test_run_warm_start import finished  # noqa: F401 (a fixture)
from webapp.models import Run


def test_a_run_launch_as_text_plain_is_a_415(alice, api, enqueued):  # noqa: F811
    response = api.send("POST", reverse("api_runs"), TINY_CONFIG, content_type="text/plain")
    assert response.status_code == 415 and "application/yaml" in response.json()["error"], response.content
    assert not Run.objects.exists() and enqueued == []
    assert api.send("POST", reverse("api_runs"), TINY_CONFIG, content_type="application/yaml").status_code == 201


def test_a_run_s_tags_notes_and_archive_change_as_on_its_page(alice, alice_world, api):  # noqa: F811
    run = alice_world.run
    url = reverse("api_run", args=[run.pk])
    response = api.send("PATCH", url, {"tags": ["baseline", "v2"], "notes": "the good one"})
    assert response.status_code == 200 and response.json()["tags"] == ["baseline", "v2"] and response.json()["notes"] == "the good one"
    response = api.send("PATCH", url, {"archived": True})  # still queued: the page refuses it too
    assert response.status_code == 400 and "stop it first" in response.json()["error"]
    response = api.send("PATCH", url, {"tags": "bad tag!", "notes": 3, "colour": "red"})
    assert response.status_code == 400 and set(response.json()["fields"]) == {"notes", "colour"}, response.json()  # types first
    Run.objects.filter(pk=run.pk).update(status="succeeded")
    response = api.send("PATCH", url, {"archived": True, "tags": "bad tag!"})
    assert response.status_code == 400 and response.json()["field"] == "tags"
    run.refresh_from_db()
    assert not run.archived and sorted(t.name for t in run.tags.all()) == ["baseline", "v2"]  # nothing half-saved
    assert api.send("PATCH", url, {"archived": True}).json()["archived"] is True


def test_a_cancelled_run_resumes_from_its_checkpoint(alice, alice_world, api, enqueued, django_capture_on_commit_callbacks):  # noqa: F811
    from webapp.models import Checkpoint

    run = alice_world.run
    assert api.send("POST", reverse("api_run_resume", args=[run.pk])).status_code == 400  # queued: nothing to resume
    Run.objects.filter(pk=run.pk).update(status="cancelled")
    Checkpoint.objects.create(run=run, step=2, path="/tmp/ck/step-000002")
    with django_capture_on_commit_callbacks(execute=True):
        response = api.send("POST", reverse("api_run_resume", args=[run.pk]))
    assert response.status_code == 201, response.content
    new = Run.objects.get(resumed_from=run)
    assert response.json()["id"] == new.pk and response.json()["resumed_from"] == run.pk and enqueued == [new.pk]
    assert response["Location"].endswith(reverse("api_run", args=[new.pk]))


def test_a_queued_run_s_detail_gives_its_place_and_phase_and_admins_move_it(alice, alice_world, bob_world, api):  # noqa: F811
    from webapp.models import Membership

    first = alice_world.run
    second = Run.objects.create(team=first.team, name="second", topology=first.topology, dataset=first.dataset,
                                config_yaml=first.config_yaml, total_steps=first.total_steps)
    detail = api.get(reverse("api_run", args=[second.pk])).json()
    assert detail["queue_position"] == 3 and "2 queued runs ahead" in detail["waiting_for"]  # behind Alpha's first and Bravo's
    assert detail["phase"] == "" and detail["eta"] is None and detail["eta_seconds"] is None
    moved = api.send("POST", reverse("api_run_queue_move", args=[second.pk]), {"direction": "up"})
    assert moved.status_code == 200 and moved.json()["queue_position"] == 1, moved.content
    assert api.get(reverse("api_run", args=[first.pk])).json()["queue_position"] == 3  # Bravo's run kept its place
    assert api.send("POST", reverse("api_run_queue_move", args=[second.pk]), {"direction": "sideways"}).status_code == 400
    Membership.objects.filter(user=alice.user).update(role=Membership.Role.MEMBER)
    refused = api.send("POST", reverse("api_run_queue_move", args=[second.pk]), {"direction": "down"})
    assert refused.status_code == 403 and "admins" in refused.json()["error"]
    assert api.send("POST", reverse("api_run_queue_move", args=[bob_world.run.pk]), {"direction": "up"}).status_code == 404
    Run.objects.filter(pk=first.pk).update(status="running", phase="evaluating", phase_detail="Evaluating at step 2: 4/8 held-out tasks",
                                           phase_progress=0.5)
    detail = api.get(reverse("api_run", args=[first.pk])).json()
    assert (detail["phase"], detail["phase_progress"], detail["queue_position"]) == ("evaluating", 0.5, None)
    assert detail["phase_detail"].startswith("Evaluating at step 2")


def test_a_warm_start_from_a_run_s_best_episodes(alice, finished, api, enqueued, django_capture_on_commit_callbacks):  # noqa: F811
    url = reverse("api_run_warm_start", args=[finished.pk])
    preview = api.get(url)
    assert preview.status_code == 200, preview.content
    assert preview.json()["counts"] == {"tool": 1, "reasoner": 1} and preview.json()["episodes"] == 2 and preview.json()["rule"] == "succeeded"
    assert api.get(url, threshold="0.5").json()["episodes"] == 3
    assert api.get(url, threshold="7").status_code == 400
    wrong = api.send("POST", url, {"start_from": 99, "steps": 0})
    assert wrong.status_code == 400 and set(wrong.json()["fields"]) == {"start_from", "steps"}, wrong.json()
    with django_capture_on_commit_callbacks(execute=True):
        launched = api.send("POST", url, {"threshold": 0.5, "steps": 3, "name": "sft warm"})
    assert launched.status_code == 201, launched.content
    new = Run.objects.get(pk=launched.json()["id"])
    assert new.algorithm == "sft" and new.name == "sft warm" and new.total_steps == 3 and enqueued == [new.pk]
    again = api.send("POST", url, {"threshold": 0.5, "steps": 3, "name": "sft warm"})
    assert again.json()["id"] == new.pk  # queued already: the same run


def test_an_experiment_dry_run_says_what_it_would_start_and_saves_nothing(alice, alice_world, api, enqueued):  # noqa: F811
    from webapp.models import Experiment

    body = {"topology": alice_world.topology.pk, "dataset": alice_world.dataset.pk, "axes": {"optim.lr": [0.0001, 0.0003]}, "seeds": [0, 1],
            "config": {"optim": {"steps": 2}}}
    preview = api.send("POST", reverse("api_experiment_preview"), body)
    assert preview.status_code == 200, preview.content
    data = preview.json()
    assert (data["runs"], data["arms"], data["seeds"], data["steps"]) == (4, 2, 2, 8) and data["arm_labels"] == ["optim.lr=0.0001", "optim.lr=0.0003"]
    bad = api.send("POST", reverse("api_experiment_preview"), {**body, "axes": {"optim.nope": [1]}, "dataset": 999999})
    assert bad.status_code == 400 and "dataset" in bad.json()["fields"]
    assert not Experiment.objects.exists() and Run.objects.count() == 1 and enqueued == []


def test_a_duplicate_agent_name_is_said_once(alice, alice_world, api):  # noqa: F811
    response = api.send("POST", reverse("api_agents"), {"name": "tool", "role": "tool", "model_source": alice_world.source.pk})
    assert response.status_code == 400 and response.json()["fields"] == {"name": ["Your team already has an agent named 'tool'."]}, response.json()
    response = api.send("PATCH", reverse("api_agent", args=[alice_world.reasoner.pk]), {"name": "tool"})
    assert response.status_code == 400 and response.json()["fields"] == {"name": ["Your team already has an agent named 'tool'."]}, response.json()


def test_a_run_launch_s_dry_run_resolves_the_config_and_saves_nothing(alice, alice_world, api, enqueued):  # noqa: F811
    preview = api.send("POST", reverse("api_run_preview"), TINY_CONFIG, content_type="application/yaml")
    assert preview.status_code == 200, preview.content
    assert preview.json()["name"] == "from a notebook" and "grpo:" in preview.json()["config_yaml"] and preview.json()["steps"] >= 1
    preview = api.send("POST", reverse("api_run_preview"), {"topology": alice_world.topology.pk, "dataset": alice_world.dataset.pk,
                                                             "config": {"optim": {"steps": 4}}})
    assert preview.status_code == 200 and preview.json()["steps"] == 4 and "math_tool" in preview.json()["config_yaml"], preview.content
    bad = api.send("POST", reverse("api_run_preview"), {"topology": 999999, "config": {"grpo": {"k": 1}}})
    assert bad.status_code == 400 and bad.json()["field"] == "topology"
    bad = api.send("POST", reverse("api_run_preview"), {"config": {"grpo": {"k": 1}}})
    assert bad.status_code == 400 and {"grpo.k", "topology.agents"} <= set(bad.json()["fields"]), bad.json()  # every problem
    assert Run.objects.count() == 1 and enqueued == []

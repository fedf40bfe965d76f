"""The pages' other actions over the API, through the same services (issue 46, class 4): duplicate
an agent or a topology, revalidate a dataset, make a task's topology, delete a checkpoint or an
export (team admins), ablate every finished trial of an experiment."""

from __future__ import annotations

from django.urls import reverse

from tests.webapp.api.test_catalog_api import api  # noqa: F401 (the fixture)
from tests.webapp.api.test_graders_api import ROLES
from tests.webapp.catalog.test_graders_and_tasks import qa  # noqa: F401 (the fixture)
from tests.webapp.history_helpers import with_out_dir
from webapp.models import Agent, Checkpoint, Grader, Job, Membership, Run, Task, Topology


def test_duplicates_revalidation_and_a_task_s_topology(alice, alice_world, bob_world, api):  # noqa: F811
    copy = api.send("POST", reverse("api_agent_duplicate", args=[alice_world.tool.pk]))
    assert copy.status_code == 201 and copy.json()["name"] == "tool-copy" and copy.json()["tools"] == ["python"], copy.content
    copy = api.send("POST", reverse("api_topology_duplicate", args=[alice_world.topology.pk]))
    assert copy.status_code == 201 and copy.json()["name"] == "duo-copy"
    assert copy.json()["agents"] == [alice_world.tool.pk, alice_world.reasoner.pk]
    assert api.send("POST", reverse("api_agent_duplicate", args=[bob_world.tool.pk])).status_code == 404
    checked = api.send("POST", reverse("api_dataset_revalidate", args=[alice_world.dataset.pk]))
    assert checked.status_code == 200 and checked.json()["status"] in ("valid", "invalid"), checked.content

    for name in ("correct", "verdict"):
        Grader.objects.create(team=alice.team, name=name, kind="exact", settings={"column": "answer"})
    task = Task.objects.create(team=alice.team, name="qa-pair", roles=ROLES)
    url = reverse("api_task_topology", args=[task.pk])
    wrong = api.send("POST", url, {"model_source": bob_world.source.pk, "specialization": "sideways"})
    assert wrong.status_code == 400 and set(wrong.json()["fields"]) == {"model_source", "specialization"}, wrong.json()
    made = api.send("POST", url, {"model_source": alice_world.source.pk})
    assert made.status_code == 201, made.content
    topology = Topology.objects.get(pk=made.json()["id"])
    assert topology.environment == "task" and topology.env_args == {"task": "qa-pair"}
    assert [a.role for a in topology.ordered_agents()] == ["answerer", "checker"] and Agent.objects.filter(role="checker").count() == 1
    assert api.get(reverse("api_task", args=[task.pk])).json()["topologies"] == [topology.pk]


def test_team_admins_delete_a_checkpoint_and_an_export(alice, alice_world, api, data_dir):  # noqa: F811
    run = with_out_dir(alice_world.run, data_dir)
    Run.objects.filter(pk=run.pk).update(status="succeeded")
    for step in (2, 4):
        folder = data_dir / "runs" / str(run.pk) / "checkpoints" / f"step-{step:06d}"
        (folder / "tool").mkdir(parents=True)
        Checkpoint.objects.create(run=run, step=step, path=str(folder))
    export = Job.objects.create(team=run.team, kind="merge", run=run, status="running", params={"agent": "tool", "checkpoint_step": 4})
    assert api.send("DELETE", reverse("api_export_delete", args=[run.pk, export.pk])).status_code == 400  # still running
    Membership.objects.filter(user=alice.user).update(role=Membership.Role.MEMBER)
    refused = api.send("DELETE", reverse("api_checkpoint_delete", args=[run.pk, 2]))
    assert refused.status_code == 403 and "team admin" in refused.json()["error"]
    Membership.objects.filter(user=alice.user).update(role=Membership.Role.ADMIN)
    assert api.send("DELETE", reverse("api_checkpoint_delete", args=[run.pk, 7])).status_code == 404
    assert api.send("DELETE", reverse("api_checkpoint_delete", args=[run.pk, 2])).status_code == 204
    assert Checkpoint.objects.get(run=run, step=2).deleted is not None and not (data_dir / "runs" / str(run.pk) / "checkpoints" / "step-000002").exists()


def test_an_experiment_s_finished_trials_are_ablated_at_once(alice, alice_world, api, enqueued):  # noqa: F811
    launched = api.send("POST", reverse("api_experiments"), {"topology": alice_world.topology.pk, "dataset": alice_world.dataset.pk,
                                                              "axes": {"optim.lr": [0.0001, 0.0003]}, "config": {"optim": {"steps": 2}}})
    assert launched.status_code == 201, launched.content
    url = reverse("api_experiment_ablations", args=[launched.json()["id"]])
    response = api.send("POST", url, {"ablation": "role_swap"})
    assert response.status_code == 202 and response.json() == {"queued": 0, "refused": []}  # no trial has finished yet
    assert api.send("POST", url, {"ablation": 3}).status_code == 400


def test_a_dataset_changes_as_on_its_page(alice, alice_world, api, qa):  # noqa: F811
    url = reverse("api_dataset", args=[alice_world.dataset.pk])
    changed = api.send("PATCH", url, {"name": "gen L1 bigger", "size": 64})
    assert changed.status_code == 200 and (changed.json()["name"], changed.json()["size"], changed.json()["eval_size"]) == ("gen L1 bigger", 64, 8)
    wrong = api.send("PATCH", url, {"eval_fraction": 0.2, "size": 0})
    assert wrong.status_code == 400 and set(wrong.json()["fields"]) == {"eval_fraction", "size"}, wrong.json()
    upload = reverse("api_dataset", args=[qa.pk])
    assert api.send("PATCH", upload, {"eval_fraction": 0.5}).json()["eval_fraction"] == 0.5
    wrong = api.send("PATCH", upload, {"size": 5, "name": "qa2"})
    assert wrong.status_code == 400 and set(wrong.json()["fields"]) == {"size"}, wrong.json()  # not an upload's
    taken = api.send("PATCH", upload, {"name": "gen L1 bigger"})
    assert taken.status_code == 400 and taken.json()["field"] == "name", taken.json()
    qa.refresh_from_db()
    assert qa.name == "qa" and qa.eval_fraction == 0.5


def test_a_conversations_file_is_uploaded_as_on_its_page(alice, api, data_dir):  # noqa: F811
    import json

    from django.core.files.uploadedfile import SimpleUploadedFile

    line = json.dumps({"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}], "agent": "reasoner"})
    url = reverse("api_conversations_upload")
    response = api.client.post(url, {"name": "demos", "environment": "math_tool",
                                     "file": SimpleUploadedFile("demos.jsonl", (line + "\n").encode())}, headers=api.headers)
    assert response.status_code == 201, response.content
    assert response.json()["kind"] == "chats" and response.json()["row_count"] == 1 and response.json()["status"] == "valid"
    bad = api.client.post(url, {"name": "demos", "colour": "red", "file": SimpleUploadedFile("d.jsonl", b"{}\n")}, headers=api.headers)
    assert bad.status_code == 400 and {"colour", "environment"} <= set(bad.json()["fields"]), bad.json()
    assert api.send("POST", url, {"name": "x"}).status_code == 415

"""A script builds what a run needs through the API: a model source, agents, a topology and a
dataset (uploaded or generated), then evaluates a checkpoint and plays a task, and deletes what
it made. Every write meets the pages' validation (all problems at once, naming the fields), the
audit trail records it, and another team's objects are a 404 whatever the method."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from tests.webapp.api.test_api import Api
from tests.webapp.history_helpers import save_checkpoint, with_out_dir
from webapp.models import Agent, AuditEvent, Dataset, Job, ModelSource, Topology
from webapp.teams import services as tokens


class JsonApi(Api):
    def send(self, method: str, path: str, payload=None, content_type: str = "application/json"):
        body = json.dumps(payload) if payload is not None and content_type == "application/json" else payload or b""
        return getattr(self.client, method.lower())(path, body, content_type=content_type, headers=self.headers)


@pytest.fixture
def api(alice) -> JsonApi:
    return JsonApi(tokens.api_token_create(user=alice.user, team=alice.team, name="script")[1])


def test_a_script_defines_a_topology_from_nothing(alice, api):
    model = api.send("POST", reverse("api_models"), {"name": "Smol", "source": "tiny-random:llama", "notes": "for CI"})
    assert model.status_code == 201, model.content
    assert model["Location"].endswith(reverse("api_model", args=[model.json()["id"]]))
    ids = {}
    for name, role in (("coder", "tool"), ("thinker", "reasoner")):
        response = api.send("POST", reverse("api_agents"), {"name": name, "role": role, "model_source": model.json()["id"],
                                                           "tools": ["python"], "temperature": 0.7})
        assert response.status_code == 201, response.content
        ids[name] = response.json()["id"]
    topology = api.send("POST", reverse("api_topologies"), {
        "name": "pair", "environment": "math_tool", "env_args": {"level": 2}, "specialization": "lora",
        "agents": [ids["thinker"], ids["coder"]]})
    assert topology.status_code == 201, topology.content
    data = topology.json()
    assert data["agents"] == [ids["thinker"], ids["coder"]] and data["max_turns"] == 2 and data["env_args"] == {"level": 2}
    # as the page does after saving, the answer says which agents' tools their model cannot render
    assert [note.split(":")[0] for note in data["notes"]] == ["thinker", "coder"], data["notes"]
    assert "tiny-random:llama has no tool support" in data["notes"][0]
    saved = Topology.objects.get(pk=data["id"], team=alice.team)
    assert [a.name for a in saved.ordered_agents()] == ["thinker", "coder"]
    agent = Agent.objects.get(pk=ids["coder"])
    assert agent.tools == ["python"] and agent.temperature == 0.7 and agent.trainable
    created = AuditEvent.objects.filter(team=alice.team, verb="create", actor=alice.user)
    assert {"Smol", "coder", "pair", "thinker"} <= set(created.values_list("object_label", flat=True))

    listing = api.get(reverse("api_agents")).json()
    assert listing["count"] == 2 and [a["name"] for a in listing["results"]] == ["coder", "thinker"]
    assert api.get(reverse("api_agent", args=[ids["coder"]])).json()["role"] == "tool"


def test_every_problem_comes_back_at_once_naming_its_field(alice, alice_world, api):
    before = Agent.objects.count()
    response = api.send("POST", reverse("api_agents"), {
        "name": "bad name!", "role": "juggler", "model_source": 999999, "temperature": "hot", "colour": "red"})
    assert response.status_code == 400
    fields = response.json()["fields"]
    # an unknown field and a wrong type come back with the form's own findings on the rest
    assert {"name", "model_source", "temperature", "colour"} <= set(fields), fields
    assert fields["temperature"] == ["Expected a number or null."] and fields["colour"][0].startswith("Unknown field")
    response = api.send("POST", reverse("api_agents"), {"name": "bad name!", "role": "juggler", "model_source": 999999,
                                                       "temperature": 9.0})
    assert response.status_code == 400
    fields = response.json()["fields"]
    assert {"name", "model_source", "temperature"} <= set(fields), fields
    assert Agent.objects.count() == before  # nothing half-saved

    response = api.send("POST", reverse("api_topologies"), {"name": "solo", "environment": "math_tool",
                                                           "specialization": "single", "agents": [alice_world.tool.pk, alice_world.reasoner.pk]})
    assert response.status_code == 400 and "specialization" in response.json()["fields"]
    response = api.send("POST", reverse("api_topologies"), {"name": "nowhere", "environment": "no_such_env", "agents": [alice_world.tool.pk]})
    assert response.status_code == 400 and "environment" in response.json()["fields"]
    response = api.send("POST", reverse("api_topologies"), {"name": "", "environment": "no_such_env", "max_turns": "two", "agents": "all"})
    assert {"name", "environment", "max_turns", "agents"} <= set(response.json()["fields"]), response.json()
    assert response.json()["fields"]["agents"] == ["Expected an array."]
    response = api.send("PATCH", reverse("api_topology", args=[alice_world.topology.pk]), {"max_turns": 0, "env_args": [1], "specialization": "solo"})
    assert {"max_turns", "env_args", "specialization"} <= set(response.json()["fields"]), response.json()
    response = api.send("POST", reverse("api_datasets"), {"name": "gen", "environment": "math_tool", "size": -1, "eval_size": "8", "extra": 1})
    assert {"size", "eval_size", "extra"} <= set(response.json()["fields"]), response.json()
    assert Topology.objects.filter(name__in=["", "nowhere"]).count() == 0 and not Dataset.objects.filter(name="gen").exists()
    assert api.send("POST", reverse("api_models"), "name: x", content_type="application/yaml").status_code == 415
    assert api.send("POST", reverse("api_models"), ["not", "an", "object"]).status_code == 400
    response = api.send("POST", reverse("api_models"), {"name": "Home", "source": "local:/etc"})
    assert response.status_code == 400 and "source" in response.json()["fields"]


def test_patch_changes_only_the_fields_given(alice, alice_world, api):
    response = api.send("PATCH", reverse("api_agent", args=[alice_world.tool.pk]), {"instructions": "Write short Python.", "max_new_tokens": 128})
    assert response.status_code == 200, response.content
    tool = Agent.objects.get(pk=alice_world.tool.pk)
    assert tool.instructions == "Write short Python." and tool.max_new_tokens == 128 and tool.role == "tool" and tool.tools == ["python"]
    assert api.send("PATCH", reverse("api_agent", args=[alice_world.tool.pk]), {"max_new_tokens": None}).json()["max_new_tokens"] is None
    response = api.send("PATCH", reverse("api_topology", args=[alice_world.topology.pk]), {"agents": [alice_world.reasoner.pk]})
    assert response.status_code == 200 and response.json()["agents"] == [alice_world.reasoner.pk]
    assert response.json()["notes"] == []  # the reasoner has no tools
    response = api.send("PATCH", reverse("api_topology", args=[alice_world.topology.pk]), {"agents": [alice_world.tool.pk]})
    assert [note.split(":")[0] for note in response.json()["notes"]] == [alice_world.tool.name]
    assert "notes" not in api.get(reverse("api_topology", args=[alice_world.topology.pk])).json()  # advice comes with a save
    response = api.send("PATCH", reverse("api_model", args=[alice_world.source.pk]), {"name": "Renamed"})
    assert response.status_code == 200 and ModelSource.objects.get(pk=alice_world.source.pk).name == "Renamed"
    response = api.send("PATCH", reverse("api_topology", args=[alice_world.topology.pk]), {"max_turns": 0})
    assert response.status_code == 400 and response.json()["field"] == "max_turns"


def test_delete_answers_409_while_the_object_is_in_use(alice, alice_world, api):
    response = api.send("DELETE", reverse("api_agent", args=[alice_world.tool.pk]))
    assert response.status_code == 409 and "duo" in response.json()["error"]
    response = api.send("DELETE", reverse("api_model", args=[alice_world.source.pk]))
    assert response.status_code == 409 and Agent.objects.filter(pk=alice_world.tool.pk).exists()
    assert api.send("DELETE", reverse("api_topology", args=[alice_world.topology.pk])).status_code == 409  # its run is queued
    alice_world.run.status = "succeeded"
    alice_world.run.save()
    assert api.send("DELETE", reverse("api_topology", args=[alice_world.topology.pk])).status_code == 204
    assert api.send("DELETE", reverse("api_agent", args=[alice_world.tool.pk])).status_code == 204
    assert api.get(reverse("api_agent", args=[alice_world.tool.pk])).status_code == 404
    assert AuditEvent.objects.filter(team=alice.team, verb="delete").count() == 2


def test_datasets_upload_through_the_forms_checks_or_generate(alice, api, settings):
    rows = b'{"question": "What is 2+2?", "answer": "4"}\n' * 10
    client = Client()
    response = client.post(reverse("api_datasets"), {"name": "adds", "environment": "math_tool", "eval_fraction": "0.2",
                                                     "file": SimpleUploadedFile("adds.jsonl", rows)}, headers=api.headers)
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["row_count"] == 10 and data["format"] == "jsonl" and data["schema"] == ["question", "answer"] and data["status"] == "valid"
    assert Dataset.objects.get(pk=data["id"]).path.is_file()

    bad = client.post(reverse("api_datasets"), {"name": "broken", "environment": "math_tool",
                                                "file": SimpleUploadedFile("b.jsonl", b'{"question": "no answer"}\n')}, headers=api.headers)
    assert bad.status_code == 400 and "file" in bad.json()["fields"] and not Dataset.objects.filter(name="broken").exists()
    settings.TROUPE_UPLOAD_MAX_BYTES = 100
    big = client.post(reverse("api_datasets"), {"name": "big", "environment": "math_tool",
                                                "file": SimpleUploadedFile("big.jsonl", rows)}, headers=api.headers)
    assert big.status_code == 400 and "limit" in big.json()["fields"]["file"][0]
    extra = client.post(reverse("api_datasets"), {"name": "x", "environment": "math_tool", "owner": "mallory",
                                                  "file": SimpleUploadedFile("a.jsonl", rows)}, headers=api.headers)
    assert extra.status_code == 400 and "owner" in extra.json()["fields"]
    both = client.post(reverse("api_datasets"), {"environment": "no_such_env", "owner": "mallory",
                                                 "file": SimpleUploadedFile("a.jsonl", rows)}, headers=api.headers)
    assert {"owner", "name", "environment"} <= set(both.json()["fields"]), both.json()  # all at once

    generated = api.send("POST", reverse("api_datasets"), {"name": "L2", "environment": "math_tool", "env_args": {"level": 2},
                                                          "size": 64, "eval_size": 16})
    assert generated.status_code == 201, generated.content
    assert generated.json()["kind"] == "generator" and generated.json()["preview"]
    response = api.send("POST", reverse("api_datasets"), {"name": "L9", "environment": "math_tool", "env_args": {"level": 99},
                                                         "size": 64, "eval_size": 16})
    assert response.status_code == 400 and "env_args" in response.json()["fields"]
    assert api.send("DELETE", reverse("api_dataset", args=[data["id"]])).status_code == 204
    assert not Dataset.objects.filter(pk=data["id"]).exists()


def test_evaluations_and_playground_sessions_become_jobs(alice, alice_world, api, jobs_sent, data_dir, django_capture_on_commit_callbacks):
    run = with_out_dir(alice_world.run, data_dir)
    save_checkpoint(run, 2)
    with django_capture_on_commit_callbacks(execute=True):
        response = api.send("POST", reverse("api_run_evaluations", args=[run.pk]), {"dataset": alice_world.dataset.pk, "checkpoint_step": 2})
    assert response.status_code == 202, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert job.kind == "evaluate" and job.checkpoint.step == 2 and response["Location"].endswith(reverse("api_job", args=[job.pk]))
    response = api.send("POST", reverse("api_run_evaluations", args=[run.pk]), {"dataset": alice_world.dataset.pk, "checkpoint_step": 7})
    assert response.status_code == 400 and "step 7" in response.json()["error"] and "2" in response.json()["error"]
    response = api.send("POST", reverse("api_run_evaluations", args=[run.pk]), {"dataset": 999999, "checkpoint_step": 7, "seed": 1})
    assert set(response.json()["fields"]) == {"dataset", "checkpoint_step", "seed"}, response.json()  # all at once

    with django_capture_on_commit_callbacks(execute=True):
        response = api.send("POST", reverse("api_playground"), {"topology": alice_world.topology.pk,
                                                               "task": {"question": "What is 6*7?", "answer": "42"}})
    assert response.status_code == 202, response.content
    played = Job.objects.get(pk=response.json()["id"])
    assert played.kind == "playground" and played.params["row"] == {"question": "What is 6*7?", "answer": "42"}
    assert [kind for kind, _ in jobs_sent] == ["evaluation_execute", "playground_execute"]
    response = api.send("POST", reverse("api_playground"), {"topology": alice_world.topology.pk, "task": {"answer": "42"}})
    assert response.status_code == 400 and "question" in response.json()["error"]
    response = api.send("POST", reverse("api_playground"), {"task": {"question": "hi"}})
    assert response.status_code == 400 and response.json()["field"] == "topology"

    listing = api.get(reverse("api_jobs"), kind="playground").json()
    assert [j["id"] for j in listing["results"]] == [played.pk]
    assert api.get(reverse("api_job", args=[job.pk])).json()["status"] == "queued"
    assert api.get(reverse("api_jobs"), kind="juggling").status_code == 400


def test_another_teams_objects_are_a_404_for_every_method(alice, alice_world, bob, bob_world, api):
    for name, obj in (("api_model", bob_world.source), ("api_agent", bob_world.tool), ("api_topology", bob_world.topology),
                      ("api_dataset", bob_world.dataset)):
        url = reverse(name, args=[obj.pk])
        for method, payload in (("GET", None), ("PATCH", {"name": "pwned"}), ("DELETE", None)):
            response = api.send(method, url, payload)
            assert response.status_code in (404, 405), (name, method, response.status_code)
            assert "Bravo" not in response.content.decode()
    assert type(bob_world.source).objects.get(pk=bob_world.source.pk).name == "Tiny"
    assert Agent.objects.filter(team=bob.team).count() == 2 and Topology.objects.filter(team=bob.team).exists()
    # another team's ids inside a body are refused too
    response = api.send("POST", reverse("api_agents"), {"name": "spy", "role": "tool", "model_source": bob_world.source.pk})
    assert response.status_code == 400 and "model_source" in response.json()["fields"]
    response = api.send("POST", reverse("api_topologies"), {"name": "spy", "environment": "math_tool", "agents": [bob_world.tool.pk]})
    assert response.status_code == 400 and "agents" in response.json()["fields"]
    response = api.send("POST", reverse("api_playground"), {"topology": bob_world.topology.pk, "task": {"question": "1+1"}})
    assert response.status_code == 400
    response = api.send("POST", reverse("api_run_evaluations", args=[alice_world.run.pk]), {"dataset": bob_world.dataset.pk})
    assert response.status_code == 400
    assert api.send("POST", reverse("api_run_evaluations", args=[bob_world.run.pk]), {"dataset": alice_world.dataset.pk}).status_code == 404
    assert not Job.objects.exists()


def test_a_run_launches_from_a_topology_and_a_dataset_made_through_the_api(alice, alice_world, api, enqueued,
                                                                           django_capture_on_commit_callbacks):
    from webapp.models import Run

    agent = api.send("POST", reverse("api_agents"), {"name": "calc", "role": "solver", "model_source": alice_world.source.pk,
                                                      "tools": ["calculator"]}).json()
    topology = api.send("POST", reverse("api_topologies"), {"name": "calculator", "environment": "arithmetic",
                                                             "env_args": {"level": 4}, "specialization": "single",
                                                             "agents": [agent["id"]]}).json()
    dataset = api.send("POST", reverse("api_datasets"), {"name": "L4", "environment": "arithmetic", "env_args": {"level": 4},
                                                          "size": 32, "eval_size": 8}).json()
    with django_capture_on_commit_callbacks(execute=True):
        response = api.send("POST", reverse("api_runs"), {"topology": topology["id"], "dataset": dataset["id"], "tags": ["api"],
                                                           "config": {"optim": {"steps": 2, "tasks_per_step": 2}, "grpo": {"k": 2}}})
    assert response.status_code == 201, response.content
    run = Run.objects.get(pk=response.json()["id"])
    config = run.to_config()
    assert run.topology_id == topology["id"] and run.dataset_id == dataset["id"] and run.name == "calculator" and enqueued == [run.pk]
    assert config.topology.agents[0].tools == ("calculator",) and config.topology.env_args == {"level": 4}
    assert config.optim.steps == 2 and config.data.train_size == 32 and config.model.source == alice_world.source.source
    before = Run.objects.count()
    response = api.send("POST", reverse("api_runs"), {"topology": topology["id"], "dataset": dataset["id"], "config": {
        "optim": {"steps": 0, "lr": -1.0, "tasks_per_step": 2}, "grpo": {"k": 1}, "generation": {"top_p": 7}}})
    assert response.status_code == 400 and Run.objects.count() == before
    fields = response.json()["fields"]
    assert {"optim.steps", "optim.lr", "grpo.k", "generation.top_p"} <= set(fields), fields  # every one at once
    assert response.json()["field"] in fields and all(len(m) == 1 for m in fields.values())
    response = api.send("POST", reverse("api_runs"), {"topology": 999999, "config": {}})
    assert response.status_code == 400 and response.json()["field"] == "topology"

"""The experiments API: launch from JSON (every problem of the spec in one 400, by field), list,
one experiment with its arms' intervals and each seed's run, cancel and resume; another team's
experiment is a 404."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from tests.webapp.experiments.helpers import finish, launch, trials
from webapp.models import Experiment, Run
from webapp.teams import services as tokens


class Api:
    def __init__(self, text: str):
        self.client = Client()
        self.headers = {"Authorization": f"Bearer {text}"}

    def get(self, path: str):
        return self.client.get(path, headers=self.headers)

    def post(self, path: str, body: dict | None = None):
        return self.client.post(path, json.dumps(body or {}), content_type="application/json", headers=self.headers)


@pytest.fixture
def api(alice) -> Api:
    return Api(tokens.api_token_create(user=alice.user, team=alice.team, name="notebook")[1])


def test_it_launches_an_experiment_from_json(api, alice_world, enqueued, django_capture_on_commit_callbacks):
    body = {"topology": alice_world.topology.pk, "dataset": alice_world.dataset.pk, "name": "k sweep",
            "config": {"optim": {"steps": 2}}, "axes": {"grpo.k": [2, 4]}, "seeds": [3, 4], "metric": "tool.success"}
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post("/api/v1/experiments/", body)
    assert response.status_code == 201, response.content
    data = response.json()
    experiment = Experiment.objects.get(pk=data["id"])
    assert response["Location"].endswith(f"/api/v1/experiments/{experiment.pk}/")
    assert data["trials"] == 4 and data["status"] == "active" and data["metric"] == "tool.success"
    assert [[t["seed"] for t in arm["trials"]] for arm in data["arms"]] == [[3, 4], [3, 4]]
    assert {r.to_config().grpo.k for r in experiment.runs.all()} == {2, 4} and len(enqueued) == 4
    assert all(r.to_config().optim.steps == 2 for r in experiment.runs.all())


def test_it_answers_every_problem_of_a_spec_in_one_400(api, alice_world):
    response = api.post("/api/v1/experiments/", {"topology": alice_world.topology.pk, "dataset": alice_world.dataset.pk,
                                                 "axes": {"optim.lr": [9], "optim.nope": [1], "grpo.k": []}, "seeds": [1, 1]})
    assert response.status_code == 400
    fields = response.json()["fields"]
    assert set(fields) == {"axes.optim.lr", "axes.optim.nope", "axes.grpo.k", "seeds[1]"}
    assert not Experiment.objects.exists() and Run.objects.count() == 1


def test_it_lists_shows_cancels_and_resumes(api, alice, alice_world, bob, bob_world):
    experiment = launch(alice, alice_world, seeds=[0, 1])
    runs = trials(experiment)
    finish(runs[0], 0.25)
    finish(runs[1], 0.75)
    listing = api.get("/api/v1/experiments/").json()
    assert listing["count"] == 1 and listing["results"][0]["name"] == "lr sweep"
    detail = api.get(f"/api/v1/experiments/{experiment.pk}/").json()
    first = detail["arms"][0]
    assert first["metrics"]["team.success"]["mean"] == 0.5 and first["metrics"]["team.success"]["n"] == 2
    low, high = first["metrics"]["team.success"]["ci95"]
    assert low < 0.25 and high > 0.75
    assert first["trials"][1] == {"seed": 1, "run": runs[1].pk, "status": "succeeded", "held": False,
                                  "metrics": {"team.success": 0.75, "tool.success": 0.75, "tool.reward": 0.5,
                                              "reasoner.success": 0.375, "reasoner.reward": 0.1}}
    assert detail["best_arm"] == {"optim.lr": 0.0001}
    assert api.post(f"/api/v1/experiments/{experiment.pk}/resume/").status_code == 400  # trials still queued
    assert api.post(f"/api/v1/experiments/{experiment.pk}/cancel/").json()["status"] == "cancelled"
    assert api.post(f"/api/v1/experiments/{experiment.pk}/resume/").json()["status"] == "active"
    assert experiment.runs.filter(status="queued").count() == 2

    theirs = launch(bob, bob_world, seeds=[0])
    assert api.get(f"/api/v1/experiments/{theirs.pk}/").status_code == 404
    assert api.post(f"/api/v1/experiments/{theirs.pk}/cancel/").status_code == 404
    assert theirs.runs.filter(status="queued").count() == 2

"""The JSON API, as a notebook uses it: `Authorization: Bearer <token>`; launch a run from a YAML
config (validated by RunConfig, errors name the field, 400), list and filter runs, fetch metrics
and rollouts page by page, download artifacts. Everything stays inside the token's team."""

from __future__ import annotations

import io
import json
import zipfile

import pytest
from django.test import Client
from django.urls import reverse

from tests.webapp.history_helpers import add_evaluations, add_metrics, add_rollouts, make_run, save_checkpoint, with_out_dir
from webapp.models import Run
from webapp.teams import services as tokens

TINY_CONFIG = """
name: from a notebook
model: {source: tiny-random:llama}
topology:
  environment: math_tool
  specialization: lora
  agents:
    - {name: tool, role: tool}
    - {name: reasoner, role: reasoner}
optim: {steps: 2, tasks_per_step: 2}
grpo: {k: 4}
"""


class Api:
    def __init__(self, text: str):
        self.client = Client()
        self.headers = {"Authorization": f"Bearer {text}"}

    def get(self, path: str, **params):
        return self.client.get(path, params, headers=self.headers)

    def post(self, path: str, body: str | bytes = b"", content_type: str = "application/yaml"):
        return self.client.post(path, body, content_type=content_type, headers=self.headers)


@pytest.fixture
def api(alice) -> Api:
    return Api(tokens.api_token_create(user=alice.user, team=alice.team, name="notebook")[1])


@pytest.fixture
def bob_api(bob) -> Api:
    return Api(tokens.api_token_create(user=bob.user, team=bob.team, name="bob")[1])


def test_it_needs_a_valid_token(alice, alice_world, api):
    for headers in ({}, {"Authorization": "Bearer trp_nope"}, {"Authorization": "Basic YWxpY2U6cGFzc3dvcmQ="}):
        response = Client().get(reverse("api_runs"), headers=headers)
        assert response.status_code == 401 and response["WWW-Authenticate"].startswith("Bearer") and "error" in response.json()
    assert alice.client.get(reverse("api_runs")).status_code == 401  # a logged-in browser session is not enough
    who = api.get(reverse("api_index")).json()
    assert who["user"] == "alice" and who["team"]["name"] == "Alpha"


def test_it_launches_a_run_from_yaml(alice, alice_world, api, enqueued, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(reverse("api_runs") + f"?dataset={alice_world.dataset.pk}", TINY_CONFIG)
    assert response.status_code == 201, response.content
    data = response.json()
    run = Run.objects.get(pk=data["id"])
    assert response["Location"].endswith(reverse("api_run", args=[run.pk])) and enqueued == [run.pk]
    assert run.team == alice.team and run.owner == alice.user and run.name == "from a notebook" and run.dataset == alice_world.dataset
    config = run.to_config()
    assert config.optim.steps == 2 and config.data.eval_size == 8 and config.topology.env_args == {"level": 1}
    assert data["status"] == "queued" and data["environment"] == "math_tool" and data["specialization"] == "lora"


def test_it_launches_from_json_with_tags_and_notes(alice, api, enqueued):
    body = json.dumps({"config": TINY_CONFIG, "name": "json launch", "tags": ["api", "sweep-1"], "notes": "from CI"})
    response = api.post(reverse("api_runs"), body, content_type="application/json")
    assert response.status_code == 201, response.content
    run = Run.objects.get(pk=response.json()["id"])
    assert run.name == "json launch" and run.notes == "from CI" and sorted(t.name for t in run.tags.all()) == ["api", "sweep-1"]


@pytest.mark.parametrize(("change", "field"), [
    ("grpo: {k: 1}", "grpo.k"),
    ("optim: {steps: many}", "optim.steps"),
    ("grpo: {kk: 3}", "grpo.kk"),
    ("topology: {environment: math_tool, specialization: magic, agents: [{name: a, role: tool}]}", "topology.specialization"),
    ("data: {path: /etc/passwd}", "data.path"),
    ("checkpoint: {resume_from: /tmp/other-team/step-000001}", "checkpoint.resume_from"),
    ("model: {source: 'local:/opt/models/secret'}", "model.source"),
    ("topology: {environment: 'subprocess:Popen', env_args: {args: 'true'}, agents: [{name: a, role: tool}]}", "topology.environment"),
    ("data: {reward_fn: 'os:getcwd'}", "data.reward_fn"),
    ("- not a mapping", "config"),
    ("grpo: [unclosed", "yaml"),
])
def test_it_names_the_field_at_fault(alice, api, change, field, enqueued, tmp_path):
    if "local:" in change:
        (tmp_path / "m").mkdir()
        (tmp_path / "m" / "config.json").write_text("{}")
        change = change.replace("/opt/models/secret", str(tmp_path / "m"))
    text = change if change.startswith("-") else TINY_CONFIG + change + "\n"
    response = api.post(reverse("api_runs"), text)
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field and response.json()["error"].startswith(field if field != "config" else "config")
    assert not Run.objects.filter(name="from a notebook").exists()


def test_it_lists_and_filters_runs(alice, alice_world, api, bob_world):
    make_run(alice.team, alice_world.run, name="winner", final_metrics={"success": 0.9})
    make_run(alice.team, alice_world.run, name="loser", final_metrics={"success": 0.1}, status="failed")
    data = api.get(reverse("api_runs"), sort="-metric:success").json()
    assert [r["name"] for r in data["results"]] == ["winner", "loser", "first"] and data["count"] == 3
    assert [r["name"] for r in api.get(reverse("api_runs"), status="failed").json()["results"]] == ["loser"]
    paged = api.get(reverse("api_runs"), per_page=2).json()
    assert len(paged["results"]) == 2 and paged["pages"] == 2 and "page=2" in paged["next"]
    assert api.get(reverse("api_runs"), page=2, per_page=2).json()["results"][0]["name"] == "first"


def test_it_pages_through_metrics_and_rollouts(alice, alice_world, api):
    run = alice_world.run
    add_metrics(run, 25)
    add_rollouts(run, 5, per_step=3)
    first = api.get(reverse("api_run_metrics", args=[run.pk]), limit=10).json()
    assert [p["step"] for p in first["results"]] == list(range(1, 11)) and "after=10" in first["next"]
    steps = [p["step"] for p in first["results"]]
    url = first["next"]
    while url:
        page = api.client.get(url, headers=api.headers).json()
        steps += [p["step"] for p in page["results"]]
        url = page["next"]
    assert steps == list(range(1, 26))
    assert first["results"][0]["agents"]["tool"]["loss"] == 0.5
    rollouts = api.get(reverse("api_run_rollouts", args=[run.pk]), limit=4).json()
    assert len(rollouts["results"]) == 4 and rollouts["next"] and rollouts["results"][0]["data"]["question"] == "Compute 1 + 0."
    only_step_2 = api.get(reverse("api_run_rollouts", args=[run.pk]), step=2).json()
    assert [r["episode"] for r in only_step_2["results"]] == [0, 1, 2] and only_step_2["next"] is None


def test_it_shows_a_run_with_evaluations_and_artifacts(alice, alice_world, api, data_dir):
    run = with_out_dir(alice_world.run, data_dir)
    add_evaluations(run, [(0, 0.0, {"tool": 0.0, "reasoner": 0.0}), (2, 0.5, {"tool": 0.5, "reasoner": 0.5})])
    save_checkpoint(run, 2)
    data = api.get(reverse("api_run", args=[run.pk])).json()
    assert data["config_yaml"] == run.config_yaml and [e["team_success"] for e in data["evaluations"]["training"]] == [0.0, 0.5]
    (ckpt,) = data["artifacts"]["checkpoints"]
    assert ckpt["step"] == 2 and {p["name"] for p in ckpt["policies"]} == {"tool", "reasoner"}
    tool = next(p for p in ckpt["policies"] if p["name"] == "tool")
    archive = zipfile.ZipFile(io.BytesIO(b"".join(api.client.get(tool["url"], headers=api.headers).streaming_content)))
    assert any(n.endswith("adapter_model.safetensors") for n in archive.namelist())
    config = api.client.get(data["artifacts"]["files"]["config.yaml"], headers=api.headers)
    assert config.content.decode() == run.config_yaml
    assert api.get(reverse("api_run_file", args=[run.pk, "passwd"])).status_code == 404


def test_it_keeps_teams_apart(alice_world, bob_api, bob_world):
    run = alice_world.run
    for name in ("api_run", "api_run_metrics", "api_run_rollouts", "api_run_evaluations"):
        response = bob_api.get(reverse(name, args=[run.pk]))
        assert response.status_code == 404 and response.json()["error"] == "Not found.", name
    assert bob_api.get(reverse("api_run_file", args=[run.pk, "config.yaml"])).status_code == 404
    assert bob_api.post(reverse("api_run_cancel", args=[run.pk])).status_code == 404
    assert [r["id"] for r in bob_api.get(reverse("api_runs")).json()["results"]] == [bob_world.run.pk]
    response = bob_api.post(reverse("api_runs") + f"?dataset={alice_world.dataset.pk}", TINY_CONFIG)
    assert response.status_code == 400 and response.json()["field"] == "dataset"


def test_it_cancels_a_run(alice_world, api):
    data = api.post(reverse("api_run_cancel", args=[alice_world.run.pk])).json()
    assert data["status"] == "cancelled"
    assert api.get(reverse("api_run_cancel", args=[alice_world.run.pk])).status_code == 405


def test_the_readme_example_launches(alice, api, enqueued):
    """README "API": `curl --data-binary @configs/tiny-lora.yaml .../api/v1/runs/`."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    assert "--data-binary @configs/tiny-lora.yaml http://127.0.0.1:8000/api/v1/runs/" in readme
    config = (Path(__file__).resolve().parents[3] / "configs" / "tiny-lora.yaml").read_text()
    response = api.post(reverse("api_runs"), config)
    assert response.status_code == 201, response.content
    assert response.json()["name"] == "tiny-lora"

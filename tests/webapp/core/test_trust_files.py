"""The trust boundary, files class: a model source is a bundled or tiny model, a well-formed hub
id, or a folder under an operator model root or in the team's own runs and exports. Never
another team's folders, never the data dir's internals, whatever the spelling (`..`, links,
relative paths, a trailing slash), and a refusal says nothing about what exists elsewhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.urls import reverse

from tests.webapp.api.test_api import TINY_CONFIG, Api
from tests.webapp.conftest import make_world
from webapp.models import ModelSource, Run
from webapp.teams import services as tokens


def _model_folder(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return path


@pytest.fixture
def alpha_export(alice, data_dir) -> Path:
    """Team Alpha's merged export, where the merge job writes it."""
    return _model_folder(data_dir / "exports" / str(alice.team.pk) / "merge-1")


@pytest.fixture
def alpha_checkpoint(alice, data_dir) -> Path:
    """A `full` agent's checkpoint folder in one of team Alpha's runs."""
    run = make_world(alice.team).run
    return _model_folder(data_dir / "runs" / str(run.pk) / "checkpoints" / "step-000001" / "tool")


def _save(persona, source: str):
    return persona.client.post(reverse("model_source_create"), {"name": "m", "source": source, "notes": ""})


def _refused(response) -> str:
    assert response.status_code == 200, "saved"
    return " ".join(response.context["form"].errors["source"])


def test_a_team_may_use_its_own_exports_and_checkpoints(alice, alpha_export, alpha_checkpoint):
    for i, folder in enumerate((alpha_export, alpha_checkpoint)):
        response = alice.client.post(reverse("model_source_create"), {"name": f"own{i}", "source": f"local:{folder}", "notes": ""})
        assert response.status_code == 302, response.context["form"].errors
    assert ModelSource.objects.filter(team=alice.team).count() == 3  # the world's own model, and these two


def test_another_teams_export_and_checkpoints_are_refused(bob, alpha_export, alpha_checkpoint):
    for folder in (alpha_export, alpha_checkpoint, alpha_export.parent, alpha_checkpoint.parents[2]):
        assert "outside the folders your team may use" in _refused(_save(bob, f"local:{folder}"))
    assert not ModelSource.objects.filter(team=bob.team, name="m").exists()


@pytest.mark.parametrize("spelling", [
    "{data}", "{data}/", "{data}/models", "{data}/datasets", "{data}/runs", "{data}/exports",
    "{bob_runs}/../../exports/{alpha}/merge-1", "{data}/exports/{alpha}/merge-1/.", "{data}//exports/{alpha}/merge-1",
    "/etc", "/", "/proc/self/cwd",
])
def test_every_spelling_of_a_foreign_folder_is_refused(alice, bob, alpha_export, data_dir, spelling):
    bob_run = make_world(bob.team).run
    folder = spelling.format(data=data_dir, alpha=alice.team.pk, bob_runs=data_dir / "runs" / str(bob_run.pk))
    assert "outside the folders your team may use" in _refused(_save(bob, f"local:{folder}"))


@pytest.mark.parametrize("source", ["local:models/x", "local:./x", "./x", "local:~/x", "local:../x"])
def test_relative_folders_are_refused(bob, source):
    text = _refused(_save(bob, source))
    assert "absolute path" in text or "outside the folders" in text


def test_a_link_out_of_a_model_root_is_followed_and_refused(bob, alpha_export, tmp_path, settings):
    root = tmp_path / "operator-models"
    _model_folder(root / "shared-llama")
    (root / "alpha").symlink_to(alpha_export)
    settings.TROUPE_MODEL_ROOTS = [str(root)]
    assert _save(bob, f"local:{root}/shared-llama").status_code == 302
    assert "outside the folders your team may use" in _refused(_save(bob, f"local:{root}/alpha"))


def test_a_refusal_says_nothing_about_what_exists(bob, alpha_export, data_dir):
    there = _refused(_save(bob, f"local:{alpha_export}"))
    nowhere = _refused(_save(bob, f"local:{alpha_export.parent}/merge-999"))
    assert there.replace(str(alpha_export), "X") == nowhere.replace(f"{alpha_export.parent}/merge-999", "X")


def test_the_api_says_nothing_about_what_exists_either(bob, data_dir):
    """The engine's own check ("no config.json") must never run on a folder the team may not use."""
    api = Api(tokens.api_token_create(user=bob.user, team=bob.team, name="nb")[1])
    answers = []
    for folder in (data_dir, data_dir / "models", data_dir / "no-such-folder"):
        response = api.post(reverse("api_runs"), TINY_CONFIG + f"model: {{source: 'local:{folder}'}}\n")
        assert response.status_code == 400 and response.json()["field"] == "model.source"
        answers.append(response.json()["error"].replace(str(folder), "X"))
    assert len(set(answers)) == 1 and "outside the folders your team may use" in answers[0]


@pytest.mark.parametrize("hub_id", [
    "../../etc/passwd", "org/..", "..", "org/../../x", "a/b/c", "./x", "org/.hidden", "-org/name", "org/name-",
    "org--x/name", "org/na me", "org\\name", "org/name\n", "o" * 97, "",
])
def test_malformed_hub_ids_are_refused_by_the_form_and_the_api(bob, hub_id):
    if hub_id and hub_id == hub_id.strip():  # the form strips surrounding whitespace, as it should
        assert "is not a hub id" in _refused(_save(bob, f"hf:{hub_id}"))
    api = Api(tokens.api_token_create(user=bob.user, team=bob.team, name="nb")[1])
    response = api.post(reverse("api_runs"), TINY_CONFIG + f"model: {{source: {json.dumps('hf:' + hub_id)}}}\n")
    assert response.status_code == 400 and response.json()["field"] == "model.source", response.content
    assert not Run.objects.exists()


@pytest.mark.parametrize("hub_id", ["HuggingFaceTB/SmolLM2-135M-Instruct", "Qwen/Qwen3-1.7B", "gpt2", "org_x/name.v2"])
def test_well_formed_hub_ids_are_accepted(bob, hub_id):
    assert _save(bob, f"hf:{hub_id}").status_code == 302


def test_the_api_refuses_another_teams_folder_in_any_model_field(alice, bob, alpha_export):
    api = Api(tokens.api_token_create(user=bob.user, team=bob.team, name="nb")[1])
    for change, field in ((f"model: {{source: 'local:{alpha_export}'}}", "model.source"),
                          ("topology: {environment: math_tool, specialization: full, agents: [{name: a, role: tool, "
                           f"model: 'local:{alpha_export}'}}]}}", "topology.agents[0].model")):
        response = api.post(reverse("api_runs"), TINY_CONFIG + change + "\n")
        assert response.status_code == 400 and response.json()["field"] == field, response.content
    assert not Run.objects.exists()


def test_the_worker_refuses_a_source_that_left_the_roots(bob, tmp_path, settings):
    """A source saved while a root was configured, then the operator removed the root."""
    root = tmp_path / "operator-models"
    model = _model_folder(root / "m")
    settings.TROUPE_MODEL_ROOTS = [str(root)]
    world = make_world(bob.team, source=f"local:{model}")
    settings.TROUPE_MODEL_ROOTS = []
    from webapp.runs import services as run_services

    run = run_services.run_execute(run_id=world.run.pk, worker="w", train=lambda *a, **k: pytest.fail("the engine must not start"))
    assert run is not None and run.status == Run.Status.FAILED and "outside the folders your team may use" in run.error_message


@pytest.mark.parametrize(("change", "field"), [
    ("report_to: {trackers: [mlflow], mlflow_tracking_uri: 'http://169.254.169.254/latest'}", "report_to.mlflow_tracking_uri"),
    ("report_to: {trackers: [trackio], trackio_space_id: other-org/their-space}", "report_to.trackio_space_id"),
    ("report_to: {trackers: [wandb], wandb_entity: someone-else}", "report_to.wandb_entity"),
])
def test_tracker_destinations_are_the_operators(bob, settings, change, field):
    """The worker's credentials send the data: a team may not point them elsewhere."""
    api = Api(tokens.api_token_create(user=bob.user, team=bob.team, name="nb")[1])
    response = api.post(reverse("api_runs"), TINY_CONFIG + change + "\n")
    assert response.status_code == 400 and response.json()["field"] == field, response.content
    assert "not a destination the operator allows" in response.json()["error"] and not Run.objects.exists()
    value = change.split(": ")[-1].rstrip("}").strip("'")
    settings.TROUPE_TRACKER_DESTINATIONS = [f"{field.split('.')[1].split('_')[0]}:{value}"]
    assert api.post(reverse("api_runs"), TINY_CONFIG + change + "\n").status_code == 201

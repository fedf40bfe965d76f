"""An SFT run is a run like any other: the run list filters on its algorithm (and the CSV says it),
the compare page names it, the API shows it with its lineage and launches one (on a conversations
dataset, from a finished run's checkpoint: another team's run and a run with no checkpoint are
named), and an experiment's trials can be SFT runs."""

from __future__ import annotations

import json

import pytest
import yaml
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from tests.webapp.api.test_api import api, bob_api  # noqa: F401 (fixtures)
from webapp.catalog.conversations import conversations_upload
from webapp.models import Checkpoint, Run
from webapp.runs import services as run_services

CONVERSATION = {"messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}], "agent": "reasoner"}


@pytest.fixture
def demos(alice):
    return conversations_upload(team=alice.team, name="demos", environment="math_tool",
                                upload=SimpleUploadedFile("d.jsonl", (json.dumps(CONVERSATION) + "\n").encode()))


@pytest.fixture
def sft_run(alice, alice_world, demos):
    config = run_services.run_config_build(topology=alice_world.topology, dataset=alice_world.dataset, name="sft one",
                                           overrides=run_services.run_source_overrides(team=alice.team, conversations=demos))
    return run_services.run_create(team=alice.team, user=alice.user, name="sft one", config=config,
                                   topology=alice_world.topology, dataset=alice_world.dataset)


def test_the_run_list_filters_and_exports_by_algorithm(alice, alice_world, sft_run):
    Run.objects.filter(pk=alice_world.run.pk).update(algorithm="grpo")
    page = alice.client.get(reverse("run_list"), {"algorithm": "sft"})
    assert [r.name for r in page.context["page"]] == ["sft one"]
    assert '<option value="sft" selected>SFT</option>' in page.content.decode() and "lora · SFT" in page.content.decode()
    csv = b"".join(alice.client.get(reverse("run_export"), {"algorithm": "sft"}).streaming_content).decode().splitlines()
    header = csv[0].split(",")
    assert csv[1].split(",")[header.index("algorithm")] == "sft" and len(csv) == 2


def test_an_sft_run_s_page_says_so_and_offers_no_warm_start_from_its_episodes(alice, sft_run):
    Run.objects.filter(pk=sft_run.pk).update(status=Run.Status.SUCCEEDED)
    page = alice.client.get(sft_run.get_absolute_url()).content.decode()
    assert f'<dt>Algorithm</dt><dd>SFT (supervised fine-tuning) on <a href="{sft_run_dataset(sft_run).get_absolute_url()}">demos</a></dd>' in page
    assert "Warm start from this run" not in page
    episodes = alice.client.get(reverse("run_rollouts", args=[sft_run.pk])).content.decode()
    assert "an SFT run learns from its conversations and rolls out none" in episodes


def sft_run_dataset(run):
    return run.team.datasets.get(name="demos")


def test_the_compare_page_names_the_algorithm(alice, alice_world, sft_run):
    page = alice.client.get(reverse("run_compare"), {"ids": [alice_world.run.pk, sft_run.pk]}).content.decode()
    assert "<td>SFT</td>" in page and "<td>GRPO</td>" in page


def test_the_api_launches_an_sft_run_from_a_checkpoint_and_shows_the_lineage(api, alice, alice_world, demos, tmp_path):  # noqa: F811
    Run.objects.filter(pk=alice_world.run.pk).update(status=Run.Status.SUCCEEDED)
    checkpoint = Checkpoint.objects.create(run=alice_world.run, step=2, path=str(tmp_path / "ck" / "step-000002"))
    body = {"topology": alice_world.topology.pk, "dataset": alice_world.dataset.pk, "conversations": demos.pk,
            "config": {"optim": {"steps": 2}}, "start_from": {"run": alice_world.run.pk}}
    response = api.post(reverse("api_runs"), json.dumps(body), content_type="application/json")
    assert response.status_code == 201, response.content
    launched = response.json()
    assert launched["algorithm"] == "sft"
    snapshot = yaml.safe_load(Run.objects.get(pk=launched["id"]).config_yaml)
    assert snapshot["model"]["init_from"] == {"run": checkpoint.path, "step": 2, "agents": {}}
    detail = api.get(reverse("api_run", args=[launched["id"]])).json()
    assert detail["started_from"] == {"run": alice_world.run.pk, "step": 2} and detail["algorithm"] == "sft"
    assert api.get(reverse("api_run", args=[alice_world.run.pk])).json()["warm_started"] == [launched["id"]]


def test_the_api_names_a_run_without_checkpoint_and_another_team_s_run(api, bob_api, alice, alice_world, bob_world, demos):  # noqa: F811
    Run.objects.filter(pk=alice_world.run.pk).update(status=Run.Status.SUCCEEDED)
    base = {"topology": alice_world.topology.pk, "dataset": alice_world.dataset.pk, "config": {"optim": {"steps": 2}}}
    runs = Run.objects.count()

    def launch(client, **extra):
        return client.post(reverse("api_runs"), json.dumps({**base, **extra}), content_type="application/json")

    response = launch(api, start_from={"run": alice_world.run.pk})
    assert response.status_code == 400 and response.json()["error"] == f"start_from: Run #{alice_world.run.pk} has no checkpoint."
    response = launch(api, start_from={"run": bob_world.run.pk})
    assert response.status_code == 400 and "No run #" in response.json()["error"]
    Checkpoint.objects.create(run=alice_world.run, step=2, path="/x/step-000002")
    response = launch(api, start_from={"run": alice_world.run.pk, "step": 5})
    assert response.json()["error"].endswith("has no checkpoint at step 5; it keeps steps 2.")
    response = launch(bob_api, topology=bob_world.topology.pk, dataset=bob_world.dataset.pk, conversations=demos.pk)
    assert response.status_code == 400 and response.json()["error"].startswith("conversations: no conversations dataset")
    assert Run.objects.count() == runs


def test_an_experiment_s_trials_can_be_sft_runs(alice, alice_world, demos):
    response = alice.client.post(reverse("experiment_new"), {
        "topology": alice_world.topology.pk, "dataset": alice_world.dataset.pk, "conversations": demos.pk, "name": "sft lr",
        "advanced_yaml": "optim: {steps: 2}", "axes_yaml": "optim.lr: [1.0e-4, 1.0e-3]", "search_yaml": "", "seeds": "0",
        "metric": "team.success", "direction": "maximize"})
    assert response.status_code == 302, response.context["form"].errors
    experiment = alice.team.experiments.get()
    assert {r.algorithm for r in experiment.runs.all()} == {"sft"} and experiment.runs.count() == 2
    form = alice.client.get(reverse("experiment_new")).context["form"]
    assert demos not in form.fields["dataset"].queryset


def test_the_migration_reads_older_runs_algorithm_from_their_snapshots(alice, alice_world, sft_run):
    import importlib

    from django.apps import apps

    Run.objects.update(algorithm="grpo")  # as the column's default left them
    importlib.import_module("webapp.migrations.0015_run_algorithm").backfill(apps, None)
    assert dict(Run.objects.values_list("name", "algorithm")) == {"first": "grpo", "sft one": "sft"}

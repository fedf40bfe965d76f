"""A launch that would fail when the run starts is refused at launch, whichever way it comes (the
API's `start_from`, the advanced YAML): an unknown `start_from` key, a warm start or resume from a
deleted checkpoint, from a running run's (which rotates them away), or at a step the checkpoint is
not, a task dataset as `sft.path` or a conversations file as `data.path`. And what a queued run
will read cannot be deleted under it: the checkpoint it starts from, the conversations it learns
from, the dataset a queued evaluation plays."""

from __future__ import annotations

import json

import pytest
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from django.utils import timezone

from tests.webapp.history_helpers import with_out_dir
from training.config import ConfigError
from webapp.artifacts.services import checkpoint_delete
from webapp.catalog.conversations import conversations_upload
from webapp.catalog.services.datasets import dataset_delete, dataset_upload
from webapp.jobs import services as jobs
from webapp.models import Checkpoint, Dataset, Run
from webapp.runs import services as run_services
from webapp.teams import services as tokens

CONVERSATION = {"messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}], "agent": "reasoner"}


@pytest.fixture
def finished(alice_world, data_dir):
    run = with_out_dir(alice_world.run, data_dir)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED)
    made = {}
    for step in (2, 4):
        folder = data_dir / "runs" / str(run.pk) / "checkpoints" / f"step-{step:06d}"
        for policy in ("tool", "reasoner"):
            (folder / policy).mkdir(parents=True)
        made[step] = Checkpoint.objects.create(run=run, step=step, path=str(folder))
    run.refresh_from_db()
    return run, made


@pytest.fixture
def demos(alice):
    return conversations_upload(team=alice.team, name="demos", environment="math_tool",
                                upload=SimpleUploadedFile("d.jsonl", (json.dumps(CONVERSATION) + "\n").encode()))


def _build(world, yaml_text):
    return run_services.run_config_build(topology=world.topology, dataset=world.dataset, advanced_yaml=yaml_text)


def test_an_unknown_start_from_key_is_refused(alice, alice_world, finished):
    api = tokens.api_token_create(user=alice.user, team=alice.team, name="n")[1]
    runs = Run.objects.count()
    for start in ({"run": alice_world.run.pk, "stepp": 2}, {"run": alice_world.run.pk, "agent": {"tool": "reasoner"}}, [1]):
        body = {"topology": alice_world.topology.pk, "dataset": alice_world.dataset.pk, "config": {"optim": {"steps": 2}}, "start_from": start}
        response = alice.client.post(reverse("api_runs"), json.dumps(body), content_type="application/json",
                                     headers={"Authorization": f"Bearer {api}"})
        assert response.status_code == 400 and response.json()["field"] == "start_from", response.content
    assert Run.objects.count() == runs


def test_a_warm_start_from_a_deleted_or_running_checkpoint_or_another_step_is_refused(alice_world, finished):
    run, made = finished
    assert _build(alice_world, f"model: {{init_from: {{run: '{made[2].path}', step: 2}}}}").model.init_from.step == 2
    with pytest.raises(ConfigError) as err:
        _build(alice_world, f"model: {{init_from: {{run: '{made[2].path}', step: 4}}}}")
    assert err.value.field == "model.init_from.step"
    Checkpoint.objects.filter(pk=made[2].pk).update(deleted=timezone.now())
    for field, text in (("model.init_from.run", f"model: {{init_from: {{run: '{made[2].path}'}}}}"),
                        ("checkpoint.resume_from", f"checkpoint: {{resume_from: '{made[2].path}'}}")):
        with pytest.raises(ConfigError) as err:
            _build(alice_world, text)
        assert err.value.field == field and "kept checkpoint" in err.value.message
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)  # checkpoint.keep may rotate step 4 away before the new run starts
    with pytest.raises(ConfigError) as err:
        _build(alice_world, f"model: {{init_from: {{run: '{made[4].path}'}}}}")
    assert err.value.field == "model.init_from.run"


def test_sft_path_takes_conversations_and_data_path_tasks(alice, alice_world, demos, good_rows):
    tasks = dataset_upload(team=alice.team, name="tasks", environment="math_tool", eval_fraction=0.25,
                           upload=SimpleUploadedFile("t.jsonl", "".join(json.dumps(r) + "\n" for r in good_rows).encode()))
    with pytest.raises(ConfigError) as err:
        _build(alice_world, f"algorithm: sft\nsft: {{path: '{tasks.path}'}}")
    assert err.value.field == "sft.path" and "conversations" in err.value.message
    with pytest.raises(ConfigError) as err:
        run_services.run_config_build(topology=alice_world.topology, dataset=alice_world.dataset,
                                      advanced_yaml=f"data: {{path: '{demos.path}'}}")
    assert err.value.field == "data.path"
    assert _build(alice_world, f"algorithm: sft\nsft: {{path: '{demos.path}'}}").sft.path == str(demos.path)


def test_what_a_queued_run_reads_cannot_be_deleted_under_it(alice, alice_world, finished, demos):
    run, made = finished
    config = _build(alice_world, f"algorithm: sft\nsft: {{path: '{demos.path}'}}\nmodel: {{init_from: {{run: '{made[2].path}'}}}}")
    queued = run_services.run_create(team=alice.team, user=alice.user, name="warm", config=config)
    with pytest.raises(ValidationError, match=f"Run #{queued.pk} .queued or running. starts from this checkpoint"):
        checkpoint_delete(checkpoint=made[2], actor=alice.user)
    page = alice.client.get(reverse("run_checkpoint_delete", args=[run.pk, 2])).content.decode()
    assert "starts from this checkpoint" in page and "Delete from disk</button>" not in page
    with pytest.raises(ValidationError, match="learns from this dataset"):
        dataset_delete(dataset=demos, actor=alice.user)
    assert alice.client.post(reverse("dataset_delete", args=[demos.pk])).status_code in (200, 302, 400, 409)
    assert Dataset.objects.filter(pk=demos.pk).exists() and demos.path.is_file()
    assert Checkpoint.objects.get(pk=made[2].pk).deleted is None
    run_services.run_cancel(run=queued, actor=alice.user)
    checkpoint_delete(checkpoint=made[2], actor=alice.user)
    dataset_delete(dataset=demos, actor=alice.user)


def test_a_dataset_a_queued_evaluation_plays_cannot_be_deleted(alice, alice_world, finished, good_rows, jobs_sent):
    run, made = finished
    held_out = dataset_upload(team=alice.team, name="held", environment="math_tool", eval_fraction=0.5,
                              upload=SimpleUploadedFile("h.jsonl", "".join(json.dumps(r) + "\n" for r in good_rows).encode()))
    jobs.evaluation_request(run=run, user=alice.user, dataset=held_out, checkpoint=made[4])
    with pytest.raises(ValidationError, match="evaluation"):
        dataset_delete(dataset=held_out, actor=alice.user)

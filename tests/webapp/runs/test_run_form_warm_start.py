"""Start a run from another run's weights on the web: the run form lists the checkpoints of the
team's finished runs (not another team's, not deleted ones, not a running run's), records the pick
and an agent mapping as `model.init_from`, and clone-and-edit picks them again; both run pages
show the lineage."""

from __future__ import annotations

import json

import yaml
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from django.utils import timezone

from webapp.catalog.conversations import conversations_upload
from webapp.models import Checkpoint, Run
from webapp.runs import services as run_services
from webapp.runs.forms import agent_mapping

from .test_run_clone import form_fields, submit_clone


def _data(world, **overrides):
    data = {"topology": world.topology.pk, "dataset": world.dataset.pk, "name": "warm", "specialization": "", "steps": "2",
            "k": "", "tasks_per_step": "", "lr": "", "lora_r": "", "max_new_tokens": "", "temperature": "", "beta": "",
            "eval_every": "", "advanced_yaml": "", "algorithm": "grpo", "init_checkpoint": "", "init_agents": ""}
    data.update(overrides)
    return data


def _finished_with_checkpoint(run, tmp_path, step=3):
    Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED)
    return Checkpoint.objects.create(run=run, step=step, path=str(tmp_path / f"run{run.pk}" / "checkpoints" / f"step-{step:06d}"))


def test_it_offers_the_kept_checkpoints_of_the_team_s_finished_runs(alice, alice_world, bob_world, tmp_path):
    kept = _finished_with_checkpoint(alice_world.run, tmp_path)
    Checkpoint.objects.create(run=alice_world.run, step=1, path=str(tmp_path / "gone"), deleted=timezone.now())
    running = run_services.run_create(team=alice.team, user=alice.user, name="busy", config=alice_world.run.to_config())
    Checkpoint.objects.create(run=running, step=1, path=str(tmp_path / "busy"))
    _finished_with_checkpoint(bob_world.run, tmp_path)
    form = alice.client.get(reverse("run_new")).context["form"]
    assert list(form.fields["init_checkpoint"].queryset) == [kept]
    assert f"run #{alice_world.run.pk} first · step 3" in alice.client.get(reverse("run_new")).content.decode()
    run_page = alice.client.get(alice_world.run.get_absolute_url()).content.decode()
    link = f"{reverse('run_new')}?topology={alice_world.topology.pk}&amp;dataset={alice_world.dataset.pk}&amp;init_checkpoint={kept.pk}"
    assert f'href="{link}">New run from its weights' in run_page
    picked = alice.client.get(link.replace("&amp;", "&")).context["form"]
    assert picked["init_checkpoint"].value() == str(kept.pk) and picked["topology"].value() == str(alice_world.topology.pk)


def test_it_records_the_pick_in_the_config_and_both_pages_show_the_lineage(alice, alice_world, tmp_path, enqueued,
                                                                          django_capture_on_commit_callbacks):
    checkpoint = _finished_with_checkpoint(alice_world.run, tmp_path)
    with django_capture_on_commit_callbacks(execute=True):
        response = alice.client.post(reverse("run_new"), _data(alice_world, init_checkpoint=checkpoint.pk, init_agents="tool=reasoner"))
    new = Run.objects.get(name="warm")
    assert response["Location"] == new.get_absolute_url()
    init = yaml.safe_load(new.config_yaml)["model"]["init_from"]
    assert init == {"run": checkpoint.path, "step": 3, "agents": {"tool": "reasoner"}}
    page = alice.client.get(new.get_absolute_url()).content.decode()
    assert f'Started from <a href="{alice_world.run.get_absolute_url()}">run #{alice_world.run.pk}</a> step 3' in page
    assert f"#{new.pk} warm" in alice.client.get(alice_world.run.get_absolute_url()).content.decode()


def test_bad_mappings_and_other_teams_checkpoints_are_named_and_nothing_is_saved(alice, alice_world, bob_world, tmp_path):
    checkpoint = _finished_with_checkpoint(alice_world.run, tmp_path)
    foreign = _finished_with_checkpoint(bob_world.run, tmp_path)
    runs = Run.objects.count()
    errors = alice.client.post(reverse("run_new"), _data(alice_world, init_checkpoint=checkpoint.pk, init_agents="tool")).context["form"].errors
    assert "'tool' is not policy=folder" in errors["init_agents"][0]
    errors = alice.client.post(reverse("run_new"), _data(alice_world, init_agents="tool=reasoner")).context["form"].errors
    assert "pick the checkpoint to start from too" in errors["init_agents"][0]
    errors = alice.client.post(reverse("run_new"), _data(alice_world, init_checkpoint=foreign.pk)).context["form"].errors
    assert "Select a valid choice" in errors["init_checkpoint"][0]
    errors = alice.client.post(reverse("run_new"), _data(alice_world, init_checkpoint=checkpoint.pk, init_agents="tool=no such")).context["form"].errors
    assert "'no such' is not a policy folder" in errors["init_agents"][0]
    assert Run.objects.count() == runs
    assert agent_mapping(" a=b,\nc = shared ") == {"a": "b", "c": "shared"}


def test_clone_and_edit_picks_the_checkpoint_and_the_sft_dataset_again(alice, alice_world, tmp_path, enqueued,
                                                                       django_capture_on_commit_callbacks):
    checkpoint = _finished_with_checkpoint(alice_world.run, tmp_path)
    demos = conversations_upload(team=alice.team, name="demos", environment="math_tool", upload=SimpleUploadedFile("d.jsonl", (json.dumps(
        {"messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}], "agent": "reasoner"}) + "\n").encode()))
    with django_capture_on_commit_callbacks(execute=True):
        alice.client.post(reverse("run_new"), _data(alice_world, init_checkpoint=checkpoint.pk, init_agents="tool=reasoner",
                                                    algorithm="sft", conversations=demos.pk, k="", beta=""))
    warm = Run.objects.get(name="warm")
    Run.objects.filter(pk=warm.pk).update(status=Run.Status.SUCCEEDED)

    fields = form_fields(alice.client.get(reverse("run_new"), {"clone": warm.pk}).content.decode())
    assert (fields["init_checkpoint"], fields["init_agents"]) == (str(checkpoint.pk), "tool=reasoner")
    assert (fields["algorithm"], fields["conversations"]) == ("sft", str(demos.pk))
    assert "init_from" not in fields.get("advanced_yaml", "") and "sft" not in fields.get("advanced_yaml", "")
    clone = submit_clone(alice, warm, django_capture_on_commit_callbacks)
    assert clone.to_config().to_dict() == warm.to_config().to_dict() | {"name": "warm (clone)"}

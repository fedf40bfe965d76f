"""The run form launches an SFT run: pick the algorithm and a conversations dataset; the stored
config says `algorithm: sft` and names the dataset's file. Without one, the form says so."""

from __future__ import annotations

import json

import yaml
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from webapp.catalog.conversations import conversations_upload
from webapp.models import Run

CONVERSATION = {"messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}], "agent": "reasoner"}


def _data(world, **overrides):
    data = {"topology": world.topology.pk, "dataset": world.dataset.pk, "name": "", "specialization": "", "steps": "2",
            "k": "", "tasks_per_step": "", "lr": "1e-4", "lora_r": "4", "max_new_tokens": "8", "temperature": "", "beta": "",
            "eval_every": "0", "advanced_yaml": "", "algorithm": "sft"}
    data.update(overrides)
    return data


def test_it_queues_an_sft_run_on_the_chosen_conversations(alice, alice_world, data_dir, enqueued, django_capture_on_commit_callbacks):
    demos = conversations_upload(team=alice.team, name="demos", environment="math_tool",
                                 upload=SimpleUploadedFile("d.jsonl", (json.dumps(CONVERSATION) + "\n").encode()))
    form = alice.client.get(reverse("run_new")).context["form"]
    assert list(form.fields["conversations"].queryset) == [demos]
    assert demos not in form.fields["dataset"].queryset
    with django_capture_on_commit_callbacks(execute=True):
        response = alice.client.post(reverse("run_new"), _data(alice_world, conversations=demos.pk))
    run = Run.objects.exclude(pk=alice_world.run.pk).get()
    assert response["Location"] == run.get_absolute_url()
    snapshot = yaml.safe_load(run.config_yaml)
    assert snapshot["algorithm"] == "sft" and snapshot["sft"]["path"] == str(demos.path)
    assert enqueued == [run.pk]


def test_an_sft_run_needs_a_conversations_dataset(alice, alice_world):
    response = alice.client.post(reverse("run_new"), _data(alice_world))
    assert response.status_code == 200
    assert "conversations dataset" in " ".join(response.context["form"].errors["conversations"])
    assert not Run.objects.exclude(pk=alice_world.run.pk).exists()

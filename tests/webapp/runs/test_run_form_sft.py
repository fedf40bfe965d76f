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


def test_the_form_follows_the_algorithm(alice, alice_world, data_dir, enqueued):
    """SFT's own fields set the run's sft section; GRPO's (hidden for SFT) set nothing; the generated
    name says SFT and the run page shows no K-candidates panel (issue 46, class 5)."""
    demos = conversations_upload(team=alice.team, name="demos", environment="math_tool",
                                 upload=SimpleUploadedFile("d.jsonl", (json.dumps(CONVERSATION) + "\n").encode()))
    page = alice.client.get(reverse("run_new")).content.decode()
    assert 'data-grpo-only="k tasks_per_step temperature beta"' in page
    assert 'data-sft-only="conversations sft_batch_size sft_max_length"' in page and "run-form.js" in page
    response = alice.client.post(reverse("run_new"), _data(alice_world, conversations=demos.pk, k="3", beta="0.5",
                                                           sft_batch_size="2", sft_max_length="256"))
    run = Run.objects.exclude(pk=alice_world.run.pk).get()
    assert response["Location"] == run.get_absolute_url()
    config = run.to_config()
    assert (config.sft.batch_size, config.sft.max_length) == (2, 256)
    assert (config.grpo.k, config.grpo.beta) == (type(config.grpo)().k, type(config.grpo)().beta)  # hidden for SFT: not applied
    assert run.name == f"{alice_world.topology.name} · SFT on demos"
    page = alice.client.get(run.get_absolute_url()).content.decode()
    assert 'id="rollouts-card"' not in page
    assert 'id="rollouts-card"' in alice.client.get(alice_world.run.get_absolute_url()).content.decode()  # a GRPO run has one
    # eval.every: 0 is said as it is
    assert 'id="no-eval"' in page and "no periodic evaluation" in page and "every <code>eval.every</code>" not in page

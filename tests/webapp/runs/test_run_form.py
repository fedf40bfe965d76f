"""The new-run form: defaults shown, engine errors next to the field they name, a preview,
and a queued run with its YAML snapshot enqueued once committed."""

from __future__ import annotations

import yaml
from django.urls import reverse

from webapp.models import Dataset, Run


def _data(world, **overrides):
    data = {"topology": world.topology.pk, "dataset": world.dataset.pk, "name": "", "specialization": "",
            "steps": "2", "k": "3", "tasks_per_step": "1", "lr": "1e-4", "lora_r": "4", "max_new_tokens": "8",
            "temperature": "1.0", "beta": "0", "eval_every": "0", "advanced_yaml": ""}
    data.update(overrides)
    return data


def test_it_shows_the_defaults_an_empty_field_takes(alice, alice_world):
    html = alice.client.get(reverse("run_new")).content.decode()
    assert 'name="steps" placeholder="50"' in html and 'name="k" placeholder="4"' in html
    assert 'placeholder="1e-4 or 1e-5"' in html and "an empty field takes the default shown in it" in html
    assert "empty = engine default" not in html


def test_it_preselects_a_topology_from_the_query_string(alice, alice_world):
    form = alice.client.get(reverse("run_new"), {"topology": alice_world.topology.pk}).context["form"]
    assert str(form["topology"].value()) == str(alice_world.topology.pk)


def test_it_queues_a_run_and_enqueues_it_on_commit(alice, alice_world, enqueued, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = alice.client.post(reverse("run_new"), _data(alice_world))
    run = Run.objects.exclude(pk=alice_world.run.pk).get()
    assert response["Location"] == run.get_absolute_url()
    assert run.status == "queued" and run.owner == alice.user and run.total_steps == 2
    assert run.name == "duo · gen L1"
    snapshot = yaml.safe_load(run.config_yaml)
    assert snapshot["grpo"]["k"] == 3 and snapshot["optim"]["lr"] == 1e-4 and snapshot["lora"]["r"] == 4
    assert run.to_config().optim.steps == 2
    assert enqueued == [run.pk]


def test_it_does_not_enqueue_before_commit(alice, alice_world, enqueued, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        alice.client.post(reverse("run_new"), _data(alice_world))
    assert enqueued == [] and len(callbacks) == 1


def test_it_shows_an_engine_error_next_to_the_field(alice, alice_world, enqueued):
    response = alice.client.post(reverse("run_new"), _data(alice_world, k="1"))
    assert response.status_code == 200
    assert response.context["form"].errors["k"] == ["Must be at least 2 (a group of 1 has no advantage signal) (grpo.k)."]
    html = response.content.decode()
    field = html[html.index('id="field-k"'):]
    assert "Must be at least 2" in field[: field.index("</div>")]
    assert Run.objects.count() == 1 and enqueued == []


def test_it_shows_specialization_errors_at_the_specialization(alice, alice_world):
    response = alice.client.post(reverse("run_new"), _data(alice_world, specialization="single"))
    assert "specialization" in response.context["form"].errors


def test_it_shows_yaml_errors_at_the_yaml_box(alice, alice_world):
    for text in ("grpo: [1, 2", "grpo:\n  eps_low: 5", "nonsense: 1", "optim:\n  steps: 0"):
        response = alice.client.post(reverse("run_new"), _data(alice_world, advanced_yaml=text))
        assert list(response.context["form"].errors) == ["advanced_yaml"], text


def test_it_shows_a_dataset_for_another_environment_at_the_dataset(alice, alice_world):
    other = Dataset.objects.create(team=alice.team, name="arith", kind="generator", environment="arithmetic", size=8, eval_size=0)
    response = alice.client.post(reverse("run_new"), _data(alice_world, dataset=other.pk))
    assert "dataset" in response.context["form"].errors


def test_it_previews_the_resolved_config(alice, alice_world):
    response = alice.client.post(reverse("run_preview"), _data(alice_world, advanced_yaml="seed: 7"), headers={"HX-Request": "true"})
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="preview">')
    assert "<html" not in html
    assert "seed: 7" in html and "k: 3" in html


def test_it_previews_errors(alice, alice_world):
    response = alice.client.post(reverse("run_preview"), _data(alice_world, k="1"), headers={"HX-Request": "true"})
    assert b"K (group size): Must be at least 2" in response.content
    response = alice.client.post(reverse("run_preview"), {"topology": alice_world.topology.pk, "dataset": "999"},
                                 headers={"HX-Request": "true"})
    assert b"Dataset: Select a valid choice" in response.content


def test_it_keeps_the_preview_hint_until_both_are_picked(alice, alice_world):
    response = alice.client.post(reverse("run_preview"), {"topology": alice_world.topology.pk}, headers={"HX-Request": "true"})
    assert b"errors" not in response.content and b"Pick a topology" in response.content


def test_a_run_on_several_gpus_needs_a_task_per_gpu(alice, alice_world, enqueued, django_capture_on_commit_callbacks):
    response = alice.client.post(reverse("run_new"), _data(alice_world, gpus="2"))
    assert response.context["form"].errors["tasks_per_step"] == [
        "Must be at least resources.gpus (2): each process rolls out its share of the step's tasks (optim.tasks_per_step)."
    ]
    with django_capture_on_commit_callbacks(execute=True):
        alice.client.post(reverse("run_new"), _data(alice_world, gpus="2", tasks_per_step="4"))
    run = Run.objects.exclude(pk=alice_world.run.pk).get()
    assert run.to_config().resources.gpus == 2 and enqueued == [run.pk]

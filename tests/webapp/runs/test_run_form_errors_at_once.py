"""The new-run form reports every problem at once, each next to its field and in words: a field
that does not parse does not hide the engine's objection to another, the preview shows them all
and takes back the error of a field that was fixed; an empty field takes the default it shows,
and LoRA's default learning rate is LoRA's."""

from __future__ import annotations

import yaml
from django.urls import reverse

from tests.webapp.runs.test_run_form import _data
from webapp.models import Run, Topology


def test_four_wrong_fields_get_four_errors(alice, alice_world, enqueued):
    response = alice.client.post(reverse("run_new"), _data(alice_world, lr="fast", k="1", steps="0", tasks_per_step="0",
                                                           advanced_yaml="grpo:\n  alpha: [1,\n"))
    errors = response.context["form"].errors
    assert set(errors) == {"lr", "k", "steps", "tasks_per_step", "advanced_yaml"}, errors
    assert errors["lr"] == ["Enter a number."]
    assert errors["steps"] == ["Must be between 1 and 1000000, got 0 (optim.steps)."]
    assert errors["tasks_per_step"] == ["At least 1 task per step (optim.tasks_per_step)."]  # not a sentence about GPUs
    assert errors["advanced_yaml"][0].startswith("Not valid YAML: ") and "(line 2, column 13)" in errors["advanced_yaml"][0]
    html = response.content.decode()
    for field in errors:
        block = html[html.index(f'id="errors-{field}"'):]
        assert '<p class="error">' in block[: block.index("</div>")], field
    assert Run.objects.count() == 1 and enqueued == []


def test_the_preview_lists_every_problem_and_clears_a_fixed_field(alice, alice_world):
    bad = alice.client.post(reverse("run_preview"), _data(alice_world, k="1", lr="-1"), headers={"HX-Request": "true"}).content.decode()
    assert "2 things to fix before this run can start" in bad
    assert "K (group size): Must be at least 2" in bad and "Learning rate: Must be positive" in bad
    assert '<div class="field-errors" id="errors-k" hx-swap-oob="true"><p class="error">' in bad
    fixed = alice.client.post(reverse("run_preview"), _data(alice_world, k="3", lr="-1"), headers={"HX-Request": "true"}).content.decode()
    assert '<div class="field-errors" id="errors-k" hx-swap-oob="true"></div>' in fixed  # the stale error goes
    assert "1 thing to fix" in fixed
    clean = alice.client.post(reverse("run_preview"), _data(alice_world), headers={"HX-Request": "true"}).content.decode()
    assert '<pre class="yaml">' in clean and '<p class="error">' not in clean


def test_empty_fields_take_their_defaults_and_lora_gets_its_learning_rate(alice, alice_world, enqueued,
                                                                          django_capture_on_commit_callbacks):
    blank = {name: "" for name in ("steps", "k", "tasks_per_step", "lr", "lora_r", "max_new_tokens", "temperature", "beta",
                                   "eval_every")}
    assert Topology.objects.get(pk=alice_world.topology.pk).specialization == "lora"
    with django_capture_on_commit_callbacks(execute=True):
        alice.client.post(reverse("run_new"), _data(alice_world, **blank))
    config = Run.objects.exclude(pk=alice_world.run.pk).get().to_config()
    assert config.optim.lr == 1e-4 and config.optim.steps == 50 and config.grpo.k == 4
    preview = alice.client.post(reverse("run_preview"), _data(alice_world, **blank, specialization="prompt"),
                                headers={"HX-Request": "true"}).content.decode()
    assert "lr: 1.0e-05" in preview  # whole-model fine-tuning keeps the engine's
    explicit = alice.client.post(reverse("run_preview"), _data(alice_world, **blank, advanced_yaml="optim:\n  lr: 3.0e-4\n"),
                                 headers={"HX-Request": "true"}).content.decode()
    assert yaml.safe_load(explicit[explicit.index("<pre") + len('<pre class="yaml">'):explicit.index("</pre>")].replace("&#x27;", "'"))[
        "optim"]["lr"] == 3e-4

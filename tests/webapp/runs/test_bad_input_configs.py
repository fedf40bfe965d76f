"""Bad run configs: through the run form's advanced YAML box each error appears at the YAML box
naming the dotted field, through the form's own fields at that field; the engine's YAML loader
(the CLI path) names the same field; nothing is saved or enqueued."""

from __future__ import annotations

import pytest
import yaml
from django.urls import reverse

from tests.webapp.bad_inputs import BAD_RUN_FIELDS, BAD_YAML
from training.config import ConfigError, RunConfig
from webapp.models import Run


def form_data(world, **overrides):
    data = {"topology": world.topology.pk, "dataset": world.dataset.pk, "name": "", "specialization": "",
            "steps": "2", "k": "3", "tasks_per_step": "1", "lr": "1e-4", "lora_r": "4", "max_new_tokens": "8",
            "temperature": "1.0", "beta": "0", "eval_every": "0", "advanced_yaml": ""}
    data.update(overrides)
    return data


def error_at(response, field: str) -> str:
    html = response.content.decode()
    block = html[html.index(f'id="field-{field}"'):]
    return block[: block.index("</div>")]


@pytest.mark.parametrize(("what", "text", "dotted", "phrase"), BAD_YAML, ids=[c[0] for c in BAD_YAML])
def test_the_yaml_box_names_the_field(alice, alice_world, enqueued, what, text, dotted, phrase):
    response = alice.client.post(reverse("run_new"), form_data(alice_world, advanced_yaml=text))
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert list(errors) == ["advanced_yaml"], errors
    message = " ".join(errors["advanced_yaml"])
    # a field the YAML names is named; a YAML that does not parse says so in a sentence
    assert message.startswith(f"{dotted}:" if dotted != "yaml" else ("Not valid YAML: ", "The advanced YAML ")), message
    assert phrase in message, message
    assert phrase in error_at(response, "advanced_yaml").replace("&#x27;", "'")
    assert Run.objects.count() == 1 and enqueued == []  # only the world's own run


@pytest.mark.parametrize(("what", "text", "dotted", "phrase"), [c for c in BAD_YAML if c[2] != "yaml"],
                         ids=[c[0] for c in BAD_YAML if c[2] != "yaml"])
def test_the_engine_names_the_same_field(alice_world, what, text, dotted, phrase):
    tree = yaml.safe_load(alice_world.run.config_yaml)
    extra = yaml.safe_load(text)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(tree.get(key), dict):
            tree[key].update(value)
        else:
            tree[key] = value
    with pytest.raises(ConfigError) as caught:
        RunConfig.from_yaml(yaml.safe_dump(tree))
    assert caught.value.field == dotted and phrase in caught.value.message


@pytest.mark.parametrize(("field", "value", "phrase"), BAD_RUN_FIELDS, ids=[f"{f}={v[:12]}" for f, v, _ in BAD_RUN_FIELDS])
def test_each_run_form_field_shows_its_own_error(alice, alice_world, enqueued, field, value, phrase):
    response = alice.client.post(reverse("run_new"), form_data(alice_world, **{field: value}))
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert list(errors) == [field], errors
    assert phrase in " ".join(errors[field])
    assert Run.objects.count() == 1 and enqueued == []


def test_a_stored_config_that_no_longer_validates_fails_the_run_not_the_worker(alice_world):
    from tests.webapp.conftest import FakeResult
    from webapp.runs import services as run_services

    tree = yaml.safe_load(alice_world.run.config_yaml)
    tree["optim"]["steps"] = -1
    Run.objects.filter(pk=alice_world.run.pk).update(config_yaml=yaml.safe_dump(tree))
    run = run_services.run_execute(run_id=alice_world.run.pk, train=lambda *a, **k: FakeResult(status="succeeded", step=1))
    assert run.status == Run.Status.FAILED and "optim.steps" in run.error_message

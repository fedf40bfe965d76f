"""One builder, one validation pass: a run-form POST, its htmx preview, an API launch and a worker
executing a run each check the config once (`RunConfig.problems`, which `validate` runs), and every
problem still comes back at once: each unknown key of the advanced YAML at the YAML box with its
key, the engine's and the trust boundary's problems side by side."""

from __future__ import annotations

import pytest
import yaml
from django.urls import reverse

from tests.webapp.api.test_api import TINY_CONFIG, Api
from tests.webapp.runs.test_run_execute import fake_train
from tests.webapp.runs.test_run_form import _data
from training.config import ConfigError, RunConfig
from webapp.models import Run
from webapp.runs import services as run_services
from webapp.teams import services as tokens

EVERY_FIELD = {"specialization": "prompt", "gpus": "1", "advanced_yaml": "seed: 1\ngrpo:\n  alpha: 0.5\n"}
"""Every form field set (with `_data`'s), so that the old per-field retries would all have run."""


@pytest.fixture
def passes(monkeypatch) -> list[str]:
    """The name of each config a validation pass checked."""
    seen: list[str] = []
    real = RunConfig.problems

    def counted(self):
        seen.append(self.name)
        return real(self)

    monkeypatch.setattr(RunConfig, "problems", counted)
    return seen


def test_a_form_post_and_a_preview_check_the_config_once(alice, alice_world, enqueued, passes, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = alice.client.post(reverse("run_new"), _data(alice_world, **EVERY_FIELD))
    assert response.status_code == 302 and len(enqueued) == 1
    assert len(passes) == 1  # was 14: the topology and dataset alone, each of the 11 fields alone, the YAML alone, then all together
    passes.clear()
    preview = alice.client.post(reverse("run_preview"), _data(alice_world, **EVERY_FIELD), headers={"HX-Request": "true"})
    assert '<pre class="yaml">' in preview.content.decode() and len(passes) == 1
    passes.clear()
    bad = alice.client.post(reverse("run_new"), _data(alice_world, **{**EVERY_FIELD, "k": "1", "lr": "-1",
                                                                      "advanced_yaml": "grpo: {kk: 1}"}))
    assert set(bad.context["form"].errors) == {"k", "lr", "advanced_yaml"} and len(passes) == 1


def test_an_api_launch_checks_the_config_once(alice, alice_world, enqueued, passes):
    api = Api(tokens.api_token_create(user=alice.user, team=alice.team, name="count")[1])
    response = api.post(reverse("api_runs") + f"?dataset={alice_world.dataset.pk}", TINY_CONFIG)
    assert response.status_code == 201 and passes == ["from a notebook"]


def test_the_worker_checks_the_stored_config_once(alice_world, passes):
    seen = {}

    def train(config, *, out_dir, sink):
        config.validate()  # what the engine's train() does first: the worker's config passed already
        seen["config"] = config
        return fake_train(config, out_dir=out_dir, sink=sink)

    run = run_services.run_execute(run_id=alice_world.run.pk, worker="w", train=train)
    assert run.status == Run.Status.SUCCEEDED and passes == ["first"]  # was 2: Run.to_config, then train()'s validate


def test_the_yaml_box_names_every_unknown_key_at_once(alice, alice_world, enqueued):
    text = "grpo:\n  kk: 1\n  alpah: 0.5\noptimizer: {lr: 1}\ngeneration:\n  top_k: 5\n  temperature: 0.7\n"
    response = alice.client.post(reverse("run_new"), _data(alice_world, advanced_yaml=text))
    errors = response.context["form"].errors
    assert list(errors) == ["advanced_yaml"], errors
    named = sorted(message.split(":")[0] for message in errors["advanced_yaml"])
    assert named == ["generation.top_k", "grpo.alpah", "grpo.kk", "optimizer"]
    assert all("unknown field; allowed: " in message for message in errors["advanced_yaml"])
    assert Run.objects.count() == 1 and enqueued == []


def test_a_yaml_that_does_not_parse_hides_no_other_problem(alice, alice_world, enqueued):
    response = alice.client.post(reverse("run_new"), _data(alice_world, k="1", advanced_yaml="grpo: [1,\n"))
    errors = response.context["form"].errors
    assert set(errors) == {"k", "advanced_yaml"} and errors["advanced_yaml"][0].startswith("Not valid YAML")


def test_a_dataset_for_another_environment_hides_no_other_problem(alice_world):
    alice_world.dataset.environment = "arithmetic"
    with pytest.raises(ConfigError) as caught:
        run_services.run_config_build(topology=alice_world.topology, dataset=alice_world.dataset, overrides={"grpo.k": 1})
    assert [p.field for p in caught.value.problems] == ["data", "grpo.k"]


def test_engine_and_trust_problems_come_back_together(alice, tmp_path):
    folder = tmp_path / "elsewhere"
    tree = yaml.safe_load(TINY_CONFIG)
    tree["model"]["source"] = f"local:{folder}"  # outside the team's folders: refused without looking inside
    tree["grpo"] = {"k": 1, "kk": 2}
    tree["data"] = {"path": "/etc/passwd", "reward_fn": "os:getcwd"}
    tree["checkpoint"] = {"resume_from": "/tmp/other-team/step-000001"}
    with pytest.raises(ConfigError) as caught:
        run_services.run_launch(team=alice.team, user=alice.user, tree=tree)
    found = {p.field: p.message for p in caught.value.problems}
    assert list(found) == ["model.source", "grpo.kk", "grpo.k", "data.reward_fn", "data.path", "checkpoint.resume_from"], found
    assert "outside the folders your team may use" in found["model.source"] and "config.json" not in str(caught.value)
    assert not Run.objects.filter(team=alice.team).exists()


def test_the_api_lists_every_problem_in_one_response(alice, alice_world):
    api = Api(tokens.api_token_create(user=alice.user, team=alice.team, name="all")[1])
    body = TINY_CONFIG + "grpo: {k: 1, kk: 2, alpah: 3}\noptimizer: {}\ndata: {reward_fn: 'os:getcwd'}\n"
    response = api.post(reverse("api_runs"), body)
    assert response.status_code == 400
    data = response.json()
    assert set(data["fields"]) == {"grpo.k", "grpo.kk", "grpo.alpah", "optimizer", "data.reward_fn"}
    assert data["field"] == "optimizer" and data["error"].startswith("optimizer: unknown field")  # a level's own keys first


def test_one_builder_serves_a_submitted_tree_with_a_topology_dataset_and_overrides(alice, alice_world):
    """What the API and experiments do: the topology's sections over the tree's, the dataset's data, dotted overrides on top."""
    tree = {"topology": {"max_turns": 5, "environment": "arithmetic"}, "optim": {"steps": 4}, "data": {"train_size": 3}}
    config = run_services.run_config_build(team=alice.team, tree=tree, topology=alice_world.topology, dataset=alice_world.dataset,
                                           overrides={"grpo.k": 6, "topology.agents[1].temperature": 0.5})
    assert config.topology.environment == "math_tool" and config.topology.max_turns == alice_world.topology.max_turns
    assert config.data.train_size == 32 and config.optim.steps == 4 and config.grpo.k == 6
    assert config.agent("reasoner").temperature == 0.5 and config.name == "duo"
    assert config.optim.lr == RunConfig().optim.lr  # a submitted tree keeps the engine's defaults (the form's LoRA rate is the form's)
    assert tree == {"topology": {"max_turns": 5, "environment": "arithmetic"}, "optim": {"steps": 4}, "data": {"train_size": 3}}


def test_another_teams_topology_or_dataset_is_refused(alice, bob_world):
    for kwargs, field in (({"topology": bob_world.topology}, "topology"), ({"dataset": bob_world.dataset}, "dataset")):
        with pytest.raises(ConfigError) as caught:
            run_services.run_config_build(team=alice.team, tree={}, **kwargs)
        assert caught.value.field == field

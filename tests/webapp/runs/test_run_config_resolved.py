"""A run's stored config is the one the engine runs: an agent with empty instructions holds its
environment's default system prompt (what its rollouts are sent), an uploaded dataset's
train_size is its training rows (not the generator default), and compare shows each difference
once."""

from __future__ import annotations

from django.urls import reverse

from agents.envs import load_environment
from training.config import RunConfig
from webapp.history import selectors as history
from webapp.models import Dataset, Run
from webapp.runs import services as run_services


def launch(world, dataset=None, **overrides):
    config = run_services.run_config_build(topology=world.topology, dataset=dataset or world.dataset, overrides=overrides)
    return run_services.run_create(team=world.topology.team, user=None, name="r", config=config, topology=world.topology,
                                   dataset=dataset or world.dataset)


def test_empty_instructions_are_stored_as_the_environments_default_prompt(alice_world, jobs_sent):
    alice_world.reasoner.instructions = ""
    alice_world.reasoner.save()
    stored = RunConfig.from_yaml(launch(alice_world).config_yaml)
    default = load_environment("math_tool").default_instructions["reasoner"]
    assert default and stored.agent("reasoner").instructions == default
    assert stored.agent("tool").instructions == "Write Python."  # an agent's own instructions stay


def test_the_rollouts_prompt_is_the_stored_instructions(alice_world):
    from training.rollout import Sampler

    config = RunConfig.from_dict({"topology": {"agents": [{"name": "r", "role": "reasoner"}], "environment": "math_tool"}})
    env = load_environment("math_tool")
    resolved = config.with_default_instructions(env.default_instructions)
    sampler = Sampler.__new__(Sampler)  # the prompt building only: no model needed
    sampler.env = env
    for cfg in (config, resolved):
        sampler.config = cfg
        state = env.reset({"question": "Compute 1 + 1.", "answer": "2"}, task_id="t", roles=("tool", "reasoner"))
        assert sampler.messages("r", state)[0] == {"role": "system", "content": resolved.agent("r").instructions}


def test_an_uploaded_datasets_train_size_is_its_training_rows(alice_world, data_dir):
    d = alice_world.dataset
    d.kind, d.file, d.row_count, d.eval_fraction = Dataset.Kind.UPLOAD, "datasets/1/abc.jsonl", 32, 0.25
    d.save()
    config = run_services.run_config_build(topology=alice_world.topology, dataset=d)
    assert (config.data.train_size, config.data.eval_size) == (24, 8) == d.split


def test_compare_shows_env_args_once(alice, alice_world):
    a = run_services.run_config_build(topology=alice_world.topology, dataset=alice_world.dataset)
    b = a.replace(**{"topology.env_args": {"level": 2}})
    a = a.replace(**{"topology.env_args": {}})
    runs = [Run.objects.create(team=alice.team, name=n, config_yaml=c.to_yaml()) for n, c in (("a", a), ("b", b))]
    rows = history.compare_config_diff(runs=runs, differences_only=True)
    keys = [r.key for r in rows if r.key.startswith("topology.env_args")]
    assert keys == ["topology.env_args.level"] and rows[[r.key for r in rows].index(keys[0])].values == ["—", "2"]
    page = alice.client.get(reverse("run_compare"), {"ids": [r.pk for r in runs], "diff": "1"}).content.decode()
    assert page.count("topology.env_args") == 1

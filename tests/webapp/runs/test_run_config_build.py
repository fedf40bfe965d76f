"""run_config_build: topology + dataset + overrides + advanced YAML -> a validated RunConfig."""

from __future__ import annotations

import pytest

from training.config import ConfigError, RunConfig
from webapp.models import Dataset
from webapp.runs import services as run_services


def test_it_maps_the_topology_agents_in_order(alice_world):
    w = alice_world
    w.reasoner.temperature, w.reasoner.max_new_tokens, w.reasoner.trainable = 0.5, 32, False
    w.reasoner.save()
    config = run_services.run_config_build(topology=w.topology, dataset=w.dataset, name="x")
    assert [a.name for a in config.topology.agents] == ["tool", "reasoner"]
    reasoner = config.agent("reasoner")
    assert (reasoner.role, reasoner.temperature, reasoner.max_new_tokens, reasoner.trainable) == ("reasoner", 0.5, 32, False)
    assert reasoner.instructions == "Answer." and reasoner.model == "tiny-random:llama"
    assert config.model.source == "tiny-random:llama"
    assert config.topology.environment == "math_tool" and config.topology.specialization == "lora"


def test_it_uses_the_generator_and_its_arguments(alice_world):
    w = alice_world
    w.dataset.env_args = {"level": 3}
    config = run_services.run_config_build(topology=w.topology, dataset=w.dataset)
    assert config.data.path is None and config.data.train_size == 32 and config.data.eval_size == 8
    assert config.topology.env_args == {"level": 3}


def test_it_points_at_an_uploaded_file(alice_world, data_dir):
    d = alice_world.dataset
    d.kind, d.file, d.row_count, d.eval_fraction = Dataset.Kind.UPLOAD, "datasets/1/abc.jsonl", 50, 0.2
    d.save()
    config = run_services.run_config_build(topology=alice_world.topology, dataset=d)
    assert config.data.path == str(data_dir / "datasets/1/abc.jsonl")
    assert config.data.eval_fraction == 0.2 and config.data.eval_size == 10


def test_it_applies_overrides_then_the_advanced_yaml(alice_world):
    w = alice_world
    config = run_services.run_config_build(
        topology=w.topology, dataset=w.dataset,
        overrides={"optim.lr": 1e-4, "grpo.k": 6, "topology.specialization": "prompt", "lora.r": None},
        advanced_yaml="grpo:\n  k: 8\n  alpha: 0.5\nseed: 3\n",
    )
    assert config.optim.lr == 1e-4 and config.grpo.k == 8 and config.grpo.alpha == 0.5 and config.seed == 3
    assert config.topology.specialization == "prompt" and config.lora.r == RunConfig().lora.r
    assert RunConfig.from_yaml(config.to_yaml()) == config  # the snapshot round-trips


@pytest.mark.parametrize(
    ("overrides", "advanced", "field"),
    [
        ({"grpo.k": 1}, "", "grpo.k"),
        ({"topology.specialization": "single"}, "", "topology.specialization"),
        ({}, "grpo: [1, 2", "yaml"),
        ({}, "- just\n- a list", "yaml"),
        ({}, "grpo:\n  sampling: sideways", "grpo.sampling"),
        ({}, "optimizer: {lr: 1}", "optimizer"),
    ],
)
def test_it_raises_config_errors_naming_the_field(alice_world, overrides, advanced, field):
    with pytest.raises(ConfigError) as info:
        run_services.run_config_build(topology=alice_world.topology, dataset=alice_world.dataset, overrides=overrides, advanced_yaml=advanced)
    assert info.value.field == field


def test_it_refuses_a_dataset_for_another_environment(alice_world):
    alice_world.dataset.environment = "arithmetic"
    with pytest.raises(ConfigError) as info:
        run_services.run_config_build(topology=alice_world.topology, dataset=alice_world.dataset)
    assert info.value.field == "data"

"""RunConfig: YAML round trip, --set overrides, and errors that name the field."""

from pathlib import Path

import pytest

from training.config import ConfigError, RunConfig

CONFIGS = sorted(Path(__file__).resolve().parents[2].joinpath("configs").glob("*.yaml"))

BASE = """
name: t
model: {source: tiny-random:llama}
topology:
  environment: math_tool
  specialization: lora
  agents:
    - {name: tool, role: tool}
    - {name: reasoner, role: reasoner}
  turn_order: [tool, reasoner]
"""


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_it_round_trips_every_example_config(path):
    config = RunConfig.load(path)
    again = RunConfig.from_yaml(config.to_yaml())
    assert again == config
    assert again.to_yaml() == config.to_yaml()


def test_it_applies_set_overrides_with_yaml_types():
    config = RunConfig.from_yaml(BASE, ["optim.lr=3e-4", "grpo.k=8", "topology.agents[1].trainable=false", "topology.env_args={level: 2}"])
    assert config.optim.lr == 3e-4
    assert config.grpo.k == 8
    assert config.agent("reasoner").trainable is False
    assert config.topology.env_args == {"level": 2}


def test_it_replaces_dotted_fields_and_revalidates():
    config = RunConfig.from_yaml(BASE)
    assert config.replace(**{"optim.steps": 7}).optim.steps == 7
    with pytest.raises(ConfigError) as err:
        config.replace(**{"grpo.k": 1})
    assert err.value.field == "grpo.k"


@pytest.mark.parametrize(
    "override, field, words",
    [
        ("topology.specialization=team", "topology.specialization", "allowed: single, prompt, lora, full"),
        ("grpo.k=1", "grpo.k", "at least 2"),
        ("topology.turn_order=[tool, critic]", "topology.turn_order[1]", "'critic' is not defined"),
        ("model.source=gpt-17", "model.source", "unknown model source"),
        ("model.source=bundled:llama-70b", "model.source", "unknown bundled model"),
        ("topology.environment=chess", "topology.environment", "unknown environment"),
        ("optim.lr=0", "optim.lr", "must be positive"),
        ("optim.lr=-1e-4", "optim.lr", "must be positive"),
        ("optim.steps=abc", "optim.steps", "expected an integer"),
        ("grpo.loss_type=ppo", "grpo.loss_type", "allowed: grpo, bnpo, dr_grpo, dapo"),
        ("grpo.scale_rewards=max", "grpo.scale_rewards", "allowed: group, batch, none"),
        ("optim.tasks_per_step=100000000", "optim.tasks_per_step", "between"),
        ("grpo.sampling=beam", "grpo.sampling", "allowed: tree, independent"),
        ("optim.learning_rate=1", "optim.learning_rate", "unknown field"),
        ("topology.agents[0].trainable=maybe", "topology.agents[0].trainable", "true or false"),
        ("topology.agents[1].name=tool", "topology.agents[1].name", "duplicate"),
        ("data.reward_fn=not a path", "data.reward_fn", "dotted path"),
        ("topology.agents[0].model=bundled:smollm2-135m-instruct", "topology.agents[0].model", "only `full`"),
    ],
)
def test_it_names_the_bad_field(override, field, words):
    with pytest.raises(ConfigError) as err:
        RunConfig.from_yaml(BASE, [override])
    assert err.value.field == field
    assert words in str(err.value)


def test_it_rejects_single_with_two_acting_agents():
    with pytest.raises(ConfigError) as err:
        RunConfig.from_yaml(BASE, ["topology.specialization=single"])
    assert err.value.field == "topology.specialization"


def test_it_rejects_a_team_with_nothing_to_train():
    with pytest.raises(ConfigError) as err:
        RunConfig.from_yaml(BASE, ["topology.agents[0].trainable=false", "topology.agents[1].trainable=false"])
    assert "no acting agent is trainable" in str(err.value)


def test_it_rejects_unknown_sections_and_bad_yaml():
    with pytest.raises(ConfigError) as err:
        RunConfig.from_yaml(BASE + "\ntrainer: {x: 1}\n")
    assert err.value.field == "trainer"
    with pytest.raises(ConfigError) as err:
        RunConfig.from_yaml("name: [unclosed")
    assert err.value.field == "yaml"


def test_it_allows_different_models_only_under_full(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    config = RunConfig.from_yaml(BASE, ["topology.specialization=full", f"topology.agents[0].model=local:{tmp_path}"])
    assert config.agent_model(config.agent("tool")) == f"local:{tmp_path}"
    assert config.agent_model(config.agent("reasoner")) == "tiny-random:llama"


def test_it_rejects_a_local_model_folder_without_config(tmp_path):
    with pytest.raises(ConfigError) as err:
        RunConfig.from_yaml(BASE, [f"model.source=local:{tmp_path}"])
    assert "no config.json" in str(err.value)

"""The run form's advanced YAML cannot reach outside the team: paths, checkpoints, models, plugins."""

import pytest

from training.config import ConfigError
from webapp.runs import services as run_services


@pytest.mark.parametrize(
    "yaml_text, field",
    [
        ("data: {path: /etc/passwd}", "data.path"),
        ("checkpoint: {resume_from: /tmp/elsewhere}", "checkpoint.resume_from"),
        ("topology: {environment: 'subprocess:Popen'}", "topology.environment"),
    ],
)
def test_it_refuses_advanced_yaml_that_reaches_outside_the_team(alice_world, yaml_text, field):
    with pytest.raises(ConfigError) as err:
        run_services.run_config_build(topology=alice_world.topology, dataset=alice_world.dataset, advanced_yaml=yaml_text)
    assert err.value.field == field


def test_it_accepts_the_teams_own_topology_and_dataset(alice_world):
    config = run_services.run_config_build(topology=alice_world.topology, dataset=alice_world.dataset, advanced_yaml="grpo: {alpha: 0.5}")
    assert config.grpo.alpha == 0.5

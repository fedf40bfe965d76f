"""A warm start reaches only the team's own files: `model.init_from.run` a checkpoint of one of the
team's runs, `sft.path` one of its uploaded datasets."""

import pytest

from training.config import ConfigError
from webapp.models import Checkpoint, Run
from webapp.runs import services as run_services


def test_it_refuses_another_teams_checkpoint_and_a_file_elsewhere(alice_world, bob_world, tmp_path):
    theirs = Checkpoint.objects.create(run=bob_world.run, step=3, path=str(tmp_path / "bob" / "step-000003"))
    with pytest.raises(ConfigError) as err:
        run_services.run_config_build(topology=alice_world.topology, dataset=alice_world.dataset,
                                      advanced_yaml=f"model: {{init_from: {{run: '{theirs.path}'}}}}")
    assert err.value.field == "model.init_from.run"
    with pytest.raises(ConfigError) as err:
        run_services.run_config_build(topology=alice_world.topology, dataset=alice_world.dataset,
                                      advanced_yaml="algorithm: sft\nsft: {path: /etc/passwd}")
    assert err.value.field == "sft.path"


def test_it_accepts_a_checkpoint_of_the_teams_own_run(alice_world, tmp_path):
    Run.objects.filter(pk=alice_world.run.pk).update(status=Run.Status.SUCCEEDED)  # a finished run's (a running one rotates them)
    mine = Checkpoint.objects.create(run=alice_world.run, step=3, path=str(tmp_path / "alice" / "step-000003"))
    config = run_services.run_config_build(topology=alice_world.topology, dataset=alice_world.dataset,
                                           advanced_yaml=f"model: {{init_from: {{run: '{mine.path}', step: 3}}}}")
    assert config.model.init_from.run == mine.path

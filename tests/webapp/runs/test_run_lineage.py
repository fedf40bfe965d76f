"""Lineage: a run started from another run's checkpoint says "Started from run #N step S" on its
page, and the source run lists the runs started from it."""

from __future__ import annotations

from webapp.models import Checkpoint, Run
from webapp.runs import services as run_services


def test_both_run_pages_show_the_warm_start(alice, alice_world, tmp_path):
    source = alice_world.run
    Run.objects.filter(pk=source.pk).update(status=Run.Status.SUCCEEDED)  # a finished run's checkpoint (a running one rotates them)
    checkpoint = Checkpoint.objects.create(run=source, step=3, path=str(tmp_path / "src" / "step-000003"))
    config = run_services.run_config_build(topology=alice_world.topology, dataset=alice_world.dataset, name="warm",
                                           advanced_yaml=f"model: {{init_from: {{run: '{checkpoint.path}', step: 3}}}}")
    child = Run.objects.create(team=alice.team, name="warm", topology=alice_world.topology, dataset=alice_world.dataset,
                               config_yaml=config.to_yaml(), total_steps=3)

    child_page = alice.client.get(child.get_absolute_url()).content.decode()
    assert f'Started from <a href="{source.get_absolute_url()}">run #{source.pk}</a> step 3' in child_page
    source_page = alice.client.get(source.get_absolute_url()).content.decode()
    assert "Runs started from this one:" in source_page and f"#{child.pk} warm" in source_page


def test_a_cold_run_shows_no_lineage(alice, alice_world):
    page = alice.client.get(alice_world.run.get_absolute_url()).content.decode()
    assert "Started from" not in page and "Runs started from this one" not in page

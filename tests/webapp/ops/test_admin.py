"""Every model is in the admin with a working list; actions go through the services."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.contrib import admin
from django.urls import reverse

from webapp.models import Agent, Run, Topology


@pytest.fixture
def staff(alice):
    alice.user.is_staff = alice.user.is_superuser = True
    alice.user.save()
    return alice


def test_it_registers_every_model(db):
    for model in apps.get_app_config("webapp").get_models():
        assert model in admin.site._registry, model.__name__


def test_it_renders_every_changelist_and_change_page(staff, alice_world):
    for model in apps.get_app_config("webapp").get_models():
        url = reverse(f"admin:webapp_{model._meta.model_name}_changelist")
        assert staff.client.get(url, {"q": "x"}).status_code == 200, url
    for obj in (alice_world.topology, alice_world.run, alice_world.dataset, alice_world.tool):
        url = reverse(f"admin:webapp_{obj._meta.model_name}_change", args=[obj.pk])
        assert staff.client.get(url).status_code == 200, url


def test_it_cancels_runs_from_the_admin(staff, alice_world):
    staff.client.post(reverse("admin:webapp_run_changelist"), {"action": "cancel", "_selected_action": [alice_world.run.pk]})
    alice_world.run.refresh_from_db()
    assert alice_world.run.status == Run.Status.CANCELLED


def test_it_duplicates_agents_and_topologies_from_the_admin(staff, alice_world):
    staff.client.post(reverse("admin:webapp_agent_changelist"), {"action": "duplicate", "_selected_action": [alice_world.tool.pk]})
    staff.client.post(reverse("admin:webapp_topology_changelist"), {"action": "duplicate", "_selected_action": [alice_world.topology.pk]})
    assert Agent.objects.filter(name="tool-copy").exists()
    assert [a.name for a in Topology.objects.get(name="duo-copy").ordered_agents()] == ["tool", "reasoner"]


def test_it_marks_checkpoints_and_exports_whose_files_are_deleted(staff, alice_world, data_dir):
    from django.utils import timezone

    from webapp.models import Checkpoint, Job

    Checkpoint.objects.create(run=alice_world.run, step=2, path=str(data_dir / "gone"), deleted=timezone.now())
    Checkpoint.objects.create(run=alice_world.run, step=4, path=str(data_dir / "kept"))
    Job.objects.create(team=staff.team, kind="merge", status="succeeded", run=alice_world.run, output="",
                       result={"deleted": "2026-11-25T10:30:00+00:00"})
    url = reverse("admin:webapp_checkpoint_changelist")
    page = staff.client.get(url).content.decode()
    assert page.count(">deleted ") == 1 and page.count(">on disk<") == 1
    only_deleted = staff.client.get(url, {"deleted__isnull": "False"}).content.decode()
    assert "gone" in only_deleted and "kept" not in only_deleted  # a filter for them too
    assert ">deleted 2026-11-25 10:30<" in staff.client.get(reverse("admin:webapp_job_changelist")).content.decode()

"""The trust boundary holds in the Django admin too: the models' `clean` calls it, so a staff
member saving a model source, topology or dataset gets the same refusals as a team member."""

from __future__ import annotations

import pytest
from django.urls import reverse

from webapp.models import Dataset, ModelSource, Topology


@pytest.fixture
def staff(alice):
    alice.user.is_staff = alice.user.is_superuser = True
    alice.user.save()
    return alice


def _errors(response) -> str:
    assert response.status_code == 200, "saved"
    return str(response.context["adminform"].form.errors)


def test_the_admin_refuses_another_teams_folder_as_a_model_source(staff, bob, data_dir):
    folder = data_dir / "exports" / str(staff.team.pk) / "merge-1"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    response = staff.client.post(reverse("admin:webapp_modelsource_add"), {
        "team": bob.team.pk, "name": "stolen", "source": f"local:{folder}", "notes": "", "created_0": "2026-01-01", "created_1": "00:00"})
    assert "outside the folders your team may use" in _errors(response)
    assert not ModelSource.objects.filter(name="stolen").exists()


def test_the_admin_refuses_unregistered_environments_and_unbounded_args(staff, alice_world):
    topology = alice_world.topology
    url = reverse("admin:webapp_topology_change", args=[topology.pk])
    base = {"team": staff.team.pk, "name": topology.name, "max_turns": 2, "specialization": "lora", "created_0": "2026-01-01",
            "created_1": "00:00", "members-TOTAL_FORMS": 0, "members-INITIAL_FORMS": 0}
    text = _errors(staff.client.post(url, {**base, "environment": "os:system", "env_args": "{}"}))
    assert "not a registered plugin" in text
    text = _errors(staff.client.post(url, {**base, "environment": "math_tool", "env_args": '{"a": {"b": {"c": {"d": {"e": 1}}}}}'}))
    assert "nested more than 4 levels deep" in text
    topology.refresh_from_db()
    assert topology.environment == "math_tool" and topology.env_args == {"level": 1}
    dataset = alice_world.dataset
    text = _errors(staff.client.post(reverse("admin:webapp_dataset_change", args=[dataset.pk]), {
        "team": staff.team.pk, "name": dataset.name, "kind": "generator", "environment": "subprocess:Popen", "env_args": "{}",
        "size": 8, "eval_size": 2, "eval_fraction": 0.1, "created_0": "2026-01-01", "created_1": "00:00"}))
    assert "not a registered plugin" in text
    assert Dataset.objects.get(pk=dataset.pk).environment == "math_tool" and Topology.objects.count() == 1

"""The admin's run pages: the config snapshot keeps its indentation, what the run executed and went
through is read-only (environment, specialization, GPUs, what it was doing), and the run list fits a
1280 px screen (few columns, no menu beside it)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from webapp.models import Run


@pytest.fixture
def staff(alice):
    alice.user.is_staff = alice.user.is_superuser = True
    alice.user.save()
    return alice


def test_the_config_keeps_its_indentation(staff, alice_world):
    Run.objects.filter(pk=alice_world.run.pk).update(status="succeeded", environment="math_tool", specialization="lora")
    page = staff.client.get(reverse("admin:webapp_run_change", args=[alice_world.run.pk])).content.decode()
    assert '<pre class="admin-yaml">' in page
    yaml_block = page[page.index('<pre class="admin-yaml">'):]
    assert "\n  specialization: lora" in yaml_block[: yaml_block.index("</pre>")]


def test_what_the_run_executed_cannot_be_edited(staff, alice_world):
    Run.objects.filter(pk=alice_world.run.pk).update(status="succeeded", environment="math_tool", specialization="lora")
    page = staff.client.get(reverse("admin:webapp_run_change", args=[alice_world.run.pk])).content.decode()
    for field in ("environment", "specialization", "gpus", "config_yaml", "phase", "phase_detail", "eta", "final_metrics"):
        assert f'name="{field}"' not in page, field
    for field in ("name", "priority", "notes"):
        assert f'name="{field}"' in page, field
    response = staff.client.post(reverse("admin:webapp_run_change", args=[alice_world.run.pk]), {
        "team": alice_world.run.team_id, "owner": staff.user.pk, "name": "renamed", "priority": "0", "notes": "", "environment": "hacked",
        "specialization": "full", "checkpoints-TOTAL_FORMS": "0", "checkpoints-INITIAL_FORMS": "0",
    })
    assert response.status_code == 302, response.context["adminform"].form.errors
    run = Run.objects.get(pk=alice_world.run.pk)
    assert run.name == "renamed" and (run.environment, run.specialization) == ("math_tool", "lora")


def test_the_run_list_fits_a_laptop_screen(staff, alice_world):
    page = staff.client.get(reverse("admin:webapp_run_changelist")).content.decode()
    assert 'id="nav-sidebar"' not in page
    header = page[page.index('<thead>'):page.index('</thead>')]
    assert header.count("<th ") <= 9  # the checkbox and eight columns

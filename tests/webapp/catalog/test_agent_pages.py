"""Agents: list, create, edit, duplicate, delete, with validation errors next to the field."""

from __future__ import annotations

from django.urls import reverse

from webapp.models import Agent


def _data(world, **overrides):
    data = {"name": "critic", "role": "reasoner", "instructions": "Check the answer.", "model_source": world.source.pk,
            "temperature": "0.7", "max_new_tokens": "48", "tools": "python, search", "trainable": "on"}
    data.update(overrides)
    return data


def test_it_lists_agents(alice, alice_world):
    response = alice.client.get(reverse("agent_list"))
    assert response.status_code == 200
    assert b"reasoner" in response.content


def test_it_creates_an_agent(alice, alice_world):
    response = alice.client.post(reverse("agent_create"), _data(alice_world))
    assert response.status_code == 302
    agent = Agent.objects.get(team=alice.team, name="critic")
    assert agent.tools == ["python", "search"]
    assert agent.temperature == 0.7 and agent.max_new_tokens == 48 and agent.trainable


def test_it_shows_a_bad_name_next_to_the_field(alice, alice_world):
    response = alice.client.post(reverse("agent_create"), _data(alice_world, name="9 lives"))
    assert response.status_code == 200
    assert "name" in response.context["form"].errors
    assert b'id="field-name"' in response.content and b"Start with a letter" in response.content


def test_it_refuses_a_duplicate_name_in_the_team(alice, alice_world):
    response = alice.client.post(reverse("agent_create"), _data(alice_world, name="tool"))
    assert response.status_code == 200
    assert "name" in response.context["form"].errors
    assert Agent.objects.filter(team=alice.team, name="tool").count() == 1


def test_it_refuses_another_teams_model(alice, alice_world, bob_world):
    response = alice.client.post(reverse("agent_create"), _data(alice_world, model_source=bob_world.source.pk))
    assert "model_source" in response.context["form"].errors


def test_it_edits_an_agent(alice, alice_world):
    url = reverse("agent_edit", args=[alice_world.tool.pk])
    assert alice.client.get(url).status_code == 200
    response = alice.client.post(url, _data(alice_world, name="tool", role="tool", temperature="", max_new_tokens=""))
    assert response.status_code == 302
    alice_world.tool.refresh_from_db()
    assert alice_world.tool.temperature is None and alice_world.tool.instructions == "Check the answer."


def test_it_duplicates_an_agent(alice, alice_world):
    response = alice.client.post(reverse("agent_duplicate", args=[alice_world.tool.pk]))
    copy = Agent.objects.get(team=alice.team, name="tool-copy")
    assert response["Location"] == copy.get_absolute_url()
    assert copy.instructions == alice_world.tool.instructions and copy.tools == ["python"]


def test_it_refuses_to_delete_an_agent_in_a_topology(alice, alice_world):
    response = alice.client.post(reverse("agent_delete", args=[alice_world.tool.pk]))
    assert response.status_code == 200
    assert b"Used by topologies: duo" in response.content
    assert Agent.objects.filter(pk=alice_world.tool.pk).exists()


def test_it_deletes_an_unused_agent(alice, alice_world):
    spare = Agent.objects.create(team=alice.team, name="spare", role="tool", model_source=alice_world.source)
    response = alice.client.post(reverse("agent_delete", args=[spare.pk]))
    assert response.status_code == 302
    assert not Agent.objects.filter(pk=spare.pk).exists()


def test_it_refuses_a_role_no_environment_has_with_the_other_errors(alice, alice_world):
    response = alice.client.post(reverse("agent_create"), _data(alice_world, name="tool", role="poet"))
    errors = response.context["form"].errors
    assert errors["name"] == ["Your team already has an agent named 'tool'."]  # ("an agent", and at the same time)
    assert errors["role"][0].startswith("No environment has the role 'poet'") and "math_tool: tool, reasoner" in errors["role"][0]
    assert not Agent.objects.filter(role="poet").exists()

"""Agents: list, create, edit, duplicate, delete, with validation errors next to the field."""

from __future__ import annotations

from django.urls import reverse

from webapp.models import Agent, Topology


def _data(world, **overrides):
    data = {"name": "critic", "role": "reasoner", "instructions": "Check the answer.", "model_source": world.source.pk,
            "temperature": "0.7", "max_new_tokens": "48", "tools": "python, calculator", "trainable": "on"}
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
    assert agent.tools == ["python", "calculator"]
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


def test_it_refuses_a_tool_nobody_registered_naming_the_ones_there_are(alice, alice_world):
    response = alice.client.post(reverse("agent_create"), _data(alice_world, tools="calculator, abacus, mypkg.tools:search"))
    assert response.status_code == 200 and not Agent.objects.filter(name="critic").exists()
    errors = response.context["form"].errors["tools"]
    assert any("no tool 'abacus'" in e and "calculator, python" in e for e in errors)
    assert any("mypkg.tools:search" in e and "TROUPE_TOOLS" in e for e in errors)  # a plugin path only the operator registers
    assert "calculator, python" in response.context["form"].fields["tools"].help_text


def test_saving_a_topology_says_when_a_models_template_cannot_render_tools(alice, alice_world, monkeypatch):
    """The tiny random model's template is plain ChatML: the tools go into the system prompt, and the page says so.
    The save does not wait for that check (its first run in a process imports torch and transformers, seconds):
    the list it lands on says it is checking, and the answer replaces that sentence."""
    from webapp.catalog import selectors

    Agent.objects.filter(pk=alice_world.tool.pk).update(tools=["calculator"])
    check = selectors.tool_template_notes

    def not_during_the_save(**kwargs):
        raise AssertionError("the save waited for the chat-template check")

    monkeypatch.setattr(selectors, "tool_template_notes", not_during_the_save)
    response = alice.client.post(reverse("topology_create"), {
        "name": "calc pair", "environment": "math_tool", "env_args": '{"level": 1}', "specialization": "lora", "max_turns": "2",
        "agents": [alice_world.tool.pk, alice_world.reasoner.pk]}, follow=True)
    topology = Topology.objects.get(name="calc pair")
    assert response.redirect_chain == [(f"/topologies/?saved={topology.pk}", 302)]
    assert any("Saved topology calc pair" in str(m) for m in response.context["messages"])
    page = response.content.decode()
    notes_url = reverse("topology_tool_notes", args=[topology.pk])
    assert f'hx-get="{notes_url}" hx-trigger="load"' in page and "Checking whether the chat templates of calc pair" in page
    monkeypatch.setattr(selectors, "tool_template_notes", check)
    notes = alice.client.get(notes_url, headers={"HX-Request": "true"}).content.decode()
    assert notes.lstrip().startswith('<div id="tool-notes"') and "hx-get" not in notes
    assert "tool: the chat template of tiny-random:llama has no tool support" in notes

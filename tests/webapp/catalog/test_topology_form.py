"""Topologies: agents in acting order; roles must exist in the environment."""

from __future__ import annotations

import pytest
from django.urls import reverse

from webapp.models import Agent, Topology


def _data(world, agents, **overrides):
    data = {"name": "pair", "environment": "math_tool", "env_args": '{"level": 2}', "specialization": "lora",
            "max_turns": "2", "agents": [a.pk for a in agents]}
    data.update(overrides)
    return data


def test_it_saves_agents_in_the_order_given(alice, alice_world):
    w = alice_world
    response = alice.client.post(reverse("topology_create"), _data(w, [w.reasoner, w.tool]))
    assert response.status_code == 302
    topology = Topology.objects.get(team=alice.team, name="pair")
    assert [a.name for a in topology.ordered_agents()] == ["reasoner", "tool"]
    assert topology.env_args == {"level": 2}


def test_it_ignores_empty_slots(alice, alice_world):
    w = alice_world
    data = _data(w, [])
    data["agents"] = ["", str(w.tool.pk), "", str(w.reasoner.pk)]
    assert alice.client.post(reverse("topology_create"), data).status_code == 302
    assert [a.name for a in Topology.objects.get(name="pair").ordered_agents()] == ["tool", "reasoner"]


def test_it_rejects_a_role_the_environment_does_not_have(alice, alice_world):
    w = alice_world
    poet = Agent.objects.create(team=alice.team, name="poet", role="poet", model_source=w.source)
    response = alice.client.post(reverse("topology_create"), _data(w, [w.tool, poet]))
    assert response.status_code == 200
    errors = response.context["form"].errors["agents"]
    assert "poet (poet): role not in math_tool" in errors[0]
    assert not Topology.objects.filter(name="pair").exists()


def test_it_rejects_the_same_agent_twice(alice, alice_world):
    w = alice_world
    response = alice.client.post(reverse("topology_create"), _data(w, [w.tool, w.tool]))
    assert "agents" in response.context["form"].errors


def test_it_rejects_single_with_two_agents(alice, alice_world):
    w = alice_world
    response = alice.client.post(reverse("topology_create"), _data(w, [w.tool, w.reasoner], specialization="single"))
    assert "specialization" in response.context["form"].errors


def test_it_rejects_different_models_unless_full(alice, alice_world):
    w = alice_world
    other = w.source.__class__.objects.create(team=alice.team, name="SmolLM2", source="bundled:smollm2-135m-instruct")
    w.reasoner.model_source = other
    w.reasoner.save()
    response = alice.client.post(reverse("topology_create"), _data(w, [w.tool, w.reasoner]))
    assert "specialization" in response.context["form"].errors
    response = alice.client.post(reverse("topology_create"), _data(w, [w.tool, w.reasoner], specialization="full"))
    assert response.status_code == 302


def test_it_rejects_unknown_environments_and_bad_env_args(alice, alice_world):
    w = alice_world
    response = alice.client.post(reverse("topology_create"), _data(w, [w.tool], environment="chess"))
    assert "environment" in response.context["form"].errors
    response = alice.client.post(reverse("topology_create"), _data(w, [w.tool], env_args="[1, 2]"))
    assert "env_args" in response.context["form"].errors


def test_it_edits_the_order_and_duplicates(alice, alice_world):
    w = alice_world
    url = reverse("topology_edit", args=[w.topology.pk])
    page = alice.client.get(url)
    assert page.status_code == 200 and b"agent-order" in page.content
    assert alice.client.post(url, _data(w, [w.reasoner, w.tool], name="duo")).status_code == 302
    assert [a.name for a in w.topology.ordered_agents()] == ["reasoner", "tool"]
    alice.client.post(reverse("topology_duplicate", args=[w.topology.pk]))
    copy = Topology.objects.get(team=alice.team, name="duo-copy")
    assert [a.name for a in copy.ordered_agents()] == ["reasoner", "tool"]


def test_it_shows_the_environment_hint(alice, alice_world):
    response = alice.client.get(reverse("environment_hint"), {"environment": "math_tool"}, headers={"HX-Request": "true"})
    assert b"reasoner" in response.content


def test_it_keeps_runs_when_a_finished_topology_is_deleted(alice, alice_world):
    w = alice_world
    w.run.status = "succeeded"
    w.run.save()
    assert alice.client.post(reverse("topology_delete", args=[w.topology.pk])).status_code == 302
    w.run.refresh_from_db()
    assert w.run.topology is None and "math_tool" in w.run.config_yaml


def test_it_refuses_to_delete_a_topology_with_an_active_run(alice, alice_world):
    response = alice.client.post(reverse("topology_delete", args=[alice_world.topology.pk]))
    assert b"cancel it first" in response.content


PLUGIN = "tests.training.toy_env:LetterEnv"


def test_plugin_environments_the_operator_lists_are_offered_and_used(alice, alice_world, plugin_registry):
    with pytest.raises(plugin_registry.PluginError):  # an operator's typo is refused at registration, not fatal
        plugin_registry.register("no_such_pkg.envs:Missing", kind=plugin_registry.ENVIRONMENT)
    form = alice.client.get(reverse("topology_create")).context["form"]
    choices = [value for value, _ in form.fields["environment"].choices]
    assert PLUGIN in choices and "no_such_pkg.envs:Missing" not in choices
    w = alice_world
    writer = Agent.objects.create(team=alice.team, name="writer", role="writer", model_source=w.source)
    response = alice.client.post(reverse("topology_create"), _data(w, [writer], name="letters", environment=PLUGIN, env_args="{}",
                                                                    specialization="single", max_turns="1"))
    assert response.status_code == 302, response.context["form"].errors
    assert Topology.objects.get(name="letters").environment == PLUGIN


def test_an_unlisted_plugin_is_refused_by_the_form(alice, alice_world, plugin_registry):
    plugin_registry.unregister(PLUGIN, kind=plugin_registry.ENVIRONMENT)
    w = alice_world
    response = alice.client.post(reverse("topology_create"), _data(w, [w.tool], environment=PLUGIN, env_args="{}"))
    assert response.status_code == 200 and "environment" in response.context["form"].errors


def test_it_reports_every_problem_at_once(alice, alice_world):
    w = alice_world
    poet = Agent.objects.create(team=alice.team, name="poet", role="poet", model_source=w.source)
    response = alice.client.post(reverse("topology_create"), _data(w, [w.tool, poet], max_turns="0", specialization="single"))
    errors = response.context["form"].errors
    assert set(errors) == {"max_turns", "agents", "specialization"}, errors  # the field errors and the agents' together
    assert "poet (poet): role not in math_tool" in errors["agents"][0]


def _slots(response) -> int:
    return response.content.decode().count('<select name="agents"')


def test_it_shows_the_same_agent_slots_however_often_the_form_comes_back(alice, alice_world):
    w = alice_world
    assert _slots(alice.client.get(reverse("topology_create"))) == 2  # two agents in the team: two slots
    data = _data(w, [w.tool], max_turns="0")
    data["agents"] = [str(w.tool.pk), ""]
    for _ in range(3):  # an error sends the form back; again, and again
        response = alice.client.post(reverse("topology_create"), data)
        assert response.status_code == 200 and _slots(response) == 2
        data["agents"] = [str(w.tool.pk)] + [""] * (_slots(response) - 1)
    both = _data(w, [w.tool, w.reasoner], max_turns="0")
    assert _slots(alice.client.post(reverse("topology_create"), both)) == 2  # no empty slot past the team's agents

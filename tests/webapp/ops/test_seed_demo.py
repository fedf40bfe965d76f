"""`manage.py troupe --seed-only` (and `seed_demo`) create the demo team and objects once."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from webapp.models import Agent, Dataset, ModelSource, Team, Topology


def counts():
    return [m.objects.count() for m in (Team, User, ModelSource, Agent, Topology, Dataset)]


@pytest.mark.django_db
def test_it_seeds_the_demo_once():
    out = io.StringIO()
    call_command("troupe", "--seed-only", stdout=out)
    first = counts()
    call_command("troupe", "--seed-only", stdout=io.StringIO())
    assert counts() == first
    team = Team.objects.get(name="Demo team")
    assert set(team.memberships.values_list("user__username", "role")) == {("admin", "admin"), ("member", "member")}
    assert {s.source for s in team.model_sources.all()} == {"bundled:smollm2-135m-instruct", "tiny-random:llama"}
    assert {t.specialization for t in team.topologies.all()} == {"single", "prompt", "lora", "full"}
    assert team.datasets.filter(kind="generator", environment="math_tool").count() == 2
    text = out.getvalue()
    assert "admin / admin" in text and "member / member" in text


@pytest.mark.django_db
def test_it_gives_agents_the_environments_default_instructions(math_tool):
    call_command("seed_demo", stdout=io.StringIO())
    for role in ("tool", "reasoner"):
        assert Agent.objects.get(name=role).instructions == math_tool.default_instructions[role]


@pytest.mark.django_db
def test_it_keeps_a_changed_password():
    call_command("seed_demo", stdout=io.StringIO())
    admin = User.objects.get(username="admin")
    admin.set_password("changed")
    admin.save()
    out = io.StringIO()
    call_command("seed_demo", stdout=out)
    assert User.objects.get(username="admin").check_password("changed")
    assert "unless you changed it" in out.getvalue()

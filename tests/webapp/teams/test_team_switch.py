"""A user in several teams works in one current team at a time, picked in the header."""

from __future__ import annotations

from django.urls import reverse

from webapp.models import Membership


def test_it_switches_the_current_team(alice, alice_world, bob, bob_world):
    Membership.objects.create(team=bob.team, user=alice.user)
    bob_run = reverse("run_detail", args=[bob_world.run.pk])
    assert alice.client.get(bob_run).status_code == 404  # still in Alpha
    alice.client.post(reverse("team_switch"), {"team": bob.team.pk})
    assert alice.client.get(bob_run).status_code == 200
    assert alice.client.get(reverse("run_detail", args=[alice_world.run.pk])).status_code == 404


def test_it_refuses_to_switch_to_a_team_the_user_is_not_in(alice, bob):
    assert alice.client.post(reverse("team_switch"), {"team": bob.team.pk}).status_code == 404


def test_it_explains_when_the_user_has_no_team(alice):
    Membership.objects.filter(user=alice.user).delete()
    response = alice.client.get(reverse("dashboard"))
    assert response.status_code == 403
    assert b"not in a team" in response.content

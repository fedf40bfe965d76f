"""API tokens: created and revoked by their user on the API tokens page, shown once, stored as a
hash, bound to the team that was current when created."""

from __future__ import annotations

import hashlib

from django.urls import reverse

from webapp.models import ApiToken, Membership, Team
from webapp.teams import services as tokens


def test_it_shows_a_new_token_once_and_stores_only_its_hash(alice):
    response = alice.client.post(reverse("api_tokens"), {"name": "laptop notebook"})
    text = response.context["new_token"]
    html = response.content.decode()
    assert text.startswith("trp_") and len(text) > 40 and text in html and response["Cache-Control"] == "no-store"
    token = ApiToken.objects.get()
    assert token.digest == hashlib.sha256(text.encode()).hexdigest() and text not in (token.prefix, token.name)
    assert token.team == alice.team and token.user == alice.user and text.startswith(token.prefix)
    again = alice.client.get(reverse("api_tokens")).content.decode()
    assert text not in again and token.prefix in again and "laptop notebook" in again


def test_it_revokes_a_token(alice):
    token, text = tokens.api_token_create(user=alice.user, team=alice.team, name="ci")
    assert tokens.api_token_authenticate(text=text) == token
    alice.client.post(reverse("api_token_revoke", args=[token.pk]))
    assert tokens.api_token_authenticate(text=text) is None
    assert "revoked" in alice.client.get(reverse("api_tokens")).content.decode()


def test_it_lists_and_revokes_only_your_own_tokens(alice, bob):
    token, text = tokens.api_token_create(user=alice.user, team=alice.team, name="alice's")
    assert "alice&#x27;s" not in bob.client.get(reverse("api_tokens")).content.decode()
    assert bob.client.post(reverse("api_token_revoke", args=[token.pk])).status_code == 404
    assert tokens.api_token_authenticate(text=text) == token


def test_it_stops_working_when_the_user_leaves_the_team(alice):
    _, text = tokens.api_token_create(user=alice.user, team=alice.team, name="x")
    other = Team.objects.create(name="Other")
    Membership.objects.create(team=other, user=alice.user)
    Membership.objects.filter(team=alice.team, user=alice.user).delete()
    assert tokens.api_token_authenticate(text=text) is None


def test_it_requires_a_name(alice):
    response = alice.client.post(reverse("api_tokens"), {"name": "  "})
    assert response.context["new_token"] is None and not ApiToken.objects.exists()

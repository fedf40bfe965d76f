"""A team admin invites people with a single-use, expiring link (emailed when an address is
given); the invited person joins with an existing account or makes one."""

import re
from datetime import timedelta
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from webapp.models import Invitation, Membership


def _invite(client, **data):
    response = client.post(reverse("team_invite"), {"role": "member", **data}, follow=True)
    match = re.search(r'<code id="invitation-link">([^<]+)</code>', response.content.decode())
    return response, (match.group(1) if match else None)


def test_an_admin_invites_and_a_newcomer_makes_an_account_and_joins(alice):
    response, link = _invite(alice.client, email="erin@example.org", role="admin")
    assert response.status_code == 200 and link and "/invite/" in link
    assert len(mail.outbox) == 1 and mail.outbox[0].to == ["erin@example.org"] and link in mail.outbox[0].body
    path = urlsplit(link).path

    visitor = Client()
    page = visitor.get(path)
    assert page.status_code == 200 and "Join Alpha" in page.content.decode()
    bad = visitor.post(path, {"username": "erin", "password1": "short", "password2": "other"})
    assert bad.status_code == 400 and "password2" in bad.context["signup"].errors
    assert not User.objects.filter(username="erin").exists()  # nothing half-made

    joined = visitor.post(path, {"username": "erin", "password1": "erins long passphrase", "password2": "erins long passphrase"})
    assert joined.status_code == 302 and joined["Location"] == reverse("dashboard")
    assert Membership.objects.get(user__username="erin", team=alice.team).role == "admin"
    assert visitor.get(reverse("dashboard")).status_code == 200  # logged in, in the team

    again = Client().get(path)  # single use
    assert again.status_code == 404 and "no longer works" in again.content.decode()


def test_a_logged_in_user_joins_with_one_click_and_lands_in_the_new_team(alice, bob):
    _, link = _invite(alice.client)
    path = urlsplit(link).path
    assert "Join as bob" in bob.client.get(path).content.decode()
    assert bob.client.post(path).status_code == 302
    assert Membership.objects.filter(user=bob.user, team=alice.team, role="member").exists()
    assert "Alpha" in bob.client.get(reverse("dashboard")).content.decode()


def test_an_expired_or_revoked_link_no_longer_works(alice, bob):
    _, expired = _invite(alice.client)
    Invitation.objects.update(expires=timezone.now() - timedelta(seconds=1))
    assert bob.client.post(urlsplit(expired).path).status_code == 404
    _, revoked = _invite(alice.client)
    pending = Invitation.objects.get(expires__gt=timezone.now())
    assert alice.client.post(reverse("team_invitation_revoke", args=[pending.pk])).status_code == 302
    assert bob.client.post(urlsplit(revoked).path).status_code == 404
    assert not Membership.objects.filter(user=bob.user, team=alice.team).exists()


def test_a_member_of_the_team_already_is_told_so(alice):
    _, link = _invite(alice.client)
    page = alice.client.post(urlsplit(link).path)
    assert "already in Alpha" in page.content.decode()
    assert Invitation.objects.get().accepted is None  # still usable by the person it was for


@pytest.mark.parametrize("who", ["member", "other team"])
def test_only_the_teams_admins_invite_and_revoke(alice, bob, who):
    _, link = _invite(alice.client)
    invitation = Invitation.objects.get()
    if who == "member":
        carl = User.objects.create_user("carl", password="password")
        Membership.objects.create(team=alice.team, user=carl, role="member")
        client = Client()
        client.force_login(carl)
        assert client.post(reverse("team_invite"), {"role": "admin"}).status_code == 403
        assert client.post(reverse("team_invitation_revoke", args=[invitation.pk])).status_code == 403
        assert reverse("team_invite") not in client.get(reverse("team_members")).content.decode()
    else:
        assert bob.client.post(reverse("team_invitation_revoke", args=[invitation.pk])).status_code == 404
    invitation.refresh_from_db()
    assert invitation.revoked is None and Invitation.objects.count() == 1


def test_the_link_is_stored_only_as_a_digest(alice):
    _, link = _invite(alice.client)
    token = link.rstrip("/").rsplit("/", 1)[1]
    assert token not in str(Invitation.objects.values_list()) and len(token) >= 40


def test_the_link_is_shown_once_and_a_reload_makes_no_other(alice):
    made = alice.client.post(reverse("team_invite"), {"role": "member"})
    assert made.status_code == 302 and made["Location"].startswith(reverse("team_members"))  # post, redirect, get
    shown = alice.client.get(made["Location"])
    assert 'id="invitation-link"' in shown.content.decode() and shown["Cache-Control"] == "no-store"
    again = alice.client.get(made["Location"])
    assert 'id="invitation-link"' not in again.content.decode() and Invitation.objects.count() == 1


def test_a_bad_invitation_form_names_its_field(alice):
    response, link = _invite(alice.client, email="not an address", role="owner")
    assert response.status_code == 400 and link is None
    assert set(response.context["invite_form"].errors) == {"email", "role"}


def test_a_link_used_up_while_a_newcomer_fills_the_form_makes_no_account(alice, monkeypatch):
    """Someone else joins with the link between the newcomer's page load and their submit: the
    newcomer reads why, and no account is left behind in no team."""
    from django.core.exceptions import ValidationError

    from webapp.teams import services

    _, link = _invite(alice.client)
    path = urlsplit(link).path
    visitor = Client()
    assert visitor.get(path).status_code == 200

    def used_meanwhile(**_):
        raise ValidationError("This invitation no longer works: it was used, revoked or has expired.")

    monkeypatch.setattr(services, "invitation_accept", used_meanwhile)
    page = visitor.post(path, {"username": "fred", "password1": "freds long passphrase", "password2": "freds long passphrase"})
    assert "no longer works" in page.content.decode()
    assert not User.objects.filter(username="fred").exists()

"""A username that could pass for another is refused, and the audit trail shows names so that a
look-alike stands out (issue 31, class 7: `alіce` with a Cyrillic і joined beside `alice`)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.test import Client
from django.urls import reverse

from webapp.models import AuditEvent, Membership
from webapp.teams.forms import SignupForm
from webapp.teams.usernames import mixed_scripts, shown, skeleton, username_check

PASSPHRASE = "a long enough passphrase 12"


def _invitation_path(admin_client: Client) -> str:
    response = admin_client.post(reverse("team_invite"), {"role": "member"}, follow=True)
    return urlsplit(re.search(r'<code id="invitation-link">([^<]+)</code>', response.content.decode()).group(1)).path


def _join(path: str, username: str):
    return Client().post(path, {"username": username, "password1": PASSPHRASE, "password2": PASSPHRASE})


@pytest.mark.parametrize("look_alike", [
    "al\u0456ce",          # Cyrillic і (the example)
    "\u0430lice",          # Cyrillic а
    "\u0430\u04cf\u0456\u0441\u0435",  # all Cyrillic: one script, same skeleton
    "ALICE", "Alice", "a1ice", "aIice", "alice\u0301",  # case, digit, capital I, a combining accent
    "\uff41lice",          # fullwidth a (NFKC)
    "al\u03b9ce",          # Greek iota
])
def test_a_look_alike_of_alice_cannot_join_through_an_invitation(alice, look_alike):
    response = _join(_invitation_path(alice.client), look_alike)
    assert response.status_code == 400, look_alike
    assert "username" in response.context["signup"].errors
    assert User.objects.count() == 1 and not Membership.objects.exclude(user=alice.user).exists()


def test_a_new_distinct_name_still_joins_in_any_one_script(alice):
    for name in ("carol", "\u0411\u043e\u0440\u0438\u0441", "\u5c71\u7530\u305f\u308d\u3046", "jos\u00e9"):  # Борис, 山田たろう, josé
        assert _join(_invitation_path(alice.client), name).status_code == 302, name
    assert Membership.objects.filter(team=alice.team).count() == 5


def test_mixed_scripts_are_refused_even_without_a_twin(db):
    form = SignupForm({"username": "p\u0430ypal", "password1": PASSPHRASE, "password2": PASSPHRASE})
    assert not form.is_valid() and "mixes writing systems" in form.errors["username"][0]
    assert mixed_scripts("p\u0430ypal") and not mixed_scripts("\u5c71\u7530\u305f\u308d\u3046") and not mixed_scripts("bob_2")


def test_skeletons():
    assert skeleton("al\u0456ce") == skeleton("alice") == skeleton("ALICE") == skeleton("a1ice") == skeleton("\uff41lice")
    assert skeleton("rnary") == skeleton("mary") and skeleton("bob") != skeleton("rob")


def test_the_admin_refuses_a_look_alike_too(alice, db):
    alice.user.is_staff = alice.user.is_superuser = True
    alice.user.save()
    response = alice.client.post(reverse("admin:auth_user_add"), {"username": "al\u0456ce", "password1": PASSPHRASE,
                                                                  "password2": PASSPHRASE, "usable_password": "true"})
    assert response.status_code == 200 and "mixes writing systems" in response.content.decode()
    assert not User.objects.filter(username="al\u0456ce").exists()
    with pytest.raises(ValidationError):
        username_check("Alice")
    username_check("alice", exclude_pk=alice.user.pk)  # its own name is no twin


def test_the_audit_trail_shows_a_look_alike_escaped(alice):
    """A look-alike made before these checks (or by the operator) reads differently from the real one."""
    twin = User.objects.create_user("al\u0456ce", password=PASSPHRASE)
    membership = Membership.objects.create(team=alice.team, user=twin, role="member")
    from webapp.teams.audit import Verb, audit_record

    audit_record(team=alice.team, actor=twin, verb=Verb.JOIN, obj=membership)
    page = alice.client.get(reverse("team_audit")).content.decode()
    assert "al\u0456ce [al\\u0456ce]" in page
    assert AuditEvent.objects.get(verb="join").actor_name == "al\u0456ce"
    assert shown("alice") == "alice" and shown("\u5c71\u7530") == "\u5c71\u7530"
    members = alice.client.get(reverse("team_members")).content.decode()
    assert "al\u0456ce [al\\u0456ce]" in members

"""Limits must not block honest use, and an attacker must not be able to turn a limit on a victim
(issue 45, class 9).

- Five anonymous password-reset requests for a user's address blocked that user's own reset for an
  hour (a 429 for the address). Now an address past its limit gets no new email, but its owner is
  never refused: every link sent in the window still works, and the page says so.
- Latin look-alikes (`bᴏb` with a small capital O, `boƄ` with a tone six) passed the name check:
  the skeleton used Troupe's own table of Cyrillic and Greek look-alikes. It now uses Unicode's
  confusables data and maps Latin letters drawn differently (small capitals, hooks, strokes).
- Conversations files over 2.5 MiB got a 413 (test_body_limit_before_parsing.py: every view that
  takes a file has the upload limit)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.test import Client
from django.urls import reverse

from webapp.models import Membership
from webapp.teams.usernames import shown, skeleton

PASSPHRASE = "a long enough passphrase 12"
ATTACKERS = [f"203.0.113.{i}" for i in range(1, 40)]


@pytest.fixture
def carol(db) -> User:
    return User.objects.create_user("carol", "carol@example.org", "old secret passphrase")


def _reset(address: str, client_ip: str):
    return Client(REMOTE_ADDR=client_ip).post(reverse("password_reset"), {"email": address}, follow=True)


def _set_password_through(link: str, password: str) -> None:
    client = Client()
    form = client.get(urlsplit(link).path, follow=True)
    assert form.status_code == 200 and "new_password1" in form.content.decode(), link
    done = client.post(form.redirect_chain[-1][0], {"new_password1": password, "new_password2": password})
    assert done.status_code == 302, done.content.decode()[:500]


@pytest.mark.parametrize("attacks", [5, 30])
def test_requests_for_someones_address_cannot_keep_them_from_resetting(carol, settings, attacks):
    settings.TROUPE_PASSWORD_RESET_LIMIT = 5
    for i in range(attacks):  # anonymous, from many addresses: each client stays under its own limit
        assert _reset("carol@example.org", ATTACKERS[i]).status_code == 200
    assert len(mail.outbox) == 5  # the address got its emails for the window, no more
    own = _reset("carol@example.org", "198.51.100.7")  # carol, at her desk
    assert own.status_code == 200 and "no new one was sent: the newest email" in own.content.decode()
    assert len(mail.outbox) == 5
    link = re.search(r"https?://\S+/password-reset/\S+/", mail.outbox[-1].body).group(0)
    _set_password_through(link, "carols brand new passphrase 7")  # the newest email she has works
    carol.refresh_from_db()
    assert carol.check_password("carols brand new passphrase 7")


def test_a_client_over_its_own_limit_is_still_refused_and_uses_up_no_one_elses(carol, settings):
    settings.TROUPE_PASSWORD_RESET_LIMIT = 3
    flooder = Client(REMOTE_ADDR="203.0.113.66")
    answers = [flooder.post(reverse("password_reset"), {"email": "carol@example.org"}).status_code for _ in range(8)]
    assert answers == [302, 302, 302, 429, 429, 429, 429, 429] and len(mail.outbox) == 3
    assert _reset("carol@example.org", "198.51.100.7").status_code == 200


def test_the_reset_links_outlive_the_window_or_settings_refuse_to_load(monkeypatch, tmp_path):
    from django.core.exceptions import ImproperlyConfigured

    from tests.webapp.core.test_settings_env import load

    with pytest.raises(ImproperlyConfigured, match="PASSWORD_RESET_TIMEOUT"):
        load(monkeypatch, tmp_path, PASSWORD_RESET_TIMEOUT="600", TROUPE_PASSWORD_RESET_WINDOW_MINUTES="60")
    assert load(monkeypatch, tmp_path, PASSWORD_RESET_TIMEOUT="3600")["PASSWORD_RESET_TIMEOUT"] == 3600


# == look-alikes ============================================================================================


def _invitation_path(admin_client: Client) -> str:
    response = admin_client.post(reverse("team_invite"), {"role": "member"}, follow=True)
    return urlsplit(re.search(r'<code id="invitation-link">([^<]+)</code>', response.content.decode()).group(1)).path


@pytest.mark.parametrize("look_alike", [
    "b\u1d0fb",   # bᴏb: LATIN LETTER SMALL CAPITAL O (the example)
    "bo\u0184",   # boƄ: LATIN CAPITAL LETTER TONE SIX (the example)
    "\u0299ob",   # ʙob: small capital B
    "\u0180ob",   # ƀob: b with a stroke
    "\u0253ob",   # ɓob: b with a hook
    "b\u0275b",   # bɵb: barred o
    "b\u1d11b",   # bᴑb: sideways o
    "\U0001d41b\U0001d428\U0001d41b",  # mathematical bold
    "b\u03bfb",   # Greek omicron (mixed scripts too)
    "B0B",
])
def test_a_latin_look_alike_of_bob_cannot_join(alice, look_alike):
    bob = User.objects.create_user("bob", password=PASSPHRASE)
    Membership.objects.create(team=alice.team, user=bob, role="member")
    assert skeleton(look_alike) == skeleton("bob"), look_alike
    response = Client().post(_invitation_path(alice.client), {"username": look_alike, "password1": PASSPHRASE, "password2": PASSPHRASE})
    assert response.status_code == 400 and "username" in response.context["signup"].errors, look_alike
    assert not User.objects.filter(username=look_alike).exists()


def test_distinct_names_in_any_script_still_join(alice):
    for name in ("rob", "bobby", "b_o_b", "\u0411\u043e\u0440\u0438\u0441", "\u5c71\u7530", "j\u00f8rgen", "\u00e6lfred"):
        response = Client().post(_invitation_path(alice.client), {"username": name, "password1": PASSPHRASE, "password2": PASSPHRASE})
        assert response.status_code == 302, (name, response.content.decode()[:300])


def test_a_latin_look_alike_made_before_the_check_is_shown_escaped():
    assert shown("b\u1d0fb") == "b\u1d0fb [b\\u1d0fb]" and shown("bob") == "bob"

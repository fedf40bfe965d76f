"""Links in emails come from TROUPE_SITE_URL, never from the request (issue 31, class 5), and
password-reset requests are limited per client and per address (class 7)."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.test import Client
from django.urls import reverse

from webapp.models import Membership

ATTACKER = {"HTTP_HOST": "127.0.0.1:31337"}


@pytest.fixture
def carol(db) -> User:
    return User.objects.create_user("carol", "carol@example.org", "old secret passphrase")


def _links(body: str) -> list[str]:
    return re.findall(r"https?://\S+", body)


def test_a_reset_link_uses_the_site_address_not_the_requests_host(carol, settings):
    settings.TROUPE_SITE_URL = "https://troupe.example.org"
    settings.ALLOWED_HOSTS = ["127.0.0.1", "troupe.example.org"]
    response = Client().post(reverse("password_reset"), {"email": "carol@example.org"}, **ATTACKER)
    assert response.status_code == 302 and len(mail.outbox) == 1
    links = _links(mail.outbox[0].body)
    assert links and all(link.startswith("https://troupe.example.org/password-reset/") for link in links), links
    assert "31337" not in mail.outbox[0].body and "127.0.0.1" not in mail.outbox[0].body


def test_an_invitation_link_uses_the_site_address(alice, settings):
    settings.TROUPE_SITE_URL = "http://localhost:8000/troupe"
    response = alice.client.post(reverse("team_invite"), {"role": Membership.Role.MEMBER, "email": "dan@example.org"}, **ATTACKER)
    assert response.status_code == 302
    (link,) = _links(mail.outbox[0].body)
    assert link.startswith("http://localhost:8000/troupe/invite/"), link
    page = alice.client.get(reverse("team_members"))
    assert "http://localhost:8000/troupe/invite/" in page.content.decode() and "31337" not in page.content.decode()


def test_the_site_address_is_checked_at_start(monkeypatch):
    from django.core.exceptions import ImproperlyConfigured

    from webapp.core.env import env_site_url

    for bad in ("ftp://x", "troupe.example.org", "https://", "https://h:port", "https://u:p@h", "https://h/?next=x"):
        monkeypatch.setenv("TROUPE_SITE_URL", bad)
        with pytest.raises(ImproperlyConfigured, match="TROUPE_SITE_URL"):
            env_site_url("TROUPE_SITE_URL", "http://localhost:8000")
    monkeypatch.setenv("TROUPE_SITE_URL", "https://troupe.example.org:8443/")
    assert env_site_url("TROUPE_SITE_URL", "http://localhost:8000") == "https://troupe.example.org:8443"
    monkeypatch.delenv("TROUPE_SITE_URL")
    assert env_site_url("TROUPE_SITE_URL", "http://localhost:8000") == "http://localhost:8000"


def test_troupe_local_serves_links_at_the_address_it_listens_on():
    from webapp.management.commands.troupe import child_env

    assert child_env({}, host="127.0.0.1", port=8123)["TROUPE_SITE_URL"] == "http://127.0.0.1:8123"
    assert child_env({}, host="::1", port=8000)["TROUPE_SITE_URL"] == "http://[::1]:8000"
    assert child_env({"TROUPE_SITE_URL": "https://t.example"}, host="0.0.0.0", port=80)["TROUPE_SITE_URL"] == "https://t.example"


# == floods ================================================================================================


def test_one_client_cannot_flood_reset_emails(carol, settings):
    settings.TROUPE_PASSWORD_RESET_LIMIT = 3
    client = Client(REMOTE_ADDR="203.0.113.9")
    answers = [client.post(reverse("password_reset"), {"email": f"user{i}@example.org"}).status_code for i in range(6)]
    assert answers == [302, 302, 302, 429, 429, 429]
    refused = client.post(reverse("password_reset"), {"email": "carol@example.org"})
    assert refused.status_code == 429 and "Too many password-reset requests from your address" in refused.content.decode()
    assert mail.outbox == []  # carol's request came after the limit: nothing sent
    elsewhere = Client(REMOTE_ADDR="198.51.100.7").post(reverse("password_reset"), {"email": "carol@example.org"})
    assert elsewhere.status_code == 302 and len(mail.outbox) == 1  # another client is not held up


def test_one_address_gets_a_bounded_number_of_emails_from_many_clients(carol, settings):
    settings.TROUPE_PASSWORD_RESET_LIMIT = 2
    answers = [Client(REMOTE_ADDR=f"192.0.2.{i}").post(reverse("password_reset"), {"email": "Carol@Example.org "}).status_code
               for i in range(1, 6)]
    assert answers == [302] * 5 and len(mail.outbox) == 2  # past the limit: no more email, but no one is refused (issue 45)
    told = Client(REMOTE_ADDR="192.0.2.99").post(reverse("password_reset"), {"email": "carol@example.org"}, follow=True)
    assert "no new one was sent: the newest email" in told.content.decode() and len(mail.outbox) == 2


def test_unknown_addresses_count_the_same_so_the_limit_reveals_nothing(carol, settings):
    settings.TROUPE_PASSWORD_RESET_LIMIT = 1
    pages = []
    for n, email in enumerate(("ghost@example.org", "carol@example.org")):
        answers = [Client(REMOTE_ADDR=f"192.0.2.{10 * n + i}").post(reverse("password_reset"), {"email": email}, follow=True)
                   for i in (1, 2)]
        pages.append([(r.status_code, r.templates[0].name, "no new one was sent" in r.content.decode()) for r in answers])
    assert pages[0] == pages[1] == [(200, "teams/account/password_reset_done.html", False), (200, "teams/account/password_reset_done.html", True)]
    assert len(mail.outbox) == 1  # the same pages whether the address has an account or not; carol's first request sent one

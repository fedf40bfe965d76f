"""Failed logins are throttled (django-axes): after TROUPE_LOGIN_FAILURE_LIMIT failures a username is
refused from that address, even with the right password, for TROUPE_LOGIN_COOLOFF_MINUTES, with a page
that says so; other users, other addresses, API tokens and existing sessions are not affected."""

from __future__ import annotations

import runpy
from datetime import timedelta
from pathlib import Path

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import Client
from django.urls import reverse

from webapp.teams import services as tokens

SETTINGS = Path(__file__).resolve().parents[3] / "webapp" / "settings.py"
LIMIT = settings.AXES_FAILURE_LIMIT


def log_in(client: Client, username: str, password: str, *, ip: str = "198.51.100.7", url: str = "/login/"):
    return client.post(url, {"username": username, "password": password}, REMOTE_ADDR=ip)


def fail(client: Client, username: str, times: int = LIMIT, *, ip: str = "198.51.100.7") -> None:
    """`times` wrong passwords: the form's usual error below the limit, the lockout page from the limit on."""
    for attempt in range(1, times + 1):
        assert log_in(client, username, "wrong password", ip=ip).status_code == (200 if attempt < LIMIT else 429)


def logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def test_it_defaults_to_five_failures_and_fifteen_minutes_by_username_and_address():
    assert settings.AXES_FAILURE_LIMIT == 5
    assert settings.AXES_COOLOFF_TIME == timedelta(minutes=15)
    assert settings.AXES_LOCKOUT_PARAMETERS == [["username", "ip_address"]]
    assert settings.AUTHENTICATION_BACKENDS[0] == "axes.backends.AxesStandaloneBackend"


def test_it_refuses_even_the_right_password_after_too_many_failures(alice):
    client = Client()
    fail(client, "alice")
    response = log_in(client, "alice", "password")
    assert response.status_code == 429
    assert not logged_in(client)
    page = response.content.decode()
    assert "Too many failed logins. Try again in 15 minutes" in page
    assert 'name="username"' in page and 'value="alice"' in page  # the login form again, not a bare 403


def test_it_lets_a_user_in_below_the_limit_and_forgets_the_typos(alice):
    client = Client()
    fail(client, "alice", LIMIT - 1)
    response = log_in(client, "alice", "password")
    assert response.status_code == 302 and logged_in(client)
    assert not AccessAttempt.objects.filter(username="alice").exists()


def test_it_does_not_lock_another_user_or_the_same_user_elsewhere(alice, bob):
    fail(Client(), "alice")
    bob_client = Client()
    assert log_in(bob_client, "bob", "password").status_code == 302 and logged_in(bob_client)
    alice_at_her_desk = Client()
    assert log_in(alice_at_her_desk, "alice", "password", ip="203.0.113.20").status_code == 302
    assert logged_in(alice_at_her_desk)


def test_it_lets_the_user_in_again_after_the_cool_off(alice):
    client = Client()
    fail(client, "alice")
    assert log_in(client, "alice", "password").status_code == 429
    AccessAttempt.objects.filter(username="alice").update(attempt_time=AccessAttempt.objects.get().attempt_time - timedelta(minutes=16))
    assert log_in(client, "alice", "password").status_code == 302 and logged_in(client)


def test_it_locks_the_admin_login_too(alice):
    alice.user.is_staff = True
    alice.user.save()
    client = Client()
    fail(client, "alice")
    response = log_in(client, "alice", "password", url=reverse("admin:login"))
    assert response.status_code == 429 and not logged_in(client)


def test_it_counts_unknown_usernames_without_keeping_passwords(db):
    client = Client()
    fail(client, "nobody")
    assert log_in(client, "nobody", "anything").status_code == 429
    attempt = AccessAttempt.objects.get(username="nobody")
    assert attempt.failures_since_start == LIMIT + 1
    assert "wrong password" not in attempt.post_data and "anything" not in attempt.post_data


def test_it_leaves_api_tokens_and_open_sessions_working_while_locked_out(alice):
    _, text = tokens.api_token_create(user=alice.user, team=alice.team, name="notebook")
    fail(Client(), "alice", LIMIT + 1)
    assert Client().get(reverse("api_runs"), headers={"Authorization": f"Bearer {text}"}).status_code == 200
    assert alice.client.get(reverse("dashboard")).status_code == 200  # force_login'd before the lockout
    fresh = Client()
    fresh.force_login(alice.user)
    assert fresh.get(reverse("dashboard")).status_code == 200


def load_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **env: str) -> dict:
    monkeypatch.setenv("TROUPE_DATA_DIR", str(tmp_path / "data"))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return runpy.run_path(str(SETTINGS))


def test_it_reads_the_throttle_from_the_environment(monkeypatch, tmp_path):
    s = load_settings(monkeypatch, tmp_path, TROUPE_LOGIN_FAILURE_LIMIT="3", TROUPE_LOGIN_COOLOFF_MINUTES="60",
                      TROUPE_LOGIN_LOCKOUT_BY="username")
    assert s["AXES_FAILURE_LIMIT"] == 3
    assert s["AXES_COOLOFF_TIME"] == timedelta(hours=1)
    assert s["AXES_LOCKOUT_PARAMETERS"] == ["username"]
    assert load_settings(monkeypatch, tmp_path, TROUPE_LOGIN_LOCKOUT_BY="ip")["AXES_LOCKOUT_PARAMETERS"] == ["ip_address"]


@pytest.mark.parametrize(("name", "value"), [("TROUPE_LOGIN_FAILURE_LIMIT", "0"), ("TROUPE_LOGIN_FAILURE_LIMIT", "five"),
                                             ("TROUPE_LOGIN_COOLOFF_MINUTES", "0"), ("TROUPE_LOGIN_LOCKOUT_BY", "user_agent")])
def test_it_names_a_bad_throttle_variable(monkeypatch, tmp_path, name, value):
    with pytest.raises(ImproperlyConfigured, match=name):
        load_settings(monkeypatch, tmp_path, **{name: value})

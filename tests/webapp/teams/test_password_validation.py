"""Passwords are checked by Django's validators (similar to the username, too short, common, all
digits) wherever one is set: the admin's add-user and set-password forms and `changepassword`
(`createsuperuser` asks the same validators). Logins are not checked: the demo's admin/admin,
set directly by `seed_demo`, still logs in."""

from __future__ import annotations

from unittest import mock

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from webapp.ops import demo

GOOD = "plum kestrel lantern 42"


@pytest.fixture
def staff(alice):
    alice.user.is_staff = alice.user.is_superuser = True
    alice.user.save()
    return alice


@pytest.mark.parametrize(("password", "why"), [
    ("alice.liddell", "too similar to the username"),
    ("k3str3l!", "too short"),
    ("password123", "too common"),
    ("8675309123456", "entirely numeric"),
])
def test_it_refuses_weak_passwords(db, password, why):
    user = User(username="alice.liddell", email="alice@example.org")
    with pytest.raises(ValidationError, match=why):
        validate_password(password, user)
    validate_password(GOOD, user)


def test_it_asks_for_ten_characters_by_default():
    lengths = [v.get("OPTIONS", {}).get("min_length") for v in settings.AUTH_PASSWORD_VALIDATORS]
    assert 10 in lengths and len(settings.AUTH_PASSWORD_VALIDATORS) == 4


def test_it_refuses_a_weak_password_when_the_admin_adds_a_user(staff):
    url = reverse("admin:auth_user_add")
    weak = staff.client.post(url, {"username": "carol", "usable_password": "true", "password1": "password", "password2": "password"})
    assert weak.status_code == 200 and "This password is too common" in weak.content.decode()
    assert not User.objects.filter(username="carol").exists()
    staff.client.post(url, {"username": "carol", "usable_password": "true", "password1": GOOD, "password2": GOOD})
    assert User.objects.get(username="carol").check_password(GOOD)


def test_it_refuses_a_weak_password_when_the_admin_sets_one(staff, bob):
    url = reverse("admin:auth_user_password_change", args=[bob.user.pk])
    weak = staff.client.post(url, {"usable_password": "true", "password1": "12345678901", "password2": "12345678901"})
    assert weak.status_code == 200 and "This password is entirely numeric" in weak.content.decode()
    bob.user.refresh_from_db()
    assert bob.user.check_password("password")


def test_it_refuses_a_weak_password_from_changepassword(bob):
    with mock.patch("getpass.getpass", return_value="bob"), pytest.raises(CommandError, match="after 3 attempts"):
        call_command("changepassword", "bob", stdout=mock.Mock(), stderr=mock.Mock())
    bob.user.refresh_from_db()
    assert bob.user.check_password("password")


def test_it_still_logs_in_the_demo_users(db):
    demo.demo_seed()
    client = Client()
    assert client.post(reverse("login"), {"username": "admin", "password": "admin"}).status_code == 302


def test_a_weak_password_is_said_under_the_password_and_a_mismatch_under_the_confirmation(alice):
    """Issue 46, class 6: the validators' errors belong to the field the password was typed in."""
    url = reverse("password_change")
    weak = alice.client.post(url, {"old_password": "x", "new_password1": "password", "new_password2": "password"}).context["form"]
    assert "This password is too common." in weak.errors["new_password1"] and "new_password2" not in weak.errors
    mismatch = alice.client.post(url, {"old_password": "x", "new_password1": GOOD, "new_password2": GOOD + "!"}).context["form"]
    assert "The two password fields didn’t match." in mismatch.errors["new_password2"]
    from webapp.teams.forms import SignupForm

    signup = SignupForm({"username": "carol", "password1": "password", "password2": "password"})
    assert not signup.is_valid() and "This password is too common." in signup.errors["password1"]
    assert "password2" not in signup.errors

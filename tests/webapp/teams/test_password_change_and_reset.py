"""A member changes their password, or resets a forgotten one by email, from the app."""

import re

from django.contrib.auth.models import User
from django.core import mail
from django.test import Client
from django.urls import reverse

PERSONA_PASSWORD = "password"  # the personas' (tests/webapp/conftest.py)


def test_it_changes_the_password_of_a_logged_in_member(alice):
    page = alice.client.get(reverse("password_change"))
    assert page.status_code == 200 and "Change your password" in page.content.decode()

    wrong = alice.client.post(reverse("password_change"), {"old_password": "nope", "new_password1": "x", "new_password2": "y"})
    errors = wrong.context["form"].errors
    assert set(errors) >= {"old_password", "new_password2"}  # every problem at once

    done = alice.client.post(reverse("password_change"), {
        "old_password": PERSONA_PASSWORD, "new_password1": "a much better passphrase 42", "new_password2": "a much better passphrase 42",
    })
    assert done.status_code == 302 and done["Location"] == reverse("password_change_done")
    assert alice.client.get(reverse("dashboard")).status_code == 200  # still logged in here
    login = Client().post(reverse("login"), {"username": alice.user.username, "password": "a much better passphrase 42"})
    assert login.status_code == 302 and login["Location"] == reverse("dashboard")


def test_a_forgotten_password_is_reset_through_the_emailed_link(db):
    user = User.objects.create_user("carol", "carol@example.org", "old secret passphrase")
    anonymous = Client()
    assert "Forgot your password?" in anonymous.get(reverse("login")).content.decode()

    sent = anonymous.post(reverse("password_reset"), {"email": "carol@example.org"})
    assert sent.status_code == 302 and sent["Location"] == reverse("password_reset_done")
    assert len(mail.outbox) == 1 and mail.outbox[0].to == ["carol@example.org"]
    link = re.search(r"https?://[^/]+(/password-reset/[^/\s]+/[^/\s]+/)", mail.outbox[0].body).group(1)

    form = anonymous.get(link, follow=True)  # Django swaps the token for a session marker
    assert form.context["validlink"]
    done = anonymous.post(form.redirect_chain[-1][0], {"new_password1": "a fresh passphrase 77", "new_password2": "a fresh passphrase 77"})
    assert done.status_code == 302 and done["Location"] == reverse("password_reset_complete")
    user.refresh_from_db()
    assert user.check_password("a fresh passphrase 77")

    again = Client().get(link, follow=True)  # a used link does not work twice
    assert not again.context["validlink"] and "no longer works" in again.content.decode()


def test_an_unknown_address_gets_the_same_answer_and_no_email(db):
    response = Client().post(reverse("password_reset"), {"email": "nobody@example.org"})
    assert response.status_code == 302 and response["Location"] == reverse("password_reset_done")
    assert mail.outbox == []

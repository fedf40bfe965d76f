"""CSRF: every POST in the URL map is refused without the token (the bearer-token API excepted:
no cookies authenticate it), and every post form a page renders carries the token."""

from __future__ import annotations

import re

from django.test import Client

from tests.webapp.teams.test_url_map_access import all_urls, bravo_objects

FORM = re.compile(r"<form\b[^>]*>.*?</form>", re.S | re.I)


def test_every_post_without_the_token_is_refused(alice, alice_world):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice.user)
    refused = 0
    for url in all_urls():
        response = client.post(url.path, {"name": "x"})
        if url.api:
            assert response.status_code != 403 or b"CSRF" not in response.content, url.path
            continue
        assert response.status_code == 403, f"{url.path} ({url.name}): {response.status_code}"
        assert b"CSRF" in response.content, url.path
        refused += 1
    assert refused >= 30


def test_the_login_form_needs_the_token_too(alice):
    client = Client(enforce_csrf_checks=True)
    assert client.post("/login/", {"username": "alice", "password": "password"}).status_code == 403


def test_every_rendered_post_form_carries_the_token(bob, data_dir):
    """Bob's own pages, every GET-able URL with his objects (pk 4242) filled in."""
    bravo_objects(bob.team, bob.user, data_dir)
    bob.user.is_staff = bob.user.is_superuser = True  # the admin's forms too
    bob.user.save()
    forms = 0
    for url in all_urls():
        if url.api or (set(url.params) - {"pk", "object_id", "app_label"}):
            continue
        response = bob.client.get(url.path)
        if response.status_code != 200 or "html" not in response.get("Content-Type", ""):
            continue
        html = response.content.decode()
        for form in FORM.findall(html):
            if re.search(r'method\s*=\s*["\']?post', form, re.I):
                assert "csrfmiddlewaretoken" in form, f"{url.path}: {form[:200]}"
                forms += 1
    assert forms >= 20

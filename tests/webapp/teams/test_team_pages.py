"""Which URLs are a team's pages is declared in the URL map (`page()` in webapp/urls.py), not
guessed from the name of the view's module: a user in no team gets the no-team page on those, and
can still log out, change a password and accept an invitation."""

from __future__ import annotations

from django.urls import URLPattern, get_resolver, reverse

from webapp.models import Membership

NOT_TEAM_PAGES = {"login", "logout", "password_change", "password_change_done", "password_reset", "password_reset_done",
                  "password_reset_confirm", "password_reset_complete", "healthz", "favicon", "invitation_accept"}
"""The URLs served by the web app's views that work without a current team."""


def test_every_page_of_the_views_modules_is_declared_a_team_page_or_named_here():
    for pattern in get_resolver().url_patterns:
        if not isinstance(pattern, URLPattern):
            continue
        module = pattern.callback.__module__
        declared = getattr(pattern.callback, "needs_team", False)
        if pattern.name in NOT_TEAM_PAGES or not module.startswith("webapp."):
            assert not declared, pattern.name
        elif module.endswith(".views"):
            assert declared, f"{pattern.name}: declare it with page() in webapp/urls.py, or name it in NOT_TEAM_PAGES"
        else:  # the token-authenticated API
            assert module.startswith("webapp.api.") and not declared, pattern.name


def test_a_user_in_no_team_gets_the_no_team_page_and_can_still_log_out(alice):
    Membership.objects.filter(user=alice.user).delete()
    assert alice.client.get(reverse("run_list")).status_code == 403
    assert alice.client.get(reverse("password_change")).status_code == 200
    response = alice.client.post(reverse("logout"))
    assert response.status_code == 302
    assert alice.client.get(reverse("run_list")).status_code == 302  # logged out: to the login page

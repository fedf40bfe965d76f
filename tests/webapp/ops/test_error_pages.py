"""With DEBUG off (the default) a missing page or a server error is Troupe's own page, never
Django's debug page listing every URL pattern or a traceback."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import clear_url_caches, reverse

import webapp.urls


def test_a_missing_page_is_a_plain_404_page(alice):
    response = alice.client.get("/no/such/page/")
    page = response.content.decode()
    assert response.status_code == 404
    assert "<h1>Not found</h1>" in page and "Back to the dashboard" in page and "/no/such/page/" in page
    assert "URLconf" not in page and "runs/&lt;int:pk&gt;" not in page and "Traceback" not in page


def test_another_teams_object_is_the_same_404(alice, bob_world):
    response = alice.client.get(reverse("run_detail", args=[bob_world.run.pk]))
    assert response.status_code == 404 and "<h1>Not found</h1>" in response.content.decode()


def test_a_server_error_is_a_plain_500_page(alice, monkeypatch):
    def broken(request):
        raise RuntimeError("the secret detail")

    monkeypatch.setattr(webapp.urls.urlpatterns[0], "callback", broken)  # the dashboard
    clear_url_caches()
    client = Client(raise_request_exception=False)
    client.force_login(alice.user)
    response = client.get("/")
    page = response.content.decode()
    assert response.status_code == 500
    assert "Something went wrong" in page and "the secret detail" not in page and "Traceback" not in page


@pytest.mark.parametrize("path", ["/favicon.ico"])
def test_the_icon_is_there_for_pages_that_name_none(client, path):
    response = client.get(path)
    assert response.status_code == 301 and response["Location"] == "/static/favicon.svg"

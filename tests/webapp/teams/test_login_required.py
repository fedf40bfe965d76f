"""Every page requires login: anonymous visitors are sent to the login page."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

PAGES = [
    ("dashboard", []), ("run_list", []), ("run_new", []), ("agent_list", []), ("agent_create", []),
    ("agent_edit", [1]), ("agent_delete", [1]), ("topology_list", []), ("topology_create", []), ("topology_edit", [1]),
    ("topology_delete", [1]), ("dataset_list", []), ("dataset_upload", []), ("dataset_generate", []),
    ("dataset_detail", [1]), ("dataset_delete", [1]), ("model_source_list", []), ("model_source_create", []),
    ("model_source_edit", [1]), ("model_source_delete", [1]), ("run_detail", [1]), ("environment_hint", []),
]
POSTS = [("run_cancel", [1]), ("run_resume", [1]), ("run_preview", []), ("agent_duplicate", [1]),
         ("topology_duplicate", [1]), ("dataset_revalidate", [1]), ("team_switch", [])]


@pytest.mark.django_db
@pytest.mark.parametrize(("name", "args"), PAGES)
def test_it_redirects_anonymous_visitors_to_login(name, args):
    url = reverse(name, args=args)
    response = Client().get(url)
    assert response.status_code == 302
    assert response["Location"] == f"{reverse('login')}?next={url}"


@pytest.mark.django_db
@pytest.mark.parametrize(("name", "args"), POSTS)
def test_it_redirects_anonymous_posts_to_login(name, args):
    response = Client().post(reverse(name, args=args))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


@pytest.mark.django_db
def test_it_serves_the_login_page_and_logs_in(alice):
    anonymous = Client()
    assert anonymous.get(reverse("login")).status_code == 200
    response = anonymous.post(reverse("login"), {"username": "alice", "password": "password"})
    assert response.status_code == 302
    assert anonymous.get(reverse("dashboard")).status_code == 200


@pytest.mark.django_db
def test_it_logs_out_with_post(alice):
    response = alice.client.post(reverse("logout"))
    assert response.status_code == 302
    assert alice.client.get(reverse("dashboard")).status_code == 302

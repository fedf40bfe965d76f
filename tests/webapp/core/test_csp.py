"""Every page is served with a Content-Security-Policy that allows scripts only from this site or with
the request's nonce (no 'unsafe-inline', no eval), and the pages live within it: every inline script
carries the nonce, and no page or htmx fragment has an inline event handler, a javascript: URL, a
style attribute or a <style> element. (tests/browser checks the same in Chromium, which reports
any violation.)"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from django.contrib import admin
from django.test import Client
from django.urls import reverse

from webapp.models import Membership, Run, Team


class Markup(HTMLParser):
    """The inline scripts (with their nonce) and the CSP-relevant markup of one HTML page."""

    def __init__(self, html: str):
        super().__init__()
        self.inline_scripts: list[str | None] = []  # each one's nonce
        self.problems: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "script" and not a.get("src") and a.get("type", "text/javascript") != "application/json":
            self.inline_scripts.append(a.get("nonce"))
        if tag == "style":
            self.problems.append("<style> element")
        for name, value in attrs:
            if name.startswith("on"):
                self.problems.append(f"<{tag} {name}=...> (inline event handler)")
            elif name == "style":
                self.problems.append(f"<{tag} style={value!r}> (style attribute)")
            elif name in ("href", "src", "action", "formaction") and (value or "").strip().lower().startswith("javascript:"):
                self.problems.append(f"<{tag} {name}={value!r}>")
            elif name == "hx-vals" and (value or "").lstrip().startswith("js:") or name.startswith("hx-on"):
                self.problems.append(f"<{tag} {name}=...> (htmx eval)")


def policy(response) -> dict[str, list[str]]:
    header = response["Content-Security-Policy"]
    return {d.split()[0]: d.split()[1:] for d in (part.strip() for part in header.split(";")) if d}


def nonce_of(response) -> str | None:
    found = [s for s in policy(response).get("script-src", []) if s.startswith("'nonce-")]
    return found[0][len("'nonce-"):-1] if found else None


def assert_within_policy(response, where: str) -> None:
    assert response.status_code == 200, where
    markup = Markup(response.content.decode())
    assert not markup.problems, f"{where}: {markup.problems}"
    if markup.inline_scripts:
        nonce = nonce_of(response)
        assert nonce, f"{where}: inline scripts but no nonce in the policy"
        assert all(n == nonce for n in markup.inline_scripts), f"{where}: an inline script without this response's nonce"


def test_it_sends_a_strict_policy(alice):
    response = alice.client.get(reverse("dashboard"))
    p = policy(response)
    assert p["default-src"] == ["'self'"]
    assert p["script-src"][0] == "'self'" and len(p["script-src"]) <= 2
    for directive in ("script-src", "style-src"):
        assert not {"'unsafe-inline'", "'unsafe-eval'", "'unsafe-hashes'", "data:", "*"} & set(p[directive]), directive
    assert p["style-src"] == ["'self'"]
    assert p["object-src"] == ["'none'"] and p["frame-ancestors"] == ["'none'"]
    assert p["base-uri"] == ["'self'"] and p["form-action"] == ["'self'"]
    assert p["connect-src"] == ["'self'", "ws://testserver"]  # the websocket, named for browsers where 'self' misses ws:


def test_it_names_the_secure_websocket_over_https(alice):
    response = alice.client.get(reverse("dashboard"), secure=True)
    assert policy(response)["connect-src"] == ["'self'", "wss://testserver"]


def test_it_nonces_the_run_page_script_afresh_for_each_request(alice, alice_world):
    url = reverse("run_detail", args=[alice_world.run.pk])
    first, second = alice.client.get(url), alice.client.get(url)
    assert nonce_of(first) and nonce_of(second) and nonce_of(first) != nonce_of(second)
    assert f'<script nonce="{nonce_of(first)}">' in first.content.decode()


def test_it_leaves_the_nonce_out_where_no_inline_script_needs_it(alice):
    assert nonce_of(alice.client.get(reverse("run_list"))) is None


@pytest.mark.django_db
def test_the_login_page_and_the_lockout_page_live_within_it(alice):
    anonymous = Client()
    assert_within_policy(anonymous.get(reverse("login")), "login")
    for _ in range(6):
        locked = anonymous.post(reverse("login"), {"username": "alice", "password": "nope"})
    assert locked.status_code == 429 and "Content-Security-Policy" in locked
    assert not Markup(locked.content.decode()).problems


def test_every_page_lives_within_it(alice, alice_world):
    w = alice_world
    Membership.objects.create(team=Team.objects.create(name="Charlie"), user=alice.user, role=Membership.Role.MEMBER)
    assert "data-submit-on-change" in alice.client.get(reverse("dashboard")).content.decode()  # the team switcher shows
    other = Run.objects.create(team=w.run.team, owner=alice.user, name="second", topology=w.topology, dataset=w.dataset,
                               config_yaml=w.run.config_yaml, environment=w.run.environment, specialization=w.run.specialization)
    pages = ["dashboard", "run_list", "run_new", "agent_list", "agent_create", "topology_list",
             "topology_create", "dataset_list", "dataset_upload", "dataset_generate", "model_source_list",
             "model_source_create", "worker_list", "playground", "api_tokens"]
    urls = [reverse(name) for name in pages] + [
        reverse("agent_edit", args=[w.tool.pk]), reverse("topology_edit", args=[w.topology.pk]),
        reverse("dataset_detail", args=[w.dataset.pk]), reverse("model_source_edit", args=[w.source.pk]),
        reverse("run_detail", args=[w.run.pk]), reverse("run_compare") + f"?ids={w.run.pk}&ids={other.pk}",
    ]
    for url in urls:
        assert_within_policy(alice.client.get(url), url)


def test_every_htmx_fragment_lives_within_it_without_inline_script(alice, alice_world):
    w = alice_world
    htmx = {"HX-Request": "true"}
    fragments = [
        alice.client.get(reverse("dashboard"), headers=htmx),
        alice.client.get(reverse("run_list"), {"status": "failed"}, headers=htmx),
        alice.client.get(reverse("run_detail", args=[w.run.pk]), headers=htmx),
        alice.client.get(reverse("run_rollouts", args=[w.run.pk]), headers=htmx),
        alice.client.get(reverse("worker_list"), headers=htmx),
        alice.client.get(reverse("environment_hint"), {"environment": "math_tool"}, headers=htmx),
        alice.client.post(reverse("run_preview"), {"topology": w.topology.pk, "dataset": w.dataset.pk}, headers=htmx),
    ]
    for response in fragments:
        assert_within_policy(response, response.request["PATH_INFO"])
        # A fragment's nonce is not the page's: a script in it would be refused, so there is none.
        assert not Markup(response.content.decode()).inline_scripts, response.request["PATH_INFO"]


def test_the_admin_lives_within_it(alice, alice_world):
    alice.user.is_staff = alice.user.is_superuser = True
    alice.user.save()
    urls = [reverse("admin:index"), reverse("admin:auth_user_add"), reverse("admin:auth_user_change", args=[alice.user.pk])]
    for model in admin.site._registry:
        urls.append(reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist"))
    for obj in (alice_world.run, alice_world.topology, alice_world.dataset, alice_world.tool):
        urls.append(reverse(f"admin:webapp_{obj._meta.model_name}_change", args=[obj.pk]))
    for url in urls:
        assert_within_policy(alice.client.get(url), url)


def test_the_static_scripts_use_no_eval():
    static = Path(__file__).resolve().parents[3] / "static" / "js"
    for path in static.glob("*.js"):
        text = path.read_text()
        assert not re.search(r"\beval\(|new Function\(|setTimeout\(\s*[\"']|\.setAttribute\(\s*[\"']style", text), path.name

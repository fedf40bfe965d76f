"""A user sees only their team's objects: another team's object is a 404 on every URL."""

from __future__ import annotations

from django.urls import reverse


def _urls(world):
    return {
        "get": [
            reverse("agent_edit", args=[world.tool.pk]),
            reverse("agent_delete", args=[world.tool.pk]),
            reverse("topology_edit", args=[world.topology.pk]),
            reverse("topology_delete", args=[world.topology.pk]),
            reverse("dataset_detail", args=[world.dataset.pk]),
            reverse("dataset_delete", args=[world.dataset.pk]),
            reverse("model_source_edit", args=[world.source.pk]),
            reverse("model_source_delete", args=[world.source.pk]),
            reverse("run_detail", args=[world.run.pk]),
        ],
        "post": [
            reverse("agent_edit", args=[world.tool.pk]),
            reverse("agent_delete", args=[world.tool.pk]),
            reverse("agent_duplicate", args=[world.tool.pk]),
            reverse("topology_edit", args=[world.topology.pk]),
            reverse("topology_delete", args=[world.topology.pk]),
            reverse("topology_duplicate", args=[world.topology.pk]),
            reverse("dataset_detail", args=[world.dataset.pk]),
            reverse("dataset_delete", args=[world.dataset.pk]),
            reverse("dataset_revalidate", args=[world.dataset.pk]),
            reverse("model_source_edit", args=[world.source.pk]),
            reverse("model_source_delete", args=[world.source.pk]),
            reverse("run_cancel", args=[world.run.pk]),
            reverse("run_resume", args=[world.run.pk]),
        ],
    }


def test_it_returns_404_for_another_teams_objects(alice, alice_world, bob_world):
    urls = _urls(bob_world)
    for url in urls["get"]:
        assert alice.client.get(url).status_code == 404, url
    for url in urls["post"]:
        assert alice.client.post(url, {"name": "x"}).status_code == 404, url
    bob_world.run.refresh_from_db()
    assert bob_world.run.status == "queued" and not bob_world.run.cancel_requested
    assert bob_world.tool.__class__.objects.filter(pk=bob_world.tool.pk).exists()


def test_it_serves_the_same_urls_for_the_owner_team(alice, alice_world):
    for url in _urls(alice_world)["get"]:
        assert alice.client.get(url).status_code == 200, url


def test_it_lists_only_the_current_teams_objects(alice, alice_world, bob_world):
    bob_world.run.name = "bravo secret run"
    bob_world.run.save()
    bob_world.tool.name = "bravo-agent"
    bob_world.tool.save()
    pages = [reverse(n) for n in ("dashboard", "run_list", "agent_list", "topology_list", "dataset_list", "model_source_list")]
    for url in pages:
        body = alice.client.get(url).content.decode()
        assert "bravo" not in body.lower(), url


def test_it_offers_only_the_teams_topologies_and_datasets_in_the_run_form(alice, alice_world, bob_world):
    response = alice.client.post(reverse("run_new"), {"topology": bob_world.topology.pk, "dataset": bob_world.dataset.pk})
    form = response.context["form"]
    assert "topology" in form.errors and "dataset" in form.errors

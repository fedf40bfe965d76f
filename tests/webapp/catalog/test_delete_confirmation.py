"""A delete confirmation says before the click why the object cannot be deleted (and offers no
Delete button then); deleting still goes through the service, which refuses the same way."""

from __future__ import annotations

import pytest
from django.urls import reverse

from webapp.models import Agent, ModelSource


@pytest.mark.parametrize(("url_name", "obj", "reason"), [
    ("model_source_delete", "source", "Agents use this model: reasoner, tool."),
    ("agent_delete", "tool", "Used by topologies: duo."),
    ("topology_delete", "topology", "A queued or running run uses this topology"),
    ("dataset_delete", "dataset", "A queued or running run uses this dataset"),
])
def test_the_confirmation_says_why_not_before_the_click(alice, alice_world, url_name, obj, reason):
    url = reverse(url_name, args=[getattr(alice_world, obj).pk])
    page = alice.client.get(url).content.decode()
    assert reason in page and '<button class="danger">Delete</button>' not in page
    refused = alice.client.post(url).content.decode()
    assert reason in refused


def test_a_free_object_is_offered_for_deletion(alice, alice_world):
    spare = ModelSource.objects.create(team=alice.team, name="spare", source="tiny-random:llama")
    page = alice.client.get(reverse("model_source_delete", args=[spare.pk])).content.decode()
    assert "This cannot be undone." in page and '<button class="danger">Delete</button>' in page
    assert alice.client.post(reverse("model_source_delete", args=[spare.pk])).status_code == 302
    assert not ModelSource.objects.filter(pk=spare.pk).exists() and Agent.objects.count() == 2


def test_deleting_a_dataset_or_topology_names_the_runs_that_used_them(alice, alice_world):
    from webapp.models import Dataset, Run

    Run.objects.filter(pk=alice_world.run.pk).update(status="succeeded")
    upload = Dataset.objects.create(team=alice.team, name="sums", kind="upload", environment="math_tool",
                                    original_filename="sums.jsonl", row_count=40)
    Run.objects.filter(pk=alice_world.run.pk).update(dataset=upload)
    page = " ".join(alice.client.get(reverse("dataset_delete", args=[upload.pk])).content.decode().split())
    assert f"1 run used it: #{alice_world.run.pk} {alice_world.run.name}." in page
    assert "Its file goes from disk (sums.jsonl, 40 rows)." in page and "needs the file uploaded again" in page
    topology = " ".join(alice.client.get(reverse("topology_delete", args=[alice_world.topology.pk])).content.decode().split())
    assert f"1 run used it: #{alice_world.run.pk} {alice_world.run.name}." in topology and "keep their config snapshot" in topology
    unused = Dataset.objects.create(team=alice.team, name="fresh", kind="generator", environment="math_tool", size=4, eval_size=2)
    page = alice.client.get(reverse("dataset_delete", args=[unused.pk])).content.decode()
    assert "used it" not in page and "This cannot be undone." in page

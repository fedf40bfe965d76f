""""Clone and edit": the new-run form opens pre-filled from a run's config (topology, dataset,
hyperparameters, and the advanced YAML for everything else), so submitting it unchanged queues
the same config under a new name."""

from __future__ import annotations

import re

import yaml
from django.urls import reverse

from webapp.models import Run
from webapp.runs import services as run_services


def form_fields(html: str) -> dict[str, str]:
    """The form's values as a browser would submit them (inputs, selected options, textareas)."""
    values: dict[str, str] = {}
    for name, value in re.findall(r'<input[^>]*name="([^"]+)"[^>]*value="([^"]*)"', html):
        values[name] = value
    for name, body in re.findall(r'<select name="([^"]+)"[^>]*>(.*?)</select>', html, re.S):
        chosen = re.search(r'<option value="([^"]*)"[^>]*selected', body)
        values[name] = chosen.group(1) if chosen else ""
    for name, body in re.findall(r'<textarea name="([^"]+)"[^>]*>(.*?)</textarea>', html, re.S):
        values[name] = body.strip("\n").replace("&#x27;", "'").replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    values.pop("csrfmiddlewaretoken", None)
    return values


def submit_clone(alice, run: Run, capture) -> Run:
    html = alice.client.get(reverse("run_new"), {"clone": run.pk}).content.decode()
    with capture(execute=True):
        response = alice.client.post(reverse("run_new"), form_fields(html))
    assert response.status_code == 302, response.content.decode()[:2000]
    return Run.objects.exclude(pk=run.pk).latest("id")


def test_it_reproduces_the_config(alice, alice_world, enqueued, django_capture_on_commit_callbacks):
    original = run_services.run_config_build(
        topology=alice_world.topology, dataset=alice_world.dataset, name="tuned",
        overrides={"optim.steps": 7, "optim.lr": 2e-4, "grpo.k": 6}, advanced_yaml="grpo:\n  alpha: 0.5\nseed: 3\n",
    )
    run = Run.objects.create(team=alice.team, name="tuned", topology=alice_world.topology, dataset=alice_world.dataset,
                             config_yaml=original.to_yaml(), status="succeeded")
    html = alice.client.get(reverse("run_new"), {"clone": run.pk}).content.decode()
    assert 'value="tuned (clone)"' in html and 'value="0.0002"' in html
    advanced = yaml.safe_load(form_fields(html)["advanced_yaml"])
    assert advanced == {"seed": 3, "grpo": {"alpha": 0.5}}  # only what the form's fields do not hold
    clone = submit_clone(alice, run, django_capture_on_commit_callbacks)
    expected = original.to_dict() | {"name": "tuned (clone)"}
    assert clone.to_config().to_dict() == expected and clone.name == "tuned (clone)"
    assert enqueued == [clone.pk]


def test_it_restores_agents_edited_since(alice, alice_world, enqueued, django_capture_on_commit_callbacks):
    run = alice_world.run
    Run.objects.filter(pk=run.pk).update(status="succeeded")
    alice_world.tool.instructions = "Something else now."
    alice_world.tool.save()
    html = alice.client.get(reverse("run_new"), {"clone": run.pk}).content.decode()
    assert "agents changed since" in html
    clone = submit_clone(alice, run, django_capture_on_commit_callbacks)
    assert clone.to_config().topology.agents == run.to_config().topology.agents
    assert clone.to_config().topology.agents[0].instructions == "Write Python."


def test_it_explains_a_deleted_dataset(alice, alice_world):
    run = alice_world.run
    Run.objects.filter(pk=run.pk).update(dataset=None, status="succeeded")
    html = alice.client.get(reverse("run_new"), {"clone": run.pk}).content.decode()
    assert "dataset was deleted" in html
    assert "data:" in form_fields(html)["advanced_yaml"]


def test_it_does_not_clone_another_teams_run(bob, alice_world):
    assert bob.client.get(reverse("run_new"), {"clone": alice_world.run.pk}).status_code == 404

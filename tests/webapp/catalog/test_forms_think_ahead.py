"""Forms that think ahead: the environment help box describes the environment the select shows
picked (nothing while none is), "Run" from a topology (or a dataset) fills in the matching other
half, and select boxes hold labels short enough not to be cut (what each means is in the help)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from webapp.models import SPECIALIZATION_LABELS, Dataset, Topology


@pytest.mark.parametrize("url_name", ["dataset_upload", "dataset_generate"])
def test_the_environment_help_waits_for_a_pick(alice, url_name):
    page = alice.client.get(reverse(url_name)).content.decode()
    hint = page.split('id="env-hint"')[1].split("</div>")[0]
    assert "Pick an environment to see its roles" in hint and "math_tool" not in hint
    picked = alice.client.post(reverse(url_name), {"environment": "plan_path"}).content.decode()
    assert "<strong>plan_path</strong>" in picked.split('id="env-hint"')[1].split("</div>")[0]


def test_run_from_a_topology_picks_a_matching_dataset(alice, alice_world):
    w = alice_world
    Topology.objects.filter(pk=w.topology.pk).update(env_args={"level": 2})
    Dataset.objects.create(team=alice.team, name="arith", kind="generator", environment="arithmetic", size=4, eval_size=2)
    level2 = Dataset.objects.create(team=alice.team, name="math L2", kind="generator", environment="math_tool",
                                    env_args={"level": 2}, size=4, eval_size=2)
    Dataset.objects.create(team=alice.team, name="math newest", kind="generator", environment="math_tool",
                           env_args={"level": 3}, size=4, eval_size=2)
    form = alice.client.get(reverse("run_new"), {"topology": w.topology.pk}).context["form"]
    assert form.initial == {"topology": str(w.topology.pk), "dataset": str(level2.pk)}  # same environment and level
    chosen = alice.client.get(reverse("run_new"), {"topology": w.topology.pk, "dataset": w.dataset.pk}).context["form"]
    assert chosen.initial["dataset"] == str(w.dataset.pk)  # a dataset given stays
    back = alice.client.get(reverse("run_new"), {"dataset": level2.pk}).context["form"]
    assert back.initial == {"topology": str(w.topology.pk), "dataset": str(level2.pk)}
    solo = Topology.objects.create(team=alice.team, name="planner", environment="plan_path", specialization="single")
    assert "dataset" not in alice.client.get(reverse("run_new"), {"topology": solo.pk}).context["form"].initial  # none fits


@pytest.mark.parametrize(("url_name", "args"), [("run_new", ()), ("topology_create", ())])
def test_select_labels_fit_and_the_help_says_what_they_mean(alice, alice_world, url_name, args):
    form = alice.client.get(reverse(url_name, args=args)).context["form"]
    field = form.fields["specialization"]
    labels = [label for value, label in field.choices if value]
    assert labels == ["single (L0)", "prompt (L1)", "lora (L2)", "full (L3)"]
    assert all(long.replace(" — ", ": ", 1) in field.help_text for long in SPECIALIZATION_LABELS.values())

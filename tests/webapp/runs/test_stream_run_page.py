"""The live run page itself: wired to its socket, light on a long run."""

from __future__ import annotations

from django.urls import reverse

from webapp.models import Evaluation


def test_it_wires_the_page_to_its_socket_and_rollouts(alice, alice_world):
    html = alice.client.get(reverse("run_detail", args=[alice_world.run.pk])).content.decode()
    assert f'data-ws="/ws/runs/{alice_world.run.pk}/"' in html
    assert f'data-rollouts-url="{reverse("run_rollouts", args=[alice_world.run.pk])}"' in html
    assert "uplot-1.6.32.iife.min.js" in html and "run-live.js" in html and "troupeEarlySocket" in html
    assert '<option value="tool">tool</option>' in html and '<option value="reasoner">reasoner</option>' in html  # filter


def test_it_lists_only_the_latest_evaluations_in_the_held_out_table(alice, alice_world):
    Evaluation.objects.bulk_create([
        Evaluation(run=alice_world.run, step=s, team_success=s / 100, agents={}, data={"n": 8}) for s in range(1, 101)
    ])
    html = alice.client.get(reverse("run_detail", args=[alice_world.run.pk]), {"parts": "held-out"},
                            headers={"HX-Request": "true"}).content.decode()
    assert 'id="held-out-results" hx-swap-oob="true"' in html
    assert "The latest 10 of 100" in html
    assert "<td>100</td>" in html and "<td>91</td>" in html and "<td>90</td>" not in html

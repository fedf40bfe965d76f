"""Compare 2 to 8 runs: curves of any metric per run and per agent (from the database,
downsampled), final and held-out metrics side by side, and a config diff with a
"differences only" toggle. Runs of another team are a 404."""

from __future__ import annotations

from django.urls import reverse

from tests.webapp.history_helpers import add_evaluations, add_metrics, make_run
from webapp.history import selectors as history
from webapp.models import Run


def compare_url(*runs: Run, **params: str) -> str:
    query = "&".join([f"ids={r.pk}" for r in runs] + [f"{k}={v}" for k, v in params.items()])
    return reverse("run_compare") + "?" + query


def two_runs(alice, alice_world) -> tuple[Run, Run]:
    a = make_run(alice.team, alice_world.run, name="lr 1e-4")
    config = a.to_config().replace(**{"optim.lr": 3e-4, "grpo.k": 8})
    b = make_run(alice.team, alice_world.run, name="lr 3e-4", config_yaml=config.to_yaml())
    add_metrics(a, 50, slope=0.01)
    add_metrics(b, 50, slope=0.02)
    add_evaluations(a, [(0, 0.1, {"tool": 0.2, "reasoner": 0.1}), (50, 0.3, {"tool": 0.5, "reasoner": 0.3})])
    add_evaluations(b, [(0, 0.1, {"tool": 0.2, "reasoner": 0.1}), (50, 0.05, {"tool": 0.1, "reasoner": 0.0})])
    return a, b


def test_it_shows_final_and_held_out_metrics_and_the_config_diff(alice, alice_world):
    a, b = two_runs(alice, alice_world)
    response = alice.client.get(compare_url(a, b))
    html = response.content.decode()
    assert response.status_code == 200 and "lr 1e-4" in html and "lr 3e-4" in html
    final = dict(response.context["final"])
    assert final["reward/total"] == [0.5, 1.0]
    held = response.context["held_out"]
    assert held[0].team == (0.1, 0.3) and round(held[0].team_delta, 3) == 0.2 and held[1].team_delta < 0
    assert 'class="delta up"' in html and 'class="delta down"' in html
    diff = {row.key: row for row in response.context["diff"]}
    assert diff["optim.lr"].differs and diff["optim.lr"].values == ["0.0001", "0.0003"]  # a lora run: 1e-4 by default
    assert diff["grpo.k"].values == ["4", "8"] and not diff["grpo.alpha"].differs
    assert "topology.agents[1].role" in diff and "name" not in diff
    assert response.context["metrics"][:2] == ["reward/total", "success"] and "loss" in response.context["metrics"]


def test_it_toggles_differences_only(alice, alice_world):
    a, b = two_runs(alice, alice_world)
    html = alice.client.get(compare_url(a, b, diff="1"), headers={"HX-Request": "true"}).content.decode()
    assert html.lstrip().startswith('<div id="config-diff"') and "<html" not in html
    assert "optim.lr" in html and "grpo.k" in html and "grpo.alpha" not in html and "seed" not in html
    full = alice.client.get(compare_url(a, b), headers={"HX-Request": "true"}).content.decode()
    assert "grpo.alpha" in full


def test_it_serves_downsampled_curves_per_run_and_agent(alice, alice_world):
    a, b = two_runs(alice, alice_world)
    data = alice.client.get(reverse("run_compare_data"), {"ids": [a.pk, b.pk], "metric": "reward/total"}).json()
    assert [r["id"] for r in data["runs"]] == [a.pk, b.pk]
    steps, values = data["runs"][1]["run"]
    assert steps == list(range(1, 51)) and values[-1] == 1.0
    assert set(data["runs"][0]["agents"]) == {"tool", "reasoner"}
    assert data["runs"][0]["agents"]["reasoner"][1][0] == 1.01  # agent i's curve is offset by i in the fixture
    small = history.compare_series(runs=[a, b], metric="reward/total", max_points=10)
    xs, ys = small["runs"][0]["run"]
    assert small["downsampled"] and len(xs) <= 10 and xs[0] == 1 and xs[-1] == 50
    missing = alice.client.get(reverse("run_compare_data"), {"ids": [a.pk, b.pk], "metric": "nope"}).json()
    assert missing["runs"][0]["run"] == [[], []]


def test_it_needs_two_to_eight_runs(alice, alice_world):
    response = alice.client.get(compare_url(alice_world.run), follow=True)
    assert response.redirect_chain[-1][0] == reverse("run_list") and "Pick 2 to 8 runs" in response.content.decode()
    many = [make_run(alice.team, alice_world.run, name=f"r{i}") for i in range(9)]
    assert alice.client.get(compare_url(*many)).status_code == 302
    assert alice.client.get(compare_url(*many[:8])).status_code == 200


def test_it_refuses_another_teams_runs(alice, alice_world, bob, bob_world):
    mine = make_run(alice.team, alice_world.run, name="mine")
    assert alice.client.get(compare_url(mine, bob_world.run)).status_code == 404
    assert alice.client.get(reverse("run_compare_data"), {"ids": [mine.pk, bob_world.run.pk]}).status_code == 404


def test_it_flattens_configs_to_dotted_keys():
    flat = history.config_flatten({"a": {"b": 1, "c": [1, 2]}, "agents": [{"name": "x"}], "empty": {}})
    assert flat == {"a.b": "1", "a.c": "[1, 2]", "agents[0].name": "x", "empty": "{}"}

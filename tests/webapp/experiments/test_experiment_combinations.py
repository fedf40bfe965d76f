"""A search checks each range at its ends alone, and a sampled combination may still be no valid
run (`grpo.delta` must exceed 1 + `grpo.eps_high`): such a point is told to Optuna as failed and
the search goes on to its budget, launch and Resume included. The experiment form takes seeds in
ASCII digits only (no 500 on `²` or a 5,000-digit number), and a grid or a search over the limits
is refused from its counts, before a single config is built."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse

from tests.webapp.experiments.test_experiment_search import fake_train
from training import experiment as engine_experiment
from training import search as engine_search
from training.config import RunConfig
from training.search import SearchSpec, parse_search, search_ask
from webapp.models import Experiment, Run
from webapp.runs import services as run_services

PAIR = "trials: 5\nparams:\n  grpo.eps_high: {low: 0.1, high: 0.99}\n  grpo.delta: {low: 1.3, high: 1.6}\nstartup_trials: 2"
"""Each end valid alone (with the base's eps_high, 0.28, or no delta); about three points in five together are not."""


def form(world: Any, **extra: Any) -> dict[str, Any]:
    return {"topology": world.topology.pk, "dataset": world.dataset.pk, "name": "clip search",
            "advanced_yaml": "optim:\n  steps: 2\neval:\n  every: 1", "axes_yaml": "", "search_yaml": PAIR,
            "seeds": "3", "metric": "team.success", "direction": "maximize", **extra}


def valid_pair(config: RunConfig) -> bool:
    return config.grpo.delta is not None and config.grpo.delta > 1 + config.grpo.eps_high


def test_search_ask_tells_refused_points_as_failed_and_returns_a_valid_one():
    base = RunConfig.load(Path("configs/tiny-lora.yaml"))
    problems: list[tuple[str, str]] = []
    import yaml

    search = parse_search(yaml.safe_load(PAIR), base, lambda where, message: problems.append((where, message)))
    assert problems == [] and isinstance(search, SearchSpec)
    refused = 0

    def build(params: dict[str, Any]) -> RunConfig:
        nonlocal refused
        try:
            return engine_experiment.with_fields(base, **params)
        except ValueError:
            refused += 1
            raise

    asked = [search_ask(search=search, direction="maximize", seed=3, records=[], build=build) for _ in range(2)]
    assert asked[0][0] == asked[1][0]  # the same records ask the same point, refusals included (Resume asks it again)
    assert refused > 0 and all(valid_pair(config) for _, config in asked)


def test_a_search_whose_combinations_are_often_invalid_reaches_its_budget_through_resume(
        alice, alice_world, settings, enqueued, django_capture_on_commit_callbacks):
    settings.TROUPE_EXPERIMENT_CONCURRENCY = 2
    Run.objects.filter(pk=alice_world.run.pk).update(status="succeeded")
    with django_capture_on_commit_callbacks(execute=True):
        response = alice.client.post(reverse("experiment_new"), form(alice_world))
    assert response.status_code == 302, response.context["form"].errors
    experiment = Experiment.objects.get()
    assert experiment.runs.count() == 2
    with django_capture_on_commit_callbacks(execute=True):
        run_services.run_execute(worker="w", train=fake_train(lambda c: 0.5))
    assert alice.client.post(reverse("experiment_cancel", args=[experiment.pk])).status_code == 302
    response = alice.client.post(reverse("experiment_resume", args=[experiment.pk]), follow=True)
    assert response.status_code == 200 and "again" in response.content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        for _ in range(6):
            run_services.run_execute(worker="w", train=fake_train(lambda c: 0.5))
    runs = list(experiment.runs.filter(trial_index__isnull=False).order_by("trial_index", "created"))
    assert sorted({r.trial_index for r in runs}) == [0, 1, 2, 3, 4]  # the whole budget, none lost to a refused point
    assert all(valid_pair(r.to_config()) for r in runs)


def test_ranges_with_no_valid_combination_are_a_form_error_not_a_500(alice, alice_world):
    never = "trials: 3\nparams:\n  grpo.eps_high: {low: 0.5, high: 0.9}\n  grpo.delta: {low: 1.3, high: 1.45}"
    response = alice.client.post(reverse("experiment_new"), form(alice_world, search_yaml=never))
    assert response.status_code == 200
    assert "make no valid run" in " ".join(response.context["form"].errors["search_yaml"])
    assert not Experiment.objects.exists() and Run.objects.count() == 1


@pytest.mark.parametrize("seeds", ["²", "1" * 5000, "0, ３", "-1", "0x10", "1e3"])
def test_the_form_refuses_seeds_that_are_not_ascii_whole_numbers(alice, alice_world, seeds):
    for view in ("experiment_new", "experiment_preview"):
        response = alice.client.post(reverse(view), form(alice_world, search_yaml="", axes_yaml="optim.lr: [1.0e-4]", seeds=seeds))
        assert response.status_code == 200, view
    assert "seeds" in alice.client.post(reverse("experiment_new"), form(alice_world, search_yaml="", seeds=seeds)).context["form"].errors
    assert not Experiment.objects.exists()


def test_ids_written_with_other_digits_name_nothing(alice, alice_world):
    for url in (reverse("topology_list") + "?saved=²", reverse("experiment_new") + "?topology=²&dataset=" + "9" * 40):
        assert alice.client.get(url).status_code == 200, url


def test_grids_and_searches_over_the_limits_are_refused_before_any_config_is_built(alice, alice_world, monkeypatch):
    built: list[Any] = []
    real = engine_experiment.with_fields

    def counting(*args: Any, **kwargs: Any) -> Any:
        built.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(engine_experiment, "with_fields", counting)
    monkeypatch.setattr(engine_search, "with_fields", counting)
    wide = "\n".join(f"topology.env_args.a{i}: [{', '.join(str(v) for v in range(64))}]" for i in range(58))  # 64^58 points
    for axes in (wide, "\n".join(f"topology.env_args.b{i}: [1]" for i in range(40))):  # 40 axes of one value
        response = alice.client.post(reverse("experiment_new"), form(alice_world, search_yaml="", axes_yaml=axes))
        assert "axes_yaml" in response.context["form"].errors
    many = "trials: 3\nparams:\n" + "\n".join(f"  topology.env_args.c{i}: {{choices: [{', '.join(map(str, range(64)))}]}}" for i in range(20))
    response = alice.client.post(reverse("experiment_new"), form(alice_world, search_yaml=many))
    assert "search_yaml" in response.context["form"].errors
    assert built == []
    assert not Experiment.objects.exists()

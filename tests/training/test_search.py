"""Optuna search: the spec's ranges are checked like axes (every problem at once), TPE converges on a
toy objective, the MedianPruner stops a trial whose held-out evaluations trail the completed ones,
and a search run again keeps its recorded trials."""

import io
import math

import pytest

from training.events import TrainResult
from training.experiment import ExperimentError, ExperimentSpec
from training.search import TrialRecord, search_should_prune
from training.sweep import format_search, run_search


@pytest.fixture
def base(make_config):
    return make_config(**{"eval.every": 1, "optim.steps": 4})


def toy_train(quality, calls):
    """A stand-in trainer: held-out team success climbs to quality(config) over the steps; it
    evaluates every step and stops when the sink asks, as `training.trainer.train` does."""
    def train(config, *, out_dir, sink, hooks=None):
        q = quality(config)
        total = config.optim.steps
        sink.run_started(total_steps=total, start_step=0)
        evaluations = []
        for step in range(total + 1):
            if step and sink.should_stop():
                calls.append((config.optim.lr, "stopped", step))
                return TrainResult(status="cancelled", step=step - 1, evaluations=evaluations)
            result = {"step": step, "split": "eval", "temperature": 0.0, "n": 8, "team": {"success": q * step / total}, "agents": {}}
            evaluations.append(result)
            sink.evaluation(result)
        calls.append((config.optim.lr, "done", total))
        return TrainResult(status="succeeded", step=total, evaluations=evaluations)
    return train


def test_it_converges_on_a_toy_objective(base, tmp_path):
    spec = ExperimentSpec.from_dict({"name": "toy", "seeds": [0], "search": {
        "trials": 30, "pruner": "none",
        "params": {"optim.lr": {"low": 1e-6, "high": 1e-1, "log": True}, "grpo.k": {"low": 2, "high": 8},
                   "grpo.loss_type": {"choices": ["grpo", "dapo", "dr_grpo"]}}}}, base=base)

    def quality(config):  # best at lr = 10^-3.5, k = 6, dapo
        return 1 - (math.log10(config.optim.lr) + 3.5) ** 2 / 25 - abs(config.grpo.k - 6) / 40 - (config.grpo.loss_type != "dapo") * 0.1

    calls: list = []
    records = run_search(spec, tmp_path, train=toy_train(quality, calls), stream=io.StringIO())
    assert len(records) == len(calls) == 30 and all(r.state == "complete" for r in records)
    best = max(records, key=lambda r: r.value)
    assert best.value > 0.9
    assert abs(math.log10(best.params["optim.lr"]) + 3.5) < 1.0 and best.params["grpo.loss_type"] == "dapo"
    first_ten = max(r.value for r in records[:10])
    assert best.value >= first_ten  # the sampler improves on its random start-up
    assert f"best trial: #{best.number} team.success {best.value:.3f}" in format_search(spec, records)


def test_the_median_pruner_stops_a_trailing_trial(base, tmp_path):
    spec = ExperimentSpec.from_dict({"name": "prune", "seeds": [0], "search": {
        "trials": 8, "startup_trials": 3, "params": {"optim.lr": {"low": 1e-5, "high": 1e-2, "log": True}}}}, base=base)
    calls: list = []
    records = run_search(spec, tmp_path, train=toy_train(lambda c: 1.0 if c.optim.lr > 3e-4 else 0.1, calls), stream=io.StringIO())
    pruned = [r for r in records if r.state == "pruned"]
    assert pruned, [(r.params, r.state) for r in records]
    stopped = [c for c in calls if c[1] == "stopped"]
    assert len(stopped) == len(pruned) and all(step < 4 for _, _, step in stopped)  # it did not train to the end
    assert all(r.params["optim.lr"] <= 3e-4 and max(r.intermediate) < 4 for r in pruned)
    assert all(r.number >= 3 for r in pruned)  # never before startup_trials trials completed


def test_the_pruner_compares_with_the_completed_trials_at_the_same_step(base):
    spec = ExperimentSpec.from_dict({"seeds": [0], "search": {
        "trials": 10, "startup_trials": 2, "params": {"optim.lr": {"low": 1e-5, "high": 1e-2, "log": True}}}}, base=base)
    done = [TrialRecord(number=i, params={"optim.lr": 1e-3}, state="complete", value=0.8, intermediate={1: 0.4, 2: 0.6})
            for i in range(3)]
    ask = dict(search=spec.search, direction="maximize", seed=0, records=done, params={"optim.lr": 1e-4})
    assert search_should_prune(**ask, intermediate={1: 0.1}) is True
    assert search_should_prune(**ask, intermediate={1: 0.5}) is False
    assert search_should_prune(**{**ask, "records": done[:1]}, intermediate={1: 0.1}) is False  # still starting up
    assert search_should_prune(**{**ask, "direction": "minimize"}, intermediate={1: 0.1}) is False


def test_a_search_run_again_keeps_its_trials(base, tmp_path):
    spec = ExperimentSpec.from_dict({"seeds": [0], "search": {"trials": 3, "pruner": "none",
                                                              "params": {"optim.lr": {"low": 1e-5, "high": 1e-2, "log": True}}}}, base=base)
    calls: list = []
    first = run_search(spec, tmp_path, train=toy_train(lambda c: c.optim.lr * 10, calls), stream=io.StringIO())
    again = run_search(spec, tmp_path, train=toy_train(lambda c: 0.0, calls), stream=io.StringIO())
    assert len(calls) == 3 and [r.params for r in again] == [r.params for r in first]


def test_it_reports_every_bad_range_at_once(base):
    with pytest.raises(ExperimentError) as info:
        ExperimentSpec.from_dict({"seeds": [0], "axes": {"optim.lr": [1e-4]}, "search": {
            "trials": 0, "pruner": "hyperband",
            "params": {"optim.lr": {"low": 0, "high": 1e-3, "log": True}, "grpo.k": {"low": 2.5, "high": 8},
                       "optim.nope": {"low": 1, "high": 2}, "grpo.loss_type": {"low": 1, "high": 2},
                       "grpo.eps_low": {"low": 0.1, "high": 3.0}, "grpo.sampling": {"choices": ["tree", "sideways"]}}}}, base=base)
    found = {(p.field, p.message) for p in info.value.problems}
    fields = {f for f, _ in found}
    assert {"search", "search.trials", "search.pruner", "search.params.optim.lr", "search.params.grpo.k", "search.params.optim.nope",
            "search.params.grpo.loss_type", "search.params.grpo.eps_low", "search.params.grpo.sampling"} <= fields
    messages = dict(found)
    assert "log-uniform range needs low above 0" in messages["search.params.optim.lr"]
    assert "must be integers" in messages["search.params.grpo.k"]
    assert "value 3.0 is refused: must be between 0 and 1" in messages["search.params.grpo.eps_low"]
    assert "'sideways' is refused" in messages["search.params.grpo.sampling"]
    assert "grid (axes) or a search" in messages["search"]

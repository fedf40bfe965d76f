"""Experiment specs: axes resolved against RunConfig's schema, every problem at once, expansion into
trials whose seed is the run's seed, and the mean ± 95 % interval over seeds."""

import math

import numpy as np
import pytest

from training.data import batch_indices
from training.experiment import (
    MAX_TRIALS,
    ExperimentError,
    ExperimentSpec,
    best_arm,
    mean_interval,
    resolve_field,
    summarize,
    trial_metrics,
)


@pytest.fixture
def base(make_config):
    return make_config(**{"eval.every": 1})


def problems(base, **spec):
    with pytest.raises(ExperimentError) as info:
        ExperimentSpec.from_dict(spec, base=base)
    return {(p.field, p.message) for p in info.value.problems}


def fields(found):
    return [f for f, _ in found]


def test_it_reports_every_bad_axis_at_once_each_next_to_its_field(base):
    found = problems(base, axes={
        "optim.nope": [1],                                # unknown field
        "optim.lr": [1e-4, 5.0],                          # a value the field refuses
        "grpo.loss_type": ["dapo", "sideways"],           # not in the closed set
        "grpo.k": [],                                     # an empty list
        "grpo": [1],                                      # a section, not a field
        "seed": [1, 2],                                   # seeds have their own list
    }, seeds=[0, 0, -1])
    by_field = dict(found)
    assert "unknown field 'nope'" in by_field["axes.optim.nope"] and "lr" in by_field["axes.optim.nope"]
    assert "value 5 (item 2) is refused: must be between 0 and 1" in by_field["axes.optim.lr"]
    assert "'sideways'" in by_field["axes.grpo.loss_type"] and "dapo" in by_field["axes.grpo.loss_type"]
    assert by_field["axes.grpo.k"] == "must be a non-empty list of values"
    assert "is a section" in by_field["axes.grpo"]
    assert "seeds" in by_field["axes.seed"]
    assert "listed twice" in by_field["seeds[1]"] and "not an integer" in by_field["seeds[2]"]


def test_it_refuses_ten_thousand_grid_points_without_building_them(base):
    found = problems(base, axes={"grpo.k": list(range(2, 52)), "optim.lr": [1e-4 * (i + 1) for i in range(50)],
                                          "lora.r": [1, 2, 4, 8]}, seeds=[0])
    assert fields(found) == ["axes"]
    assert "10,000 grid points x 1 seeds = 10,000 runs" in next(iter(found))[1]
    assert str(MAX_TRIALS) in next(iter(found))[1]


def test_it_counts_seeds_in_the_cap(base):
    found = problems(base, axes={"grpo.k": list(range(2, 34))}, seeds=list(range(10)))
    assert any("32 grid points x 10 seeds = 320 runs" in m for f, m in found if f == "axes")


def test_it_refuses_arms_whose_values_only_clash_together(base):
    # each value is fine on its own; delta must stay above 1 + eps_high, so (5.0, 2.0) is not a run
    found = problems(base, axes={"grpo.eps_high": [0.28, 5.0], "grpo.delta": [2.0]}, seeds=[0])
    assert fields(found) == ["axes"]
    assert "grpo.eps_high=5, grpo.delta=2" in next(iter(found))[1] and "grpo.delta" in next(iter(found))[1]


def test_it_refuses_an_unknown_metric_and_a_base_without_held_out_evaluation(make_config):
    found = dict(problems(make_config(), metric="writer.accuracy", direction="up", seeds=[0]))
    assert "writer.success" in found["metric"] and "team.success" in found["metric"]
    assert "maximize" in found["direction"]
    assert "eval.every" in found["base.eval.every"]
    assert "sampled.team.success" not in found["metric"]  # only a base that evaluates sampled reports it
    sampled = make_config().replace(**{"eval.every": 1, "eval.sampled": True})
    assert ExperimentSpec.from_dict({"metric": "sampled.writer.success", "seeds": [0]}, base=sampled).metric == "sampled.writer.success"


def test_it_resolves_list_items_and_mapping_keys_against_the_schema(make_config):
    config = make_config()
    assert resolve_field(config, "optim.lr") is float
    assert resolve_field(config, "topology.agents[1].temperature") is float
    with pytest.raises(Exception, match="has 2 items"):
        resolve_field(config, "topology.agents[5].temperature")
    with pytest.raises(Exception, match="name one key"):
        resolve_field(config, "topology.env_args")
    with pytest.raises(Exception, match="is a field, not a section"):
        resolve_field(config, "optim.lr.x")


def test_it_expands_arms_times_seeds_and_the_seed_is_the_runs_seed(base):
    spec = ExperimentSpec.from_dict({"name": "lr", "axes": {"optim.lr": [1e-3, "3e-3"], "topology.agents[1].temperature": [0.5]},
                                     "seeds": [0, 7]}, base=base)
    trials = spec.trials()
    assert len(trials) == 4
    assert [(t.config.optim.lr, t.seed, t.config.seed) for t in trials] == [(1e-3, 0, 0), (1e-3, 7, 7), (3e-3, 0, 0), (3e-3, 7, 7)]
    assert all(t.config.topology.agents[1].temperature == 0.5 for t in trials)
    assert trials[1].config.name == "lr [optim.lr=0.001, topology.agents[1].temperature=0.5] seed 7"
    # everything else is the base's; the seed changes the data order as a run's seed does
    assert trials[0].config.replace(**{"optim.lr": base.optim.lr, "topology.agents[1].temperature": None, "name": base.name}) == base
    assert batch_indices(16, 2, 1, trials[0].config.seed) != batch_indices(16, 2, 1, trials[1].config.seed)
    assert ExperimentSpec.from_yaml(spec.to_yaml()).trials() == trials


def test_it_computes_the_students_t_interval():
    got = mean_interval([1.0, 2.0, 3.0])
    assert got.mean == 2.0 and got.n == 3
    assert got.half_width == pytest.approx(4.303 * 1.0 / math.sqrt(3))
    values = list(np.linspace(0, 1, 50))
    wide = mean_interval(values)
    assert wide.half_width == pytest.approx(2.021 * np.std(values, ddof=1) / math.sqrt(50))  # df 49: the df-40 value
    assert mean_interval([0.5]).half_width is None and mean_interval([]) is None


def test_it_summarises_arms_and_picks_the_best_in_the_metrics_direction():
    evals = lambda team, step=3: [{"step": 0, "temperature": 0.0, "team": {"success": 0.0}, "agents": {}},  # noqa: E731
                                  {"step": step, "temperature": 1.0, "team": {"success": 0.99}, "agents": {}},
                                  {"step": step, "temperature": 0.0, "team": {"success": team}, "agents": {"a": {"success": team, "reward": 1.0}}}]
    # the last greedy one, and the sampled one at its step (a sampled row of an earlier step is not the trial's)
    assert trial_metrics(evals(0.25)) == {"team.success": 0.25, "a.success": 0.25, "a.reward": 1.0, "sampled.team.success": 0.99}
    assert "sampled.team.success" not in trial_metrics(evals(0.25)[:1] + [{**evals(0.25)[1], "step": 2}] + evals(0.25)[2:])
    assert trial_metrics([{}, {"step": 1, "team": {}}, {"team": {"success": "high"}}]) == {}  # rows of another shape
    low, high = (("optim.lr", 1e-4),), (("optim.lr", 1e-3),)
    results = [(low, 0, trial_metrics(evals(0.2))), (low, 1, trial_metrics(evals(0.4))), (high, 0, trial_metrics(evals(0.5))),
               (high, 1, {})]
    arms = summarize([low, high], results)
    assert arms[0].metrics["team.success"].mean == pytest.approx(0.3) and arms[1].metrics["team.success"].n == 1
    assert best_arm(arms, "team.success", "maximize").arm == high
    assert best_arm(arms, "team.success", "minimize").arm == low
    tied = summarize([low, high], [(low, 0, trial_metrics(evals(0.5))), (high, 0, trial_metrics(evals(0.5)))])
    assert best_arm(tied, "team.success", "maximize") is None  # an exact tie: no arm is starred


def test_every_example_experiment_loads():
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "configs" / "experiments"
    specs = {p.name: ExperimentSpec.load(p) for p in sorted(folder.glob("*.yaml"))}
    assert len(specs["tiny-lr.yaml"].trials()) == 6
    assert specs["tiny-search.yaml"].search.trials == 6 and specs["tiny-search.yaml"].trials() == []
    lone, *teams = [t.config.topology for t in specs["tiny-specialization.yaml"].trials() if t.seed == 0]
    assert [a.name for a in lone.agents] == ["tool"] and [[a.name for a in t.agents] for t in teams] == [["tool", "reasoner"]] * 2


def test_the_specialization_is_an_axis_of_a_team_single_being_its_first_agent_alone(base):
    spec = ExperimentSpec.from_dict({"axes": {"topology.specialization": ["single", "prompt", "lora"],
                                              "topology.agents[0].temperature": [0.5]}, "seeds": [0, 1]}, base=base)
    by_arm = {dict(t.arm)["topology.specialization"]: t.config for t in spec.trials() if t.seed == 1}
    single = by_arm["single"].topology
    assert [a.name for a in single.agents] == ["writer"] and single.turn_order == ("writer",)
    assert single.agents[0].temperature == 0.5 and single.agents[0].role == "writer"  # the other axis still applies
    for team in ("prompt", "lora"):
        assert [a.name for a in by_arm[team].topology.agents] == ["writer", "echo"]
        assert by_arm[team].topology.specialization == team and by_arm[team].seed == 1
    assert len(spec.trials()) == 6


def test_an_agents_axis_is_labelled_by_what_tells_its_arms_apart():
    """An arm of a `topology.agents` axis holds validated agents, every field filled in; its label
    shows each agent's name and only the fields in which the arms differ, in the agents' own order,
    so the frozen one stands out; a lone arm shows the fields it sets."""
    from pathlib import Path

    from training.experiment import arm_label

    spec = ExperimentSpec.load(Path(__file__).resolve().parents[2] / "configs" / "experiments" / "referential-apart.yaml")
    labels = [t.config.name for t in spec.trials() if t.seed == 0]
    assert labels == [
        "referential-apart [topology.agents=[{name: speaker, trainable: true}, {name: listener, trainable: false}]] seed 0",
        "referential-apart [topology.agents=[{name: speaker, trainable: false}, {name: listener, trainable: true}]] seed 0",
    ]
    arms = spec.arms()
    assert arm_label(arms[0]) == ("topology.agents=[{name: speaker, role: speaker, trainable: true}, "
                                  "{name: listener, role: listener, trainable: false}]")
    long = [({"name": "tool", "role": "tool", "instructions": "Write one ```python block.", "tools": ["python"], "trainable": t},
             {"name": "reasoner", "role": "reasoner", "instructions": "Answer.", "temperature": temp}) for t, temp in ((True, 0.5), (False, 0.5), (False, 1.0))]
    among = [(("topology.agents", agents), ("optim.lr", 1e-4)) for agents in long]
    assert [arm_label(a, among) for a in among] == [
        "topology.agents=[{name: tool, trainable: true}, {name: reasoner, temperature: 0.5}], optim.lr=0.0001",
        "topology.agents=[{name: tool, trainable: false}, {name: reasoner, temperature: 0.5}], optim.lr=0.0001",
        "topology.agents=[{name: tool, trainable: false}, {name: reasoner, temperature: 1.0}], optim.lr=0.0001",
    ]

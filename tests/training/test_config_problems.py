"""RunConfig finds every problem in one pass: each unknown key and each value that does not parse
with its own field, the checks of every other field beside them, one problem per field, and no
echo of a field at fault in the checks that read it. A config validates once."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from training.config import ConfigError, ConfigProblems, RunConfig, set_field

BASE = {
    "name": "t",
    "model": {"source": "tiny-random:llama"},
    "topology": {"environment": "math_tool", "specialization": "lora",
                 "agents": [{"name": "tool", "role": "tool"}, {"name": "reasoner", "role": "reasoner"}]},
}


def tree(**sections):
    data = yaml.safe_load(yaml.safe_dump(BASE))
    for dotted, value in sections.items():
        set_field(data, dotted.replace("__", "."), value)
    return data


def problems_of(data) -> dict[str, str]:
    with pytest.raises(ConfigError) as caught:
        RunConfig.from_dict(data)
    return {p.field: p.message for p in caught.value.problems}


def test_it_names_every_unknown_key_at_once():
    data = tree()
    data["grpo"] = {"kk": 1, "alpah": 0.5, "k": 3}
    data["optimizer"] = {"lr": 1}
    data["topology"]["agents"][1]["temprature"] = 0.3
    found = problems_of(data)
    assert set(found) == {"grpo.kk", "grpo.alpah", "optimizer", "topology.agents[1].temprature"}
    assert all(m.startswith("unknown field; allowed: ") for m in found.values())


def test_fields_that_do_not_parse_leave_the_checks_of_the_others_standing():
    found = problems_of(tree(optim__steps="many", grpo__k=1, grpo__loss_type="ppo", generation__top_p=7,
                             topology__agents=[{"name": "tool", "role": "tool", "trainable": "maybe"}, {"name": "9x", "role": "r"}]))
    assert found.keys() == {"optim.steps", "grpo.k", "grpo.loss_type", "generation.top_p", "topology.agents[0].trainable",
                            "topology.agents[1].name"}
    assert found["optim.steps"] == "expected an integer, got 'many'"
    assert found["grpo.k"].startswith("must be at least 2")  # the first failing check of a field; not also "between 2 and 256"


def test_a_missing_required_field_keeps_the_other_agents_in_place():
    found = problems_of(tree(topology__agents=[{"name": "tool"}, {"name": "reasoner", "role": "r", "temperature": -1}]))
    assert found == {"topology.agents[0].role": "is required", "topology.agents[1].temperature": "must be >= 0"}


@pytest.mark.parametrize(("change", "at_fault", "echo"), [
    ({"resources__gpus": 65, "optim__tasks_per_step": 4}, "resources.gpus", "optim.tasks_per_step"),
    ({"topology__specialization": "magic", "model__quantization": "4bit"}, "topology.specialization", "model.quantization"),
    ({"topology__specialization": "magic", "resources__parallel": "agents"}, "topology.specialization", "resources.parallel"),
    ({"grpo__eps_high": 50.0, "grpo__delta": 2.0}, "grpo.eps_high", "grpo.delta"),
    ({"generation__max_new_tokens": 0, "grpo__overlong_cache": 8}, "generation.max_new_tokens", "grpo.overlong_cache"),
    ({"model__source": "gpt-17", "topology__agents": [{"name": "a", "role": "tool", "model": "tiny-random:llama"}]},
     "model.source", "topology.agents[0].model"),
])
def test_a_check_across_fields_does_not_echo_a_field_at_fault(change, at_fault, echo):
    found = problems_of(tree(**change))
    assert at_fault in found and echo not in found, found


def test_the_error_keeps_the_first_problem_and_lists_them_all():
    with pytest.raises(ConfigProblems) as caught:
        RunConfig.from_dict(tree(grpo__k=1, optim__lr=-1))
    error = caught.value
    assert (error.field, [p.field for p in error.problems], [p.field for p in error.others]) == ("grpo.k", ["grpo.k", "optim.lr"], ["optim.lr"])
    assert str(error).startswith("grpo.k: must be at least 2") and "; optim.lr: must be positive" in str(error)
    with pytest.raises(ConfigError) as single:  # one problem: the plain error, as before
        RunConfig.from_dict(tree(grpo__k=1))
    assert type(single.value) is ConfigError and single.value.problems == [single.value]


def test_build_returns_the_config_and_its_problems_without_raising():
    config, problems = RunConfig.build(tree(grpo__k="three", optim__lr=0.5))
    assert config.optim.lr == 0.5 and config.grpo.k == RunConfig().grpo.k  # the field at fault keeps its default
    assert [p.field for p in problems] == ["grpo.k"]
    assert RunConfig.build(["not", "a", "mapping"])[1][0].field == "config"


def test_a_config_is_validated_once(monkeypatch):
    config = RunConfig.from_dict(tree())
    passes = []
    real = RunConfig.problems
    monkeypatch.setattr(RunConfig, "problems", lambda self: passes.append(1) or real(self))
    config.validate()
    config.validate()
    assert passes == []  # the instance passed when it was built, and it is frozen
    RunConfig(**{f: getattr(config, f) for f in ("name", "model", "topology")}).validate()
    assert passes == [1]  # a new instance is checked


scalars = st.none() | st.booleans() | st.integers(-10, 10**6) | st.floats(allow_nan=False) | st.text(max_size=12)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
                      max_leaves=20)
FIELDS = ["grpo.k", "grpo.alpha", "optim.lr", "optim.steps", "topology.agents", "topology.turn_order", "topology.max_turns",
          "topology.specialization", "generation", "data.reward_fns", "report_to.trackers", "lora", "seed", "nonsense"]


@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(FIELDS), values, max_size=5))
def test_any_tree_gives_problems_never_a_crash(changes):
    data = tree()
    for dotted, value in changes.items():
        set_field(data, dotted, value)
    config, problems = RunConfig.build(data)
    assert len({p.field for p in problems}) == len(problems)  # one per field
    if not problems:
        assert RunConfig.from_dict(data) == config


def test_the_cli_prints_every_problem_on_its_own_line(capsys):
    from tests.training.conftest import TINY_LORA
    from training.__main__ import main

    assert main(["check", str(TINY_LORA), "--set", "grpo.k=1", "--set", "optim.lr=-1", "--set", "grpo.kk=2"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(":")[1].strip() for line in lines] == ["grpo.kk", "grpo.k", "optim.lr"]
    assert all(line.startswith("config error: ") for line in lines)

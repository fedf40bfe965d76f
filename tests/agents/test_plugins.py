"""Loading environments and reward functions named by dotted paths (registered ones only:
tests/conftest.py registers this suite's plugins as an operator would)."""

from __future__ import annotations

import pytest

from agents.base import Environment
from agents.envs import load_environment
from agents.plugins import PluginError
from agents.verifiers import load_reward_fn, numeric_answer

PLUGIN = "tests.agents.example_plugin"


def test_it_loads_a_plugin_environment_with_args() -> None:
    env = load_environment(f"{PLUGIN}:EchoEnv", times=2)
    assert isinstance(env, Environment) and env.name == "echo"
    row = env.generate(1, seed=3)[0]
    state = env.reset(row, task_id="t", roles=("speaker",))
    assert env.step(state, agent="a", role="speaker", action=f"{row['word']} {row['word']}").team_reward == 1.0


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("no_such_env", "unknown environment 'no_such_env'; built-ins are arithmetic"),
        ("tests.agents.nope:Env", "'tests.agents.nope:Env' is not a registered plugin; .* TROUPE_ENVIRONMENTS"),
        (f"{PLUGIN}:Missing", "is not a registered plugin"),
        (f"{PLUGIN}:NotAnEnv", "lacks roles, required_fields, generate, reset, observe, step"),
        ("tests.agents.example_plugin", "unknown environment"),
        ("bad path:Env", "not a plugin path"),
    ],
)
def test_it_explains_why_an_environment_does_not_load(path: str, message: str) -> None:
    with pytest.raises(PluginError, match=message):
        load_environment(path)


def test_it_refuses_a_registered_object_that_is_not_a_class(plugin_registry) -> None:
    plugin_registry.register(f"{PLUGIN}:NOT_CALLABLE", kind=plugin_registry.ENVIRONMENT)
    with pytest.raises(PluginError, match="is a int, not a class or factory"):
        load_environment(f"{PLUGIN}:NOT_CALLABLE")


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("tests.agents.nope:Env", "no module named 'tests.agents.nope'"),
        (f"{PLUGIN}:Missing", "has no attribute 'Missing'; it defines: .*EchoEnv"),
        ("bad path:Env", "not a plugin path"),
    ],
)
def test_it_explains_why_the_operator_cannot_register_a_path(plugin_registry, path: str, message: str) -> None:
    with pytest.raises(PluginError, match=message):
        plugin_registry.register(path, kind=plugin_registry.ENVIRONMENT)


def test_it_names_unknown_environment_args() -> None:
    with pytest.raises(PluginError, match="does not accept 'lvl'; its arguments are: level, timeout_s"):
        load_environment("math_tool", lvl=2)
    with pytest.raises(PluginError, match="does not accept 'speed'"):
        load_environment(f"{PLUGIN}:EchoEnv", speed=2)


def test_it_loads_a_plugin_reward_function() -> None:
    fn = load_reward_fn(f"{PLUGIN}:length_reward")
    assert fn(prompts=["p", "p"], completions=["a", "a b c"]) == [0.5, 0.25]
    assert load_reward_fn("agents.verifiers:numeric_answer") is numeric_answer


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("no_such_pkg.rewards:fn", "is not a registered plugin; .* TROUPE_REWARD_FUNCTIONS"),
        (f"{PLUGIN}:nope", "is not a registered plugin"),
        (f"{PLUGIN}:needs_a_label", r"must accept \(prompts, completions, \*\*columns\)"),
        ("numeric_answer", "not a plugin path"),
    ],
)
def test_it_explains_why_a_reward_function_does_not_load(path: str, message: str) -> None:
    with pytest.raises(PluginError, match=message):
        load_reward_fn(path)


def test_it_refuses_a_registered_reward_that_is_not_callable(plugin_registry) -> None:
    plugin_registry.register(f"{PLUGIN}:NOT_CALLABLE", kind=plugin_registry.REWARD_FUNCTION)
    with pytest.raises(PluginError, match="is a int, not a callable"):
        load_reward_fn(f"{PLUGIN}:NOT_CALLABLE")

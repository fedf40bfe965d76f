"""Suite-wide setup: the test plugins are registered as an operator would register them.

Plugins are only ever loaded from the operator's list (see `agents.plugins`), so the suite
registers its own here, in this process and, through the environment variables, in every worker
or torchrun rank a test starts. `tests/agents/unregistered_plugin.py` is deliberately left out:
the trust-boundary tests name it to prove that an unregistered path is never imported.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from agents import plugins

TEST_PLUGINS = {
    plugins.ENVIRONMENT: [
        "tests.agents.example_plugin:EchoEnv",
        "tests.agents.example_plugin:NotAnEnv",
        "tests.training.toy_env:LetterEnv",
        "tests.faults.plugins:BrokenEnv",
        "tests.faults.plugins:ExitingEnv",
        "tests.faults.plugins:ExitOnInit",
    ],
    plugins.REWARD_FUNCTION: [
        "tests.agents.example_plugin:length_reward",
        "tests.agents.example_plugin:needs_a_label",
        "tests.faults.plugins:exploding_reward",
        "tests.faults.plugins:interrupting_reward",
    ],
}

for _kind, _paths in TEST_PLUGINS.items():
    _var = plugins.ENV_VARS[_kind]
    _listed = [p for p in os.environ.get(_var, "").split(",") if p]
    os.environ[_var] = ",".join(dict.fromkeys([*_listed, *_paths]))
    for _path in _paths:
        plugins.register(_path, kind=_kind)


@pytest.fixture
def plugin_registry() -> Iterator[object]:
    """`agents.plugins`, for a test that registers or unregisters plugins; restored afterwards."""
    saved = dict(plugins._registered), dict(plugins._problems)
    yield plugins
    plugins._registered.clear()
    plugins._registered.update(saved[0])
    plugins._problems.clear()
    plugins._problems.update(saved[1])

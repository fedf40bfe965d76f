"""Plugins that fail on purpose, loaded by dotted path from run configs in the fault tests."""

from __future__ import annotations

from typing import Any

from agents.base import State, StepResult


def exploding_reward(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float]:
    """A TRL-style reward function with a bug."""
    raise ValueError("reward plugin exploded")


class BrokenEnv:
    """Plays math_tool's roles, then fails on the first action (a plugin environment with a bug)."""

    name = "broken"
    roles: tuple[str, ...] = ("tool", "reasoner")
    required_fields: tuple[str, ...] = ("question",)

    def __init__(self, level: int = 1) -> None:
        self.level = level

    def generate(self, n: int, *, seed: int) -> list[dict[str, Any]]:
        return [{"question": f"{seed}+{i}?", "answer": str(seed + i)} for i in range(n)]

    def reset(self, row: dict[str, Any], *, task_id: str, roles: tuple[str, ...]) -> State:
        return State(task_id=task_id, row=row)

    def observe(self, state: State, role: str) -> str:
        return f"{role}: {state.row['question']}"

    def step(self, state: State, *, agent: str, role: str, action: str) -> StepResult:
        raise RuntimeError("environment exploded")

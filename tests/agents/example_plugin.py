"""A tiny plugin environment and reward function, loaded by dotted path in test_plugins.py."""

from __future__ import annotations

import dataclasses
from typing import Any

from agents.base import Message, State, StepResult


class EchoEnv:
    """The agent must repeat a word; `times` makes it repeat it several times."""

    name = "echo"
    roles: tuple[str, ...] = ("speaker",)
    required_fields: tuple[str, ...] = ("word",)

    def __init__(self, times: int = 1) -> None:
        self.times = times

    def generate(self, n: int, *, seed: int) -> list[dict[str, Any]]:
        return [{"word": f"w{seed}-{i}"} for i in range(n)]

    def reset(self, row: dict[str, Any], *, task_id: str, roles: tuple[str, ...]) -> State:
        return State(task_id=task_id, row=row)

    def observe(self, state: State, role: str) -> str:
        return f"Say {state.row['word']} {self.times} time(s)."

    def step(self, state: State, *, agent: str, role: str, action: str) -> StepResult:
        ok = action.split() == [state.row["word"]] * self.times
        nxt = dataclasses.replace(state, turn=state.turn + 1, dialogue=(*state.dialogue, Message(agent, role, action)), done=True, success=ok)
        return StepResult(nxt, local_reward=float(ok), team_reward=float(ok))


def length_reward(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float]:
    """Shorter is better: 1 / (1 + words)."""
    return [1.0 / (1 + len(str(c).split())) for c in completions]


def needs_a_label(label: str) -> list[float]:
    return [0.0]


NOT_CALLABLE = 42


class NotAnEnv:
    name = "half"

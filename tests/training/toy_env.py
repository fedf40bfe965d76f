"""A toy plugin environment for engine tests: agents are rewarded for writing the letter 'a'.

The reward is dense (the share of 'a' characters in the action), so even a tiny random model
shows learning within a few steps. Two roles let it exercise multi-agent paths.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from agents.base import Message, State, StepResult


class LetterEnv:
    name = "letters"
    roles = ("writer", "echo")
    required_fields = ("question",)
    default_instructions = {"writer": "Write the letter a many times.", "echo": "Repeat what you read."}

    def __init__(self, letter: str = "a"):
        self.letter = letter

    def generate(self, n: int, *, seed: int) -> list[dict[str, Any]]:
        return [{"question": f"Task {seed}-{i}: write {self.letter}."} for i in range(n)]

    def reset(self, row: dict[str, Any], *, task_id: str, roles: tuple[str, ...]) -> State:
        return State(task_id=task_id, row=row, data={"roles": roles})

    def observe(self, state: State, role: str) -> str:
        said = " | ".join(m.text for m in state.dialogue)
        return f"{state.row['question']} So far: {said}"

    def step(self, state: State, *, agent: str, role: str, action: str) -> StepResult:
        share = action.count(self.letter) / max(len(action), 1)
        turn = state.turn + 1
        done = turn >= len(state.data["roles"])
        new = dataclasses.replace(
            state, turn=turn, dialogue=state.dialogue + (Message(agent, role, action),), done=done, success=share > 0.5
        )
        return StepResult(state=new, local_reward=share, team_reward=share)


def completion_length(prompts: list[Any], completions: list[str], **columns: Any) -> list[float]:
    """A dense reward plugin (`DENSE_REWARD` in conftest): every group has a signal, so every step
    updates every agent."""
    return [len(c) / 50 for c in completions]

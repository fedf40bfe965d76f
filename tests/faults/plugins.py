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


class ExitingEnv(BrokenEnv):
    """Calls `sys.exit` on the first action, as a careless plugin might: it must fail the run, not the worker."""

    name = "exiting"

    def step(self, state: State, *, agent: str, role: str, action: str) -> StepResult:
        raise SystemExit("environment called sys.exit")


def interrupting_reward(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float]:
    """A reward function that raises KeyboardInterrupt (which `except Exception` does not catch)."""
    raise KeyboardInterrupt("reward function interrupted")


class ExitOnInit(BrokenEnv):
    """Exits while it is being constructed (a web request builds environments for previews and forms)."""

    name = "exit-on-init"

    def __init__(self, level: int = 1) -> None:
        raise SystemExit(3)

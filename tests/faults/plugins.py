"""Plugins that fail on purpose, loaded by dotted path from run configs in the fault tests."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from agents.base import State, StepResult
from agents.envs.math_tool import MathTool


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


GATE_VAR = "TROUPE_TEST_GATE"
"""A file path: `gated_reward` holds a process's second task until the file exists."""
GATE_WAIT_S = 300.0
"""How long a held process waits at most (a test that never opens the gate must not hang a run)."""
_questions_seen: set[str] = set()


def gated_reward(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float | None]:
    """Scores nothing (None: does not apply). Its work is to hold the run at a known point: the
    first time this process scores a second task (a rank's second step; its first step's checkpoint
    is saved by then) it waits for the file named by $TROUPE_TEST_GATE. A test can so kill a host
    while the run is certainly mid-run, however fast the machine, then open the gate for the resume."""
    _hold_at_the_second_task(_questions_seen, "", columns)
    return [None] * len(completions)


def _hold_at_the_second_task(seen: set[str], suffix: str, columns: dict[str, Any]) -> None:
    """Note the tasks' questions in `seen`; from the second one on, wait for the gate file
    $TROUPE_TEST_GATE + `suffix` (at most GATE_WAIT_S)."""
    gate = os.environ.get(GATE_VAR)
    seen.update(str(q) for q in columns.get("question", []))
    if gate and len(seen) >= 2:
        deadline = time.monotonic() + GATE_WAIT_S
        while not Path(gate + suffix).exists() and time.monotonic() < deadline:
            time.sleep(0.2)


_cancel_questions_seen: set[str] = set()


def cancel_gated_reward(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float | None]:
    """`gated_reward` with a gate of its own, the file $TROUPE_TEST_GATE + "-cancel": it holds a
    run in its second step until a test has asked the run to stop, so the stop comes mid-run
    however fast the machine (the first gate, once opened, stays open for the module's runs)."""
    _hold_at_the_second_task(_cancel_questions_seen, "-cancel", columns)
    return [None] * len(completions)


class ExitOnInit(BrokenEnv):
    """Exits while it is being constructed (a web request builds environments for previews and forms)."""

    name = "exit-on-init"

    def __init__(self, level: int = 1) -> None:
        raise SystemExit(3)


HOLD_STEP_VAR = "TROUPE_TEST_HOLD_STEP"
"""The training step at whose start `HeldMathTool` holds a run (default 2)."""


class HeldMathTool(MathTool):
    """`math_tool`, except that a run holds at the start of its training step $TROUPE_TEST_HOLD_STEP
    (each episode's `reset` of that step or a later one waits) until the file $TROUPE_TEST_GATE +
    "-step" exists (at most GATE_WAIT_S). The steps before it are written by then: a test sees the
    run certainly mid-way, its first steps on the page and the rest to come, however fast the
    machine, and opens the gate to let it finish."""

    def reset(self, row: dict[str, Any], *, task_id: str, roles: tuple[str, ...]) -> State:
        gate, hold_at = os.environ.get(GATE_VAR), int(os.environ.get(HOLD_STEP_VAR) or 2)
        if gate and "@" in task_id and _draw_step(task_id) >= hold_at:  # a training episode (`3@7`, `3@7+1`, `3@7#2`)
            deadline = time.monotonic() + GATE_WAIT_S
            while not Path(gate + "-step").exists() and time.monotonic() < deadline:
                time.sleep(0.2)
        return super().reset(row, task_id=task_id, roles=roles)


def _draw_step(task_id: str) -> int:
    """The step of a training episode's id (`training.collect.episode_ids`: the draw after the last `@`)."""
    draw = task_id.rsplit("@", 1)[1]
    return int(draw.split("+", 1)[0].split("#", 1)[0])

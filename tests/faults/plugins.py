"""Plugins that fail on purpose, loaded by dotted path from run configs in the fault tests."""

from __future__ import annotations

import os
import time
from pathlib import Path
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

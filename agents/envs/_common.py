"""Small helpers the built-in environments share: cached sandbox runs, state updates, text trimming."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from agents.base import Message, State
from agents.sandbox import SandboxResult, run_python
from agents.verifiers import TestReport, run_unit_tests

TOOL_TIMEOUT_S = 3.0
"""Wall-clock limit for model-written code in the built-in environments."""
MAX_TOOL_TIMEOUT_S = 30.0
"""The most a config may raise that limit to (`env_args.timeout_s`): one program, not a worker's hour."""


def tool_timeout(env: str, timeout_s: Any) -> float:
    """A config's `timeout_s` for model-written code, checked: a number in (0, MAX_TOOL_TIMEOUT_S]."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s <= MAX_TOOL_TIMEOUT_S:
        raise ValueError(f"{env}: timeout_s must be a number of seconds above 0 and at most {MAX_TOOL_TIMEOUT_S:g}, not {timeout_s!r}")
    return float(timeout_s)

STOP_AFTER_CODE_BLOCK = r"```(?:python|py)?[ \t]*\n.*?```"
"""A `stop_patterns` entry: the action is complete once a code block is closed."""
STOP_AFTER_ANSWER_LINE = r"Answer:[ \t]*-?\d[\d,]*(?:\.\d+)?[ \t]*\n"
"""A `stop_patterns` entry: the action is complete once an `Answer: <number>` line is written."""


@lru_cache(maxsize=4096)
def run_cached(code: str, timeout_s: float = TOOL_TIMEOUT_S) -> SandboxResult:
    """`run_python`, memoised: tree sampling scores K candidates from one state, often with the
    same code, and a step must give the same result every time it is called with the same input."""
    return run_python(code, timeout_s=timeout_s)


@lru_cache(maxsize=4096)
def tests_cached(code: str, tests: str, timeout_s: float = TOOL_TIMEOUT_S) -> TestReport:
    """`run_unit_tests`, memoised for the same reasons as `run_cached`."""
    return run_unit_tests(code, tests, timeout_s=timeout_s)


def check_turn(env_name: str, roles_here: Sequence[str], state: State, role: str) -> None:
    """Raise ValueError when `role` cannot act on `state`."""
    if role not in roles_here:
        raise ValueError(f"{env_name} has no role {role!r}; its roles are {', '.join(roles_here)}")
    if state.done:
        raise ValueError(f"episode {state.task_id} is over; reset before stepping again")


def check_roles(env_name: str, roles_here: Sequence[str], roles: Sequence[str]) -> tuple[str, ...]:
    unknown = [r for r in roles if r not in roles_here]
    if unknown or not roles:
        raise ValueError(f"{env_name} roles are {', '.join(roles_here)}; got {', '.join(roles) or 'none'}")
    return tuple(dict.fromkeys(roles))


def advance(state: State, message: Message, *, done: bool, success: bool, **data: Any) -> State:
    """The next state: one more turn, `message` appended, `data` merged (a new dict; the old one is untouched)."""
    return dataclasses.replace(
        state,
        turn=state.turn + 1,
        dialogue=(*state.dialogue, message),
        done=done,
        success=success,
        data={**state.data, **data},
    )


def clip(text: str, max_chars: int = 600, *, keep: str = "tail") -> str:
    """Shorten `text` for an observation, keeping its start or its end."""
    text = text.strip()
    if len(text) <= max_chars:
        return text
    if keep == "head":
        return text[:max_chars].rstrip() + "\n..."
    return "...\n" + text[-max_chars:].lstrip()


def describe_run(result: SandboxResult, *, max_chars: int = 400) -> str:
    """What a program run produced, as the agents see it."""
    if result.error == "timeout":
        return f"error: the program timed out\n{clip(result.stdout, max_chars // 2)}".strip()
    if not result.ok:
        detail = result.stderr.strip() or result.error or f"exit code {result.exit_code}"
        return "error: " + clip(detail, max_chars)
    return clip(result.stdout, max_chars) if result.stdout.strip() else "(it ran without errors and printed nothing)"

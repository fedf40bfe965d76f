"""`arithmetic`: one solver answers an arithmetic question. The single-agent baseline (L0)."""

from __future__ import annotations

import random
from typing import Any

from agents.base import Message, RowField, State, StepResult, required_of
from agents.envs._common import STOP_AFTER_ANSWER_LINE, advance, check_roles, check_turn
from agents.parsing import answer_number, normalize_number, numbers_equal


class Arithmetic:
    """One solver answers an arithmetic question; reward 1 when the answer is right."""

    name = "arithmetic"
    roles: tuple[str, ...] = ("solver",)
    solo_roles: tuple[str, ...] = ("solver",)
    row_fields: dict[str, RowField] = {
        "question": RowField("text", help="the question the solver sees"),
        "answer": RowField("number", help='the right answer: a number, or text holding one ("42", "-3.5", "1,234", "3/4")'),
        "level": RowField("int", required=False, help="the generator's level (kept as metadata)"),
    }
    """What a dataset row holds (checked on upload; see `agents.base.RowField`)."""
    required_fields: tuple[str, ...] = required_of(row_fields)
    default_instructions: dict[str, str] = {
        "solver": (
            "You solve arithmetic problems. Work it out briefly, then write the final answer "
            "on its own line as: Answer: <number>"
        ),
    }

    stop_patterns: dict[str, str] = {"solver": STOP_AFTER_ANSWER_LINE}
    """End the action once the answer line is written (see `agents.envs`)."""

    def __init__(self, level: int = 1) -> None:
        """`level` 1: a + b or a - b with two-digit numbers; 2: a * b or (a + b) * c; 3: three
        operations; 4: products of three-digit numbers, hard by hand and easy for a solver with
        the `calculator` or `python` tool (`agents.tools`)."""
        if level not in (1, 2, 3, 4):
            raise ValueError(f"arithmetic: level must be 1, 2, 3 or 4, not {level!r}")
        self.level = level

    def generate(self, n: int, *, seed: int) -> list[dict[str, Any]]:
        rng = random.Random(seed)
        return [self._task(rng) for _ in range(n)]

    def _task(self, rng: random.Random) -> dict[str, Any]:
        if self.level == 1:
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            expr = f"{max(a, b)} - {min(a, b)}" if rng.random() < 0.5 else f"{a} + {b}"
        elif self.level == 2:
            a, b, c = rng.randint(2, 19), rng.randint(2, 12), rng.randint(2, 9)
            expr = f"{a} * {b}" if rng.random() < 0.5 else f"({a} + {b}) * {c}"
        elif self.level == 3:
            a, b, c, d = rng.randint(2, 20), rng.randint(2, 9), rng.randint(2, 9), rng.randint(1, 30)
            expr = rng.choice([f"{a} + {b} * {c} - {d}", f"({a} - {b}) * {c} + {d}", f"{a} * {b} + {c} * {d}"])
        else:
            a, b, c = rng.randint(101, 999), rng.randint(11, 99), rng.randint(100, 999)
            expr = rng.choice([f"{a} * {b}", f"{a} * {b} + {c}", f"{a} * {b} - {c}"])
        value = eval(expr, {"__builtins__": {}})  # noqa: S307 - our own generated arithmetic
        return {"question": f"What is {expr}?", "answer": str(value), "level": self.level}

    def reset(self, row: dict[str, Any], *, task_id: str, roles: tuple[str, ...]) -> State:
        check_roles(self.name, self.roles, roles)
        return State(task_id=task_id, row=dict(row))

    def observe(self, state: State, role: str) -> str:
        return f"{state.row['question']}\nEnd with: Answer: <number>"

    def step(self, state: State, *, agent: str, role: str, action: str) -> StepResult:
        check_turn(self.name, self.roles, state, role)
        got = answer_number(action)
        right = numbers_equal(got, normalize_number(str(state.row["answer"])))
        reward = 1.0 if right else 0.0
        next_state = advance(state, Message(agent, role, action), done=True, success=right, answer=got)
        return StepResult(next_state, local_reward=reward, team_reward=reward, info={"answer": got, "correct": right})

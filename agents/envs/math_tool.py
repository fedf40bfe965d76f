"""`math_tool`: a tool agent writes Python that prints the answer; a reasoner checks it and answers.

Rewards (local, for the agent that acted):
- tool: +1 when its program prints the right number, 0 when it runs but prints something
  else, -1 on an error, a timeout, or no ```python block.
- reasoner: +1 right answer, 0 wrong, -0.5 when no answer can be read.
Team reward after every step: 1.0 when the team's current answer is right (the latest
reasoner answer; with no reasoner in the team, the latest tool output), else 0.0.
The episode ends when the reasoner has answered and agrees with the latest tool output, or
after the first action when the team has a single role (with `self_correct`, a lone agent goes on
until it gives the same answer twice in a row). `success` = the team answer is right.
"""

from __future__ import annotations

import random
from typing import Any

from agents.base import Message, RowField, State, StepResult, required_of
from agents.envs._common import (
    STOP_AFTER_ANSWER_LINE,
    STOP_AFTER_CODE_BLOCK,
    TOOL_TIMEOUT_S,
    advance,
    check_roles,
    check_turn,
    clip,
    describe_run,
    run_cached,
    tool_timeout,
)
from agents.parsing import Number, answer_number, extract_code, normalize_number, numbers_equal

_NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jia", "Kofi", "Lena", "Mo", "Nina", "Omar", "Pia"]
_ITEMS = ["apples", "stickers", "marbles", "cookies", "pencils", "cards", "shells", "stamps"]


def _word_problem(rng: random.Random) -> tuple[str, int]:
    name, items = rng.choice(_NAMES), rng.choice(_ITEMS)
    kind = rng.randrange(8)
    if kind == 0:
        a, b, c = rng.randint(5, 30), rng.randint(2, 6), rng.randint(3, 12)
        return (f"{name} has {a} {items}. {name} buys {b} packs with {c} {items} in each pack. "
                f"How many {items} does {name} have now?", a + b * c)
    if kind == 1:
        a, b = rng.randint(4, 12), rng.randint(3, 9)
        c = rng.randint(1, a * b - 1)
        return (f"A box holds {a} {items}. {name} fills {b} boxes and then gives away {c} {items}. "
                f"How many {items} does {name} have left?", a * b - c)
    if kind == 2:
        a, b, c = rng.randint(5, 25), rng.randint(2, 9), rng.randint(3, 40)
        return (f"{name} reads {a} pages a day for {b} days, then reads {c} more pages. "
                f"How many pages does {name} read in total?", a * b + c)
    if kind == 3:
        a = rng.randint(30, 90)
        b = rng.randint(5, a - 5)
        c = rng.randint(5, 40)
        return (f"{name} has {a} dollars, spends {b} dollars on lunch and then earns {c} dollars. "
                f"How many dollars does {name} have now?", a - b + c)
    if kind == 4:
        a, b = rng.randint(3, 12), rng.randint(4, 12)
        c = rng.randint(1, a * b - 1)
        return (f"A hall has {a} rows of {b} chairs. {c} chairs are taken. How many chairs are free?", a * b - c)
    if kind == 5:
        b, k, c = rng.randint(2, 6), rng.randint(3, 12), rng.randint(1, 9)
        return (f"{name} splits {b * k} {items} equally into {b} bags, then adds {c} {items} to one bag. "
                f"How many {items} are in that bag now?", k + c)
    if kind == 6:
        a, b = rng.randint(2, 9), rng.randint(2, 5)
        c = rng.choice([50, 100]) if a * b < 50 else 100
        return (f"A ticket costs {a} dollars. {name} buys {b} tickets and pays with a {c} dollar bill. "
                f"How many dollars of change does {name} get?", c - a * b)
    a, b, c = rng.randint(2, 9), rng.randint(3, 7), rng.randint(2, 15)
    return (f"{name} runs {a} km every day for {b} days and then {c} km more on Sunday. "
            f"How many km does {name} run in total?", a * b + c)


def _expression(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 12), rng.randint(2, 12), rng.randint(2, 9)
    return rng.choice([f"({a} + {b}) * {c}", f"{a} * {b} - {c}", f"{a} - {b} * {c}", f"{a} + {b} * {c}", f"({a} - {b}) * {c}", f"{a} * {b} + {c}"])


def _tool_value(result_stdout: str) -> Number | None:
    last_line = next((ln for ln in reversed(result_stdout.strip().splitlines()) if ln.strip()), "")
    return normalize_number(last_line) if normalize_number(last_line) is not None else answer_number(result_stdout)


class MathTool:
    """A tool agent writes Python to compute the answer; a reasoner checks it and answers."""

    name = "math_tool"
    roles: tuple[str, ...] = ("tool", "reasoner")
    solo_roles: tuple[str, ...] = ("tool", "reasoner")
    """Either role can play alone: the tool's printed value, or the reasoner's own answer, is the verdict."""
    row_fields: dict[str, RowField] = {
        "question": RowField("text", help="the problem both agents see"),
        "answer": RowField("number", help='the right answer: a number, or text holding one ("42", "-3.5", "1,234", "3/4")'),
        "level": RowField("int", required=False, help="the generator's level (kept as metadata)"),
    }
    """What a dataset row holds (checked on upload; see `agents.base.RowField`)."""
    required_fields: tuple[str, ...] = required_of(row_fields)
    default_instructions: dict[str, str] = {
        "tool": (
            "You are a Python programmer. Solve the math problem with a short Python program that "
            "computes the answer and prints only the final number. Reply with one ```python code block."
        ),
        "reasoner": (
            "You are a careful math checker. Read the problem, the Python program and what it printed. "
            "Check that the program computes what the problem asks. "
            "Then write the final answer on its own line as: Answer: <number>"
        ),
    }

    stop_patterns: dict[str, str] = {"tool": STOP_AFTER_CODE_BLOCK, "reasoner": STOP_AFTER_ANSWER_LINE}
    """End an action once it is complete (the code block closed, the answer line written):
    what a small model adds after that is never read, so it is not generated or trained on."""

    def __init__(self, level: int | list[int] = 1, timeout_s: float = TOOL_TIMEOUT_S, self_correct: bool = False) -> None:
        """`level` picks the generated tasks: 1 `a + b` (two-digit), 2 two operations with precedence
        such as `(a + b) * c`, 3 short word problems with two operations. A list of levels mixes
        them: each generated task draws its level from the list at random (`[2, 3]`: about half of
        each; a level named twice is drawn twice as often), and its row records the level it got.
        `timeout_s` limits the tool's program.
        `self_correct`: an agent acting alone is not stopped after its first action: it sees its last
        attempt (the tool its program and what it printed, the reasoner its answer) and tries again,
        until two answers in a row agree or the topology's `max_turns` is reached. It is the lone
        agent's counterpart of the reasoner's check: one agent given the turns a team gets."""
        levels = level if isinstance(level, list) else [level]
        if not levels or any(isinstance(v, bool) or v not in (1, 2, 3) for v in levels):
            raise ValueError(f"math_tool: level must be 1, 2 or 3, or a non-empty list of them, not {level!r}")
        if not isinstance(self_correct, bool):
            raise ValueError(f"math_tool: self_correct must be true or false, not {self_correct!r}")
        self.level = level
        self.levels = tuple(levels)
        self.self_correct = self_correct
        self.timeout_s = tool_timeout("math_tool", timeout_s)

    # ------------------------------------------------------------ tasks

    def generate(self, n: int, *, seed: int) -> list[dict[str, Any]]:
        rng = random.Random(seed)
        rows = []
        for _ in range(n):
            level = self.levels[0] if len(self.levels) == 1 else rng.choice(self.levels)
            if level == 1:
                expr = f"{rng.randint(10, 99)} + {rng.randint(10, 99)}"
                question, value = f"Compute {expr}.", eval(expr, {"__builtins__": {}})  # noqa: S307 - ours
            elif level == 2:
                expr = _expression(rng)
                question, value = f"Compute {expr}.", eval(expr, {"__builtins__": {}})  # noqa: S307 - ours
            else:
                question, value = _word_problem(rng)
            rows.append({"question": question, "answer": str(value), "level": level})
        return rows

    # ------------------------------------------------------------ episode

    def reset(self, row: dict[str, Any], *, task_id: str, roles: tuple[str, ...]) -> State:
        roles = check_roles(self.name, self.roles, roles)
        return State(task_id=task_id, row=dict(row), data={"roles": roles, "tool_value": None, "answer": None})

    def observe(self, state: State, role: str) -> str:
        parts = [f"Problem: {state.row['question']}"]
        code, output = state.data.get("tool_code"), state.data.get("tool_output")
        if role == "tool":
            if code is not None or state.data.get("answer") is not None:
                if code is not None:
                    parts.append(f"Your previous program:\n```python\n{clip(code, 800, keep='head')}\n```\nIt printed: {output}")
                if state.data.get("answer") is not None:
                    parts.append(f"The checker answered: {state.data['answer']}")
                parts.append("Write a corrected Python program that prints the answer.")
            else:
                parts.append("Write a Python program that prints the answer.")
        else:
            if code is not None:
                parts.append(f"Python program:\n```python\n{clip(code, 800, keep='head')}\n```\nIt printed: {output}")
            elif output is not None:
                parts.append(f"The tool agent failed: {output}")
            if state.data["roles"] == ("reasoner",) and state.data.get("answer") is not None:
                parts.append(f"Your previous answer: {state.data['answer']}. Check it and answer again.")
            parts.append("End with: Answer: <number>")
        return "\n\n".join(parts)

    def step(self, state: State, *, agent: str, role: str, action: str) -> StepResult:
        check_turn(self.name, self.roles, state, role)
        roles: tuple[str, ...] = state.data["roles"]
        gold = normalize_number(str(state.row["answer"]))
        info: dict[str, Any] = {}
        updates: dict[str, Any] = {}
        tool_output: str | None = None
        if role == "tool":
            code = extract_code(action)
            if code is None:
                tool_output = "error: no ```python code block"
                local, value = -1.0, None
            else:
                result = run_cached(code, self.timeout_s)
                tool_output = describe_run(result)
                value = _tool_value(result.stdout) if result.ok else None
                local = -1.0 if not result.ok else (1.0 if numbers_equal(value, gold) else 0.0)
                info["sandbox_error"] = result.error
            updates = {"tool_code": code, "tool_output": tool_output, "tool_value": value}
        else:
            value = answer_number(action)
            local = -0.5 if value is None else (1.0 if numbers_equal(value, gold) else 0.0)
            updates = {"answer": value}
        data = {**state.data, **updates}
        team_answer = data["answer"] if "reasoner" in roles else data["tool_value"]
        right = numbers_equal(team_answer, gold)
        agreed = data["answer"] is not None and numbers_equal(data["answer"], data["tool_value"])
        if len(roles) == 1:  # alone: one action, or with self_correct until it repeats its answer
            before = state.data["tool_value"] if role == "tool" else state.data["answer"]
            done = not self.self_correct or numbers_equal(value, before)
        else:
            done = agreed
        info.update(value=value, team_answer=team_answer, agreed=agreed)
        next_state = advance(state, Message(agent, role, action, tool_output), done=done, success=right, **updates)
        return StepResult(next_state, local_reward=local, team_reward=1.0 if right else 0.0, tool_output=tool_output, info=info)

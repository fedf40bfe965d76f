"""`task`: a task defined as data, over any dataset's columns, graded by the team's graders.

A team defines it in the browser (or in a run's YAML); the run's config snapshot holds the whole
definition as `topology.env_args.definition`, so editing a grader later never changes what a
finished run meant:

```yaml
definition:
  roles:                       # in turn order; one role is a single-role task
    - name: answerer
      prompt: "Question: {question}"   # a row's columns by name; {{ and }} for braces
      sees_turns: false        # true: every earlier turn; or a list of the roles whose turns it sees
      grader: correct          # its local reward (none: 0)
    - name: checker
      prompt: "Check this answer to {question}. Reply OK or WRONG."
      sees_turns: true
      grader: verdict
  team: {grader: correct, role: answerer}   # the team reward: this grader on that role's latest turn
  rounds: 1                    # how many times each role acts
  graders:                     # see agents.graders
    correct: {kind: number, column: answer}
    verdict: {kind: python, code: "def grade(completion, row, turns): ..."}
```

Each action's local reward is its role's grader's score; the team reward is the team grader's
score on the team role's latest answer (this action's, when the team role is acting). A grade that
fails (a Python grader that raised, hung or returned NaN) counts 0, and its reason goes to the run's
log (`StepResult.info["problems"]`). Each grader's score, and each of its parts, is in
`StepResult.info["reward_parts"]`, which the run page charts as the reward's breakdown.
Python graders run in sandbox worker processes the environment keeps for the whole run
(`agents.graders.GraderWorkers`: one per Python grader, fed every step's candidates over a pipe, a
fresh one only after a grader hung or crashed); `close()`, called when the run ends, fails or is
stopped, kills them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from agents.base import Message, RowField, State, StepResult
from agents.envs._common import advance, check_roles, check_turn, clip
from agents.graders import Grade, GraderError, GraderWorkers, Item, check_graders, grade_batch

ROLE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,59}$")
MAX_ROLES = 8
MAX_ROUNDS = 8
MAX_PROMPT_CHARS = 8_000
PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")


def check_definition(definition: Any, *, where: str = "definition") -> dict[str, Any]:
    """A task definition, checked (roles, their prompts and graders, the team reward, the graders
    themselves); returns it as plain data. Raises GraderError naming the field."""
    if not isinstance(definition, Mapping):
        raise GraderError(where, "must be a mapping with roles and graders")
    unknown = sorted(str(k) for k in definition if k not in ("roles", "team", "rounds", "graders", "description"))
    if unknown:
        raise GraderError(where, f"takes roles, team, rounds, graders and description; not {', '.join(unknown)}")
    graders = check_graders(definition.get("graders"), where=f"{where}.graders")
    roles = definition.get("roles")
    if not isinstance(roles, list) or not 1 <= len(roles) <= MAX_ROLES:
        raise GraderError(f"{where}.roles", f"must list 1 to {MAX_ROLES} roles, in turn order")
    names = [r.get("name") if isinstance(r, Mapping) else None for r in roles]
    checked_roles = []
    for i, role in enumerate(roles):
        at = f"{where}.roles[{i}]"
        if not isinstance(role, Mapping):
            raise GraderError(at, "must be a mapping with name and prompt")
        extra = sorted(str(k) for k in role if k not in ("name", "prompt", "sees_turns", "grader"))
        if extra:
            raise GraderError(at, f"takes name, prompt, sees_turns and grader; not {', '.join(extra)}")
        name = role.get("name")
        if not isinstance(name, str) or not ROLE_NAME.match(name):
            raise GraderError(f"{at}.name", "must start with a letter; letters, digits, - or _ (at most 60)")
        if names.count(name) > 1:
            raise GraderError(f"{at}.name", f"{name!r} is named twice")
        prompt = role.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip() or len(prompt) > MAX_PROMPT_CHARS:
            raise GraderError(f"{at}.prompt", f"must be text of 1 to {MAX_PROMPT_CHARS:,} characters")
        for match in PLACEHOLDER.finditer(prompt):
            if match.group(1) is not None and not re.fullmatch(r"[A-Za-z_][\w-]{0,199}", match.group(1)):
                raise GraderError(f"{at}.prompt", f"{{{match.group(1)[:40]}}} is not a column name; write {{{{ and }}}} for braces")
        sees = role.get("sees_turns", False)
        if not isinstance(sees, bool) and not (isinstance(sees, list) and all(s in names for s in sees)):
            raise GraderError(f"{at}.sees_turns", f"must be true, false, or a list of roles of this task ({', '.join(map(str, names))})")
        grader = role.get("grader")
        if grader is not None and grader not in graders:
            raise GraderError(f"{at}.grader", f"names {str(grader)[:60]!r}, which is not one of the graders ({', '.join(graders)})")
        checked_roles.append({"name": name, "prompt": prompt, "sees_turns": sees, "grader": grader})
    team = definition.get("team")
    if team is not None:
        if not isinstance(team, Mapping) or team.get("grader") not in graders or team.get("role") not in names or len(team) != 2:
            raise GraderError(f"{where}.team", f"must be {{grader: <one of {', '.join(graders)}>, role: <one of {', '.join(map(str, names))}>}}")
        team = {"grader": team["grader"], "role": team["role"]}
    rounds = definition.get("rounds", 1)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or not 1 <= rounds <= MAX_ROUNDS:
        raise GraderError(f"{where}.rounds", f"must be a whole number from 1 to {MAX_ROUNDS}")
    out: dict[str, Any] = {"roles": checked_roles, "team": team, "rounds": rounds, "graders": graders}
    if isinstance(definition.get("description"), str):
        out["description"] = definition["description"][:2000]
    return out


def render(template: str, row: Mapping[str, Any]) -> str:
    """The prompt for a row: `{column}` replaced by the row's value ({{ and }} are braces). Only
    plain names are replaced (never `str.format`, whose `{x.__class__}` reads attributes)."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "{{":
            return "{"
        if match.group(0) == "}}":
            return "}"
        name = match.group(1)
        if name not in row:
            raise KeyError(f"the prompt names the column {name!r}, which the row lacks (it has: {', '.join(sorted(map(str, row))) or 'none'})")
        value = row[name]
        return "" if value is None else str(value)

    return PLACEHOLDER.sub(one, template)


def columns_named(template: str) -> list[str]:
    return [m.group(1) for m in PLACEHOLDER.finditer(template) if m.group(1)]


class Task:
    """A team's task: roles prompted from a dataset row's columns, graded by the team's graders."""

    name = "task"
    roles: tuple[str, ...] = ()
    """Set from the definition (the class itself declares none)."""
    row_fields: dict[str, RowField] = {}
    """Any columns: the definition's prompts and graders name the ones they read."""
    required_fields: tuple[str, ...] = ()
    default_instructions: dict[str, str] = {}
    solo_roles: tuple[str, ...] = ()
    """A single-role task's role (it plays an episode alone); none for a team's task."""

    def __init__(self, definition: dict[str, Any] | None = None) -> None:
        """`definition`: roles, team, rounds and graders (see the module docstring). Without one it
        has no roles: it only reads a dataset's rows (an upload for a task is checked with it)."""
        if definition is None:
            self.definition: dict[str, Any] = {"roles": [], "team": None, "rounds": 1, "graders": {}}
            self.graders: dict[str, dict[str, Any]] = {}
            self._role: dict[str, dict[str, Any]] = {}
            return
        self.definition = check_definition(definition)
        self.roles = tuple(r["name"] for r in self.definition["roles"])
        self.solo_roles = self.roles[:1] if len(self.roles) == 1 else ()
        self.graders = self.definition["graders"]
        self._role = {r["name"]: r for r in self.definition["roles"]}
        self.workers = GraderWorkers()
        """The run's Python grader processes (started at their first completion)."""

    def close(self) -> None:
        """Stop the Python graders' processes (the trainer calls it at the run's end)."""
        workers = getattr(self, "workers", None)
        if workers is not None:
            workers.close()

    def generate(self, n: int, *, seed: int) -> list[dict[str, Any]]:
        raise ValueError("a task defined in the browser has no generator: upload its rows as a dataset")

    def reset(self, row: dict[str, Any], *, task_id: str, roles: tuple[str, ...]) -> State:
        if not self.roles:
            raise ValueError("task: it has no definition (roles and graders) to play; the catalog's Tasks page builds one")
        played = check_roles(self.name, self.roles, roles)
        for role in played:
            for column in columns_named(self._role[role]["prompt"]):
                if column not in row:
                    raise ValueError(f"task: role {role}'s prompt names the column {column!r}, which row {task_id} lacks")
        return State(task_id=task_id, row=dict(row), data={"played": len(played)})

    def observe(self, state: State, role: str) -> str:
        spec = self._role[role]
        text = render(spec["prompt"], state.row)
        sees = spec["sees_turns"]
        seen = [m for m in state.dialogue if sees is True or (isinstance(sees, list) and m.role in sees)]
        if seen:
            text += "\n\nEarlier turns:\n" + "\n".join(f"[{m.role}] {clip(m.text, 1200)}" for m in seen)
        return text

    def step(self, state: State, *, agent: str, role: str, action: str) -> StepResult:
        return self.step_many(state, agent=agent, role=role, actions=[action])[0]

    def step_many(self, state: State, *, agent: str, role: str, actions: Sequence[str]) -> list[StepResult]:
        """`step` for several candidate actions on the same state (pure), graded as one batch."""
        check_turn(self.name, self.roles, state, role)
        turns = tuple((m.role, m.text) for m in state.dialogue)
        items = [Item(action, state.row, turns) for action in actions]
        spec = self._role[role]
        local: list[Grade | None] = list(grade_batch(self.graders, spec["grader"], items, self.workers)) if spec["grader"] else [None] * len(items)
        team: list[Grade | None] = [None] * len(items)
        team_spec = self.definition["team"]
        if team_spec is not None:
            if team_spec["role"] == role:
                team = list(grade_batch(self.graders, team_spec["grader"], items, self.workers))
            else:
                earlier = [m for m in state.dialogue if m.role == team_spec["role"]]
                if earlier:
                    before = tuple((m.role, m.text) for m in state.dialogue[: state.dialogue.index(earlier[-1])])
                    (one,) = grade_batch(self.graders, team_spec["grader"], [Item(earlier[-1].text, state.row, before)], self.workers)
                    team = [one] * len(items)
        done = state.turn + 1 >= state.data.get("played", len(self.roles)) * self.definition["rounds"]
        results = []
        for action, mine, ours in zip(actions, local, team):
            parts: dict[str, float] = {}
            problems: list[str] = []
            if mine is not None:
                self._note(parts, problems, spec["grader"], mine, f"{role}'s turn")
            if ours is not None and team_spec is not None:
                self._note(parts, problems, f"team-{team_spec['grader']}", ours, "the team reward")
            team_reward = ours.score if ours is not None else 0.0
            next_state = advance(state, Message(agent, role, action), done=done, success=done and ours is not None and ours.ok
                                 and team_reward >= 1.0)
            results.append(StepResult(next_state, local_reward=mine.score if mine is not None else 0.0, team_reward=team_reward,
                                      info={"reward_parts": parts, "problems": problems}))
        return results

    def _note(self, parts: dict[str, float], problems: list[str], name: str, grade: Grade, what: str) -> None:
        if not grade.ok:
            problems.append(f"grader {name.removeprefix('team-')} failed on {what}: {grade.error}")
            return
        parts[name] = grade.score
        for part, value in grade.parts.items():
            parts[f"{name}.{part}"] = value

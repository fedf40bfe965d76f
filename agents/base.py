"""The environment protocol every Troupe world implements.

An environment turns a dataset row into an episode state, shows each agent an observation,
and scores an agent's action. `step` must be pure (it never mutates the state it is given):
AT-GRPO tree sampling scores K candidate actions from one state and continues from the best.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, runtime_checkable


@dataclass(frozen=True)
class Message:
    """One utterance in the shared dialogue of an episode."""

    agent: str
    """Name of the agent that acted."""
    role: str
    """The environment role that agent plays (for example "tool" or "reasoner")."""
    text: str
    """What the agent wrote."""
    tool_output: str | None = None
    """What running the action produced (sandbox stdout/stderr), if anything ran."""


@dataclass(frozen=True)
class State:
    """An episode's state. Environments keep their own data in `data` and never mutate it."""

    task_id: str
    row: dict[str, Any]
    """The dataset row this episode was reset from."""
    turn: int = 0
    dialogue: tuple[Message, ...] = ()
    done: bool = False
    success: bool = False
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StepResult:
    """What applying one action to a state produced."""

    state: State
    """The next state (a new object; the input state is untouched)."""
    local_reward: float
    """The acting agent's own reward (for example +1 right tool output, -1 error)."""
    team_reward: float
    """The team's reward after this action (for example 1 when the final answer is right)."""
    tool_output: str | None = None
    """Sandbox stdout/stderr when the action ran code."""
    info: dict[str, Any] = field(default_factory=dict)


FieldKind = Literal["text", "int", "float", "number", "bool", "text_list", "scalar"]

KIND_LABELS: dict[str, str] = {
    "text": "text",
    "int": "a whole number",
    "float": "a number",
    "number": "a number or text",
    "bool": "true or false",
    "text_list": "a list of text",
    "scalar": "text, a number or true/false",
}
"""How each kind reads in an error message and on the upload page."""


@dataclass(frozen=True)
class RowField:
    """The type of one field of a dataset row, as an environment declares it in `row_fields`.

    Uploaded rows are checked against it (`training.data.read_rows`); CSV cells, which are all
    text, are converted to the kind first ("3" for an int is 3, `["a", "b"]` for a text_list is
    a list).
    """

    kind: FieldKind
    """`text`: a string. `int`: a whole number. `float`: any finite number. `number`: a number, or
    text holding one ("42", "-3.5", "1,234", "3/4"; answers are compared numerically). `bool`: true
    or false (CSV: true/false, yes/no, 1/0). `text_list`: a list of strings (CSV: a JSON list in the
    cell, or one string). `scalar`: text, a number or true/false, never an object or a list."""
    required: bool = True
    """A row without it (or with it empty) is refused."""
    max_length: int | None = None
    """Most characters in the text (in each item of a text_list); None: the reader's limit
    (`training.data.MAX_FIELD_CHARS`)."""
    help: str = ""
    """What the field holds, in a few words (shown on the upload page)."""

    @property
    def label(self) -> str:
        return KIND_LABELS[self.kind]


def required_of(fields: Mapping[str, RowField]) -> tuple[str, ...]:
    """The names of the required fields, in declaration order (an environment's `required_fields`)."""
    return tuple(name for name, f in fields.items() if f.required)


def fields_of(env: Any) -> dict[str, RowField]:
    """The row fields an environment (or environment class) declares, merged with its `required_fields`.

    An environment written before `row_fields` existed declares only `required_fields`: each is a
    required `scalar` (text, a number or true/false), never an object or a list. A name in
    `required_fields` that `row_fields` marks optional is required. ValueError when the
    declaration is not a mapping of names to `RowField`.
    """
    declared = getattr(env, "row_fields", None)
    fields: dict[str, RowField] = {}
    if declared is not None:
        if not isinstance(declared, Mapping) or not all(isinstance(k, str) and isinstance(v, RowField) for k, v in declared.items()):
            raise ValueError(f"environment {getattr(env, 'name', env)!r}: row_fields must map field names to agents.base.RowField")
        fields.update(declared)
    for name in getattr(env, "required_fields", ()):
        if name not in fields:
            fields[name] = RowField("scalar")
        elif not fields[name].required:
            fields[name] = replace(fields[name], required=True)
    return fields


@runtime_checkable
class Environment(Protocol):
    """A multi-agent world. Built-ins live in `agents.envs`; plugins are named `pkg.mod:Class`.

    An environment should also declare `row_fields: dict[str, RowField]`, the type of each field
    of its dataset rows (required and optional), and derive `required_fields` from it with
    `required_of`. It is optional so that environments written before it keep working: without
    it, the `required_fields` are checked as scalars (see `fields_of`). Fields a row carries that
    the environment does not declare (a team's metadata) are kept, within the reader's limits.
    """

    name: str
    roles: tuple[str, ...]
    """The roles agents may play here, in their natural turn order."""
    required_fields: tuple[str, ...]
    """Fields a dataset row must have (uploaded datasets are validated against them)."""

    def generate(self, n: int, *, seed: int) -> list[dict[str, Any]]:
        """Return n procedurally generated dataset rows (deterministic for a seed)."""
        ...

    def reset(self, row: dict[str, Any], *, task_id: str, roles: tuple[str, ...]) -> State:
        """Start an episode for a row, played by agents in these roles (in turn order)."""
        ...

    def observe(self, state: State, role: str) -> str:
        """The text the agent playing `role` sees now: the task and the dialogue so far."""
        ...

    def step(self, state: State, *, agent: str, role: str, action: str) -> StepResult:
        """Apply `action` by `agent` playing `role`; pure, returns a new state and rewards."""
        ...


ENVIRONMENT_MEMBERS: tuple[str, ...] = (
    *Environment.__annotations__,
    *(name for name, value in vars(Environment).items() if callable(value) and not name.startswith("_")),
)
"""The members of the `Environment` protocol, in declaration order (`name`, `roles`, ...,
`step`), read from the class above: the plugin loader and the trust boundary check a plugin
against this one list."""


def missing_members(env: Any) -> list[str]:
    """The protocol members an environment (an instance, or a plugin's class) lacks, in order."""
    return [name for name in ENVIRONMENT_MEMBERS if not hasattr(env, name)]

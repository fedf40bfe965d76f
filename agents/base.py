"""The environment protocol every Troupe world implements.

An environment turns a dataset row into an episode state, shows each agent an observation,
and scores an agent's action. `step` must be pure (it never mutates the state it is given):
AT-GRPO tree sampling scores K candidate actions from one state and continues from the best.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


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


@runtime_checkable
class Environment(Protocol):
    """A multi-agent world. Built-ins live in `agents.envs`; plugins are named `pkg.mod:Class`."""

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

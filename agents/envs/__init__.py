"""Built-in environments and the plugin loader.

Built-ins (each with a seeded procedural task generator, so no download is needed):

- `arithmetic`: one `solver` answers an arithmetic question (the single-agent baseline).
- `math_tool`: a `tool` agent writes Python that prints the answer (run in the sandbox) and a
  `reasoner` checks it and states `Answer: <number>`.
- `plan_path`: grid path planning; a `plan` agent states moves, a `tool` agent writes a search program.
- `code_tests`: a `coder` writes a function, a `tester` writes unit tests for it.
- `task`: a team's own task, defined as data (roles prompted from a dataset's columns, graded by
  the team's graders: `agents.envs.task`, `agents.graders`); it has no generator.
- `referential`: a `speaker` sees a target and sends one code word, a `listener` picks the target
  from shuffled candidates by it (a game only a co-adapted pair beats chance, 1/k, at).

A plugin environment is any class (or factory) named `package.module:Name`, registered by the
operator (see `agents.plugins`: a config can only name registered plugins), whose instances
provide the `agents.base.Environment` protocol: `name`, `roles`, `required_fields`,
`generate(n, *, seed)`, `reset(row, *, task_id, roles)`, `observe(state, role)` and a pure
`step(state, *, agent, role, action) -> StepResult`. It should declare `row_fields: dict[str,
RowField]`, the type of each field of its dataset rows (uploads are checked against it; without
it, its `required_fields` are checked as scalars). It may also define
`default_instructions: dict[str, str]`, a system prompt per role, and `stop_patterns: dict[str,
str]`, a regex per role that ends an action early once it matches. It may declare `solo_roles: tuple[str, ...]`,
the roles that can play an episode by themselves (the "agent alone" ablation, `training.ablation`,
is offered only for those; without it, for none). Keyword arguments from the
config's `env_args` are passed to its constructor.

The built-ins' rows (`row_fields` of each class; all text unless said otherwise):

- `arithmetic`, `math_tool`: `question`; `answer`, a number or text holding one ("42", "3/4");
  optional `level` (a whole number).
- `plan_path`: `grid`, one text of rows of `. # S G` (at most 2,000 characters); optional
  `question`, `shortest` (a whole number).
- `code_tests`: `prompt`, `reference`, `hidden_tests`; `mutants`, a list of code texts (in a CSV
  cell, a JSON list); optional `entry_point`, `template`.
- `referential`: `target`; `candidates`, a list of texts (in a CSV cell, a JSON list), the target
  among them; optional `question`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from agents.base import Environment, RowField, fields_of, missing_members
from agents.envs.arithmetic import Arithmetic
from agents.envs.code_tests import CodeTests
from agents.envs.math_tool import MathTool
from agents.envs.plan_path import PlanPath
from agents.envs.referential import Referential
from agents.envs.task import Task
from agents.plugins import ENVIRONMENT, PluginError, lookup

BUILTIN: dict[str, type[Any]] = {
    "arithmetic": Arithmetic,
    "math_tool": MathTool,
    "plan_path": PlanPath,
    "code_tests": CodeTests,
    "referential": Referential,
}


DEFINED: dict[str, type[Any]] = {"task": Task}
"""Environments made entirely of their arguments, with no generator: `task`, a team's task defined
as data (`agents.envs.task`). A config names them like a built-in."""
KNOWN: dict[str, type[Any]] = {**BUILTIN, **DEFINED}
"""Every environment a config may name without a plugin."""


@dataclass(frozen=True)
class EnvironmentInfo:
    """What the web form and the CLI show about a built-in environment."""

    name: str
    summary: str
    roles: tuple[str, ...]
    required_fields: tuple[str, ...]
    row_fields: dict[str, RowField]
    """Every declared row field and its type (for an environment that declares only
    `required_fields`, those as required scalars)."""
    args: tuple[str, ...]
    """Keyword arguments its constructor accepts (the config's `env_args`)."""


def load_environment(name_or_dotted: str, **env_args: Any) -> Environment:
    """A built-in environment by name, or a plugin named `package.module:Class`, built with `env_args`."""
    if name_or_dotted in KNOWN:
        factory: Any = KNOWN[name_or_dotted]
    elif ":" in name_or_dotted:
        factory = lookup(name_or_dotted, kind=ENVIRONMENT)
        if not callable(factory):
            raise PluginError(f"environment {name_or_dotted!r} is a {type(factory).__name__}, not a class or factory")
    else:
        raise PluginError(
            f"unknown environment {name_or_dotted!r}; built-ins are {', '.join(KNOWN)}, "
            "or name a plugin as mypkg.module:MyEnv"
        )
    _check_args(name_or_dotted, factory, env_args)
    env = factory(**env_args)
    missing = missing_members(env)
    if missing:
        raise PluginError(f"environment {name_or_dotted!r} lacks {', '.join(missing)} (see agents.base.Environment)")
    result: Environment = env
    return result


def _check_args(name: str, factory: Any, env_args: dict[str, Any]) -> None:
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return
    accepted = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = [k for k in env_args if k not in accepted]
    if unknown:
        raise PluginError(
            f"environment {name!r} does not accept {', '.join(repr(k) for k in unknown)}; "
            f"its arguments are: {', '.join(accepted) or 'none'}"
        )


def list_environments() -> list[EnvironmentInfo]:
    """The built-in environments, in a stable order."""
    return [describe_environment(name, cls) for name, cls in BUILTIN.items()]


def describe_environment(name: str, cls: Any) -> EnvironmentInfo:
    """What a page shows about an environment class (a built-in or a plugin named `name`)."""
    params = inspect.signature(cls).parameters
    doc = (cls.__doc__ or "").strip()
    return EnvironmentInfo(
        name=name,
        summary=doc.splitlines()[0] if doc else name,
        roles=tuple(cls.roles),
        required_fields=tuple(getattr(cls, "required_fields", ())),
        row_fields=fields_of(cls),
        args=tuple(n for n in params if n != "self"),
    )


__all__ = ["BUILTIN", "DEFINED", "KNOWN", "EnvironmentInfo", "describe_environment", "list_environments", "load_environment"]

"""What an experiment's trial is made of, shared by grids (`training.experiment`) and searches
(`training.search`): config fields named by dotted path and resolved against RunConfig's own
dataclass schema, and a trial's held-out metrics read from its evaluations."""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from typing import Any

from training.config import ConfigError, RunConfig, set_field

_PART = re.compile(r"^([A-Za-z_]\w*)(?:\[(\d+)\])?$")
NOT_AXES = {
    "name": "every trial is named after its experiment, arm and seed",
    "seed": "list the seeds in the experiment's `seeds`",
    "checkpoint.resume_from": "a trial starts from scratch",
}
"""Fields an axis may not vary, and why."""


def with_fields(base: RunConfig, **fields: Any) -> RunConfig:
    """`base` with the trial's dotted fields set, validated (ConfigError otherwise).

    One rule makes the specialization an axis of a team: `topology.specialization: single` on a
    topology with several acting agents means its *first* acting agent (in turn order) plays alone.
    The topology is reduced to that agent (its role, instructions and tools, as the other fields left
    them) and the turn order to it, so `topology.specialization: [single, prompt, lora]` compares the
    lone agent with the team sharing one model and the team with an adapter each."""
    data = base.to_dict()
    for key, value in fields.items():
        set_field(data, key, value)
    topology = data.get("topology")
    if isinstance(topology, dict) and topology.get("specialization") == "single" and isinstance(topology.get("agents"), list):
        order = list(topology.get("turn_order") or [a.get("name") for a in topology["agents"] if isinstance(a, dict)])
        if len(set(order)) > 1:
            topology["agents"] = [a for a in topology["agents"] if isinstance(a, dict) and a.get("name") == order[0]]
            topology["turn_order"] = [order[0]]
    return RunConfig.from_dict(data)


def resolve_field(config: RunConfig, dotted: str) -> Any:
    """The type of the RunConfig leaf field `dotted`, found in the config's own dataclass schema;
    ConfigError (with the allowed names) when there is no such field or it names a whole section.
    List items are addressed by index (`topology.agents[1].temperature`), keys of a mapping field by
    name (`topology.env_args.level`)."""
    if dotted in NOT_AXES:
        raise ConfigError(dotted, f"cannot be an axis: {NOT_AXES[dotted]}")
    node: Any = config
    cls: Any = type(config)
    parts = dotted.split(".")
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        if cls is dict:
            if not last or not re.match(r"^\w+$", part):
                raise ConfigError(dotted, f"{'.'.join(parts[:depth])} is a mapping: name one key of it")
            return Any
        m = _PART.match(part)
        names = [f.name for f in dataclasses.fields(cls)]
        if m is None or m.group(1) not in names:
            where = ".".join(parts[:depth]) or "the config"
            raise ConfigError(dotted, f"unknown field {part!r} in {where}; allowed: {', '.join(names)}")
        name, index = m.group(1), m.group(2)
        hint = _strip_optional(typing.get_type_hints(cls)[name])
        node = getattr(node, name)
        if index is not None:
            if typing.get_origin(hint) is not tuple or not dataclasses.is_dataclass(typing.get_args(hint)[0]):
                raise ConfigError(dotted, f"{name} is not a list of sections")
            if int(index) >= len(node):
                raise ConfigError(dotted, f"{name} has {len(node)} items (0 to {len(node) - 1})")
            node, hint = node[int(index)], typing.get_args(hint)[0]
        if dataclasses.is_dataclass(hint):
            if last:
                subs = ", ".join(f.name for f in dataclasses.fields(hint))
                raise ConfigError(dotted, f"is a section, not a field; name one of its fields: {subs}")
            cls = hint
        elif typing.get_origin(hint) is dict:
            if last:
                raise ConfigError(dotted, "is a mapping: name one key of it, like topology.env_args.level")
            cls = dict
        elif not last:
            raise ConfigError(dotted, f"{'.'.join(parts[:depth + 1])} is a field, not a section")
        else:
            return hint
    return Any


def field_value(config: RunConfig, dotted: str) -> Any:
    """The value of the dotted field in `config` (a plain value: lists for tuples)."""
    node: Any = config.to_dict()
    for part in dotted.split("."):
        m = _PART.match(part)
        if m is None:
            return node.get(part) if isinstance(node, dict) else None
        node = node.get(m.group(1)) if isinstance(node, dict) else None
        if m.group(2) is not None and isinstance(node, list):
            node = node[int(m.group(2))]
    return node


def _strip_optional(hint: Any) -> Any:
    args = typing.get_args(hint)
    if type(None) in args:
        inner = [a for a in args if a is not type(None)]
        return inner[0]
    return hint


def trial_metrics(evaluations: list[dict[str, Any]]) -> dict[str, float]:
    """A trial's metrics from its evaluations (`training.trainer.evaluate`'s dicts): the last
    greedy one (lowest temperature at the highest step): `team.success`, `<agent>.success`,
    `<agent>.reward`; and where the run also evaluated sampled at that step (`eval.sampled`), the
    same names prefixed `sampled.` from the highest temperature there. Empty when the trial has not
    been evaluated; entries without a numeric team success (a stored row of another shape) are
    passed over."""
    usable = [e for e in evaluations if isinstance(e, dict) and isinstance(e.get("team"), dict) and _number(e["team"].get("success"))
              and _number(e.get("step", 0)) and _number(e.get("temperature", 0.0))]
    if not usable:
        return {}
    last = max(usable, key=lambda e: (e.get("step", 0), -float(e.get("temperature", 0.0))))
    out = _eval_metrics(last)
    at_step = [e for e in usable if e.get("step", 0) == last.get("step", 0)]
    hottest = max(at_step, key=lambda e: float(e.get("temperature", 0.0)))
    if float(hottest.get("temperature", 0.0)) > float(last.get("temperature", 0.0)):
        out.update({f"{SAMPLED}{name}": value for name, value in _eval_metrics(hottest).items()})
    return out


SAMPLED = "sampled."
"""The prefix of a trial's metrics measured at the training temperature (`trial_metrics`)."""


def _eval_metrics(evaluation: dict[str, Any]) -> dict[str, float]:
    out = {"team.success": float(evaluation["team"]["success"])}
    agents: dict[Any, Any] = evaluation["agents"] if isinstance(evaluation.get("agents"), dict) else {}
    for agent, values in agents.items():
        for key in ("success", "reward"):
            if isinstance(values, dict) and _number(values.get(key)):
                out[f"{agent}.{key}"] = float(values[key])
    return out


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

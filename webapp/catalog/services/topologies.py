"""Topologies: ordered agents acting together in one environment."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction

from agents.base import Environment
from training.config import ConfigError
from webapp.catalog.environments import environment_load
from webapp.catalog.graders import task_env_args
from webapp.catalog.selectors import topology_delete_blocker
from webapp.catalog.services.names import check_name_free, free_name
from webapp.models import Agent, Team, Topology, TopologyAgent
from webapp.teams.audit import Verb, audit_record


def topology_create(*, team: Team, agents: list[Agent], actor: User | None = None, **values: Any) -> Topology:
    with transaction.atomic():
        topology = topology_update(topology=Topology(team=team), agents=agents, **values)
        audit_record(team=team, actor=actor, verb=Verb.CREATE, obj=topology, environment=topology.environment,
                     agents=[a.name for a in agents])
    return topology


@transaction.atomic
def topology_update(
    *, topology: Topology, name: str, environment: str, env_args: dict[str, Any], max_turns: int,
    specialization: str, agents: list[Agent],
) -> Topology:
    """Save a topology and its ordered agents; every agent's role must exist in the environment."""
    topology.name, topology.environment, topology.env_args = name, environment, env_args or {}
    topology.max_turns, topology.specialization = max_turns, specialization
    check_name_free(topology)
    topology.full_clean()
    problems = topology_problems(topology=topology, agents=agents)
    if problems:
        raise ValidationError(problems)
    topology.save()
    topology.members.all().delete()
    TopologyAgent.objects.bulk_create(
        TopologyAgent(topology=topology, agent=agent, position=i) for i, agent in enumerate(agents, start=1)
    )
    return topology


def topology_problems(*, topology: Topology, agents: list[Agent]) -> dict[str, list[str]]:
    """Every reason these agents, in this order, cannot make this topology, by field (all of them
    at once, for the form to show): unknown environment or bad arguments, roles the environment
    lacks, repeats, another team's agents, a specialization that does not fit."""
    problems: dict[str, list[str]] = defaultdict(list)
    env: Environment | None = None
    try:
        env_args = task_env_args(team=topology.team_id, env_args=topology.env_args) if topology.environment == "task" else topology.env_args
        env = environment_load(name=topology.environment, env_args=env_args)
    except ConfigError as exc:  # a task the team does not have
        problems["env_args"].append(exc.message)
    except ValidationError as exc:
        for field, messages in exc.message_dict.items():
            problems[field] += messages
    if not agents:
        problems["agents"].append("Add at least one agent.")
    if len({a.pk for a in agents}) != len(agents):
        problems["agents"].append("Each agent can appear only once.")
    if any(a.team_id != topology.team_id for a in agents):
        problems["agents"].append("Pick agents of your own team.")
    wrong = [f"{a.name} ({a.role})" for a in agents if env is not None and a.role not in env.roles]
    if wrong and env is not None:
        problems["agents"].append(f"{', '.join(wrong)}: role not in {env.name}; its roles are {', '.join(env.roles)}.")
    if topology.specialization == "single" and len(agents) > 1:
        problems["specialization"].append(f"`single` trains exactly one agent; this topology has {len(agents)}.")
    sources = {a.model_source.source for a in agents}
    if topology.specialization != "full" and len(sources) > 1:
        problems["specialization"].append(f"Only `full` lets agents use different models (these use {', '.join(sorted(sources))}).")
    if agents and not any(a.trainable for a in agents):
        problems["agents"].append("At least one agent must be trainable.")
    return dict(problems)


def topology_duplicate(*, topology: Topology, actor: User | None = None) -> Topology:
    return topology_create(
        team=topology.team, actor=actor,
        name=free_name(Topology, topology.team, topology.name, max_length=100),
        environment=topology.environment,
        env_args=topology.env_args,
        max_turns=topology.max_turns,
        specialization=topology.specialization,
        agents=topology.ordered_agents(),
    )


def topology_delete(*, topology: Topology, actor: User | None = None) -> None:
    if blocker := topology_delete_blocker(topology=topology):
        raise ValidationError(blocker)
    with transaction.atomic():
        audit_record(team=topology.team_id, actor=actor, verb=Verb.DELETE, obj=topology, environment=topology.environment)
        topology.delete()  # finished runs keep their config snapshot

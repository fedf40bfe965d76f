"""Agents: a role in an environment, instructions, a model and sampling settings."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction

from webapp.catalog.environments import environment_roles
from webapp.catalog.graders import task_roles
from webapp.catalog.selectors import agent_delete_blocker
from webapp.catalog.services.names import check_name_free, free_name
from webapp.models import Agent, Team
from webapp.teams.audit import Verb, audit_record

AGENT_FIELDS = ("name", "role", "instructions", "model_source", "temperature", "max_new_tokens", "tools", "trainable")


def agent_create(*, team: Team, actor: User | None = None, **values: Any) -> Agent:
    with transaction.atomic():
        agent = agent_update(agent=Agent(team=team), **values)
        audit_record(team=team, actor=actor, verb=Verb.CREATE, obj=agent, role=agent.role)
    return agent


def agent_update(*, agent: Agent, **values: Any) -> Agent:
    """Save an agent; every problem at once: its name taken, bad fields, a role no environment has."""
    for key in AGENT_FIELDS:
        if key in values:
            setattr(agent, key, values[key])
    problems: dict[str, list[str]] = defaultdict(list)
    checks = (lambda: check_name_free(agent),  # the taken name said once, in Troupe's words: Django's own check of the
              lambda: agent.full_clean(validate_constraints=False),  # unique constraint would say it again in its words
              lambda: agent.validate_constraints(exclude={"name"}))
    for check in checks:
        try:
            check()
        except ValidationError as exc:
            for field, messages in exc.message_dict.items():
                problems[field] += [m for m in messages if m not in problems[field]]
    roles = environment_roles()
    roles["task"] = task_roles(team=agent.team_id)  # the roles of the team's own tasks
    if agent.role and not any(agent.role in env_roles for env_roles in roles.values()):
        by_env = "; ".join(f"{env}: {', '.join(env_roles)}" for env, env_roles in roles.items())
        problems["role"].append(f"No environment has the role {agent.role!r}, so no topology could use this agent. Roles by environment: {by_env}.")
    if problems:
        raise ValidationError(dict(problems))
    agent.save()
    return agent


def agent_duplicate(*, agent: Agent, actor: User | None = None) -> Agent:
    copy = Agent(team=agent.team, **{k: getattr(agent, k) for k in AGENT_FIELDS if k != "name"})
    copy.name = free_name(Agent, agent.team, agent.name, max_length=40)
    copy.full_clean()
    with transaction.atomic():
        copy.save()
        audit_record(team=agent.team_id, actor=actor, verb=Verb.CREATE, obj=copy, role=copy.role, copy_of=agent.name)
    return copy


def agent_delete(*, agent: Agent, actor: User | None = None) -> None:
    if blocker := agent_delete_blocker(agent=agent):
        raise ValidationError(blocker)
    with transaction.atomic():
        audit_record(team=agent.team_id, actor=actor, verb=Verb.DELETE, obj=agent, role=agent.role)
        agent.delete()

"""The reads about the team's graders and tasks (`webapp.models.tasks`): the grader set a task or a
grader stands for, a task's definition as the `task` environment takes it, a topology's
`env_args` resolved at launch (the run's snapshot then holds the definition as it was), the sample
rows a try runs on, and each object as YAML. The API registers graders and tasks through these and
`webapp.catalog.services.tasks`, like the other catalog objects."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from training.config import ConfigError
from webapp.models import Dataset, Grader, Task, Team, Topology

SAMPLE_ROWS = 5
"""How many of a dataset's first rows a try grades."""


def graders_of(*, team: Team | int) -> list[Grader]:
    return list(Grader.objects.filter(team=team).order_by("name"))


def tasks_of(*, team: Team | int) -> list[Task]:
    return list(Task.objects.filter(team=team).select_related("dataset").order_by("name"))


def grader_set(*, team: Team | int, names: Iterable[str], drafts: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """The specs of the team's graders `names`, with every grader their combinations name (and
    theirs); `drafts` (name -> spec) stand in for saved ones (an unsaved form being tried).
    ConfigError on `graders` naming a grader the team does not have."""
    saved = {g.name: g.spec() for g in Grader.objects.filter(team=team)}
    saved.update(drafts or {})
    out: dict[str, dict[str, Any]] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in out:
            continue
        if name not in saved:
            raise ConfigError("graders", f"names the grader {name!r}, which your team does not have")
        out[name] = dict(saved[name])
        todo.extend(str(n) for n in (out[name].get("weights") or {}))
    return out


def task_definition(*, task: Task, drafts: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """What `agents.envs.task.Task(definition=...)` takes for this task: its roles, team reward,
    rounds and the specs of every grader they reach, as they are now."""
    definition: dict[str, Any] = {
        "roles": [{k: v for k, v in role.items() if v is not None} for role in (task.roles or [])],
        "rounds": task.rounds,
        "graders": grader_set(team=task.team_id, names=task.grader_names(), drafts=drafts),
    }
    if task.team_grader:
        definition["team"] = {"grader": task.team_grader, "role": task.team_role}
    if task.description:
        definition["description"] = task.description
    return definition


def task_env_args(*, team: Team | int, env_args: Mapping[str, Any]) -> dict[str, Any]:
    """A `task` topology's `env_args` as a run takes them: `{"task": "<name>"}` becomes
    `{"definition": ...}`, the task's whole definition now (so the run's snapshot keeps it). Any
    other env_args are returned as they are. ConfigError on `topology.env_args` for an unknown task."""
    name = env_args.get("task")
    if not isinstance(name, str):
        return dict(env_args)
    task = Task.objects.filter(team=team, name=name).first()
    if task is None:
        raise ConfigError("topology.env_args", f"names the task {name!r}, which your team does not have")
    if set(env_args) != {"task"}:
        raise ConfigError("topology.env_args", 'a task topology takes only {"task": "<name>"}')
    try:
        return {"definition": task_definition(task=task)}
    except ConfigError as exc:
        raise ConfigError("topology.env_args", f"task {name!r}: {exc.message}") from None


def task_roles(*, team: Team | int) -> tuple[str, ...]:
    """Every role the team's tasks define (an agent may play one of them)."""
    return tuple(dict.fromkeys(role for task in Task.objects.filter(team=team) for role in task.role_names()))


def sample_rows(*, dataset: Dataset | None, n: int = SAMPLE_ROWS) -> list[dict[str, Any]]:
    """The first rows of a dataset, as its upload stored them (no file is read)."""
    if dataset is None:
        return []
    return [dict(row) for row in (dataset.preview or [])[:n] if isinstance(row, dict)]


def grader_delete_blocker(*, grader: Grader) -> str | None:
    users = [t.name for t in Task.objects.filter(team_id=grader.team_id) if grader.name in t.grader_names()]
    combos = [g.name for g in Grader.objects.filter(team_id=grader.team_id, kind="combination").exclude(pk=grader.pk)
              if grader.name in (g.settings or {}).get("weights", {})]
    names = users + combos
    return f"Used by {', '.join(names)}. Remove it there first (finished runs keep their own copy)." if names else None


def task_topologies(*, task: Task) -> list[Topology]:
    return [t for t in Topology.objects.filter(team_id=task.team_id, environment="task") if (t.env_args or {}).get("task") == task.name]


def task_delete_blocker(*, task: Task) -> str | None:
    names = [t.name for t in task_topologies(task=task)]
    return f"Played by topologies: {', '.join(names)}. Delete them or point them elsewhere first." if names else None


def grader_yaml(*, grader: Grader) -> str:
    """The grader as YAML (`name` and its spec): what its Export link downloads."""
    return yaml.safe_dump({"graders": {grader.name: grader.spec()}}, sort_keys=False, allow_unicode=True)


def task_yaml(*, task: Task) -> str:
    """The task as a run's `topology` section would hold it (environment `task`, its definition)."""
    return yaml.safe_dump({"name": task.name, "topology": {"environment": "task", "env_args": {"definition": task_definition(task=task)}}},
                          sort_keys=False, allow_unicode=True)

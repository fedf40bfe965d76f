"""Graders and tasks: the team's own rewards and tasks, defined in the browser and tried on a
dataset's first rows before they are saved (`agents.graders`, `agents.envs.task`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction

from agents.envs.task import check_definition, render
from agents.graders import Grade, GraderError, Item, check_graders, grade_batch
from training.config import ConfigError
from webapp.catalog import graders as reads
from webapp.catalog.services.names import check_name_free, free_name
from webapp.models import Agent, Dataset, Grader, ModelSource, Task, Team, Topology, TopologyAgent
from webapp.teams.audit import Verb, audit_record


def _AS_IS_FIRST() -> Any:  # noqa: N802 (a name as given, then name-2, name-3...)
    return ("", *(f"-{i}" for i in range(2, 1000)))


GRADER_FIELDS = ("name", "kind", "description", "settings", "code")
TASK_FIELDS = ("name", "description", "dataset", "roles", "team_grader", "team_role", "rounds")


@dataclass(frozen=True)
class TriedRow:
    """One sample row and what each grader made of the answer tried on it."""

    row: dict[str, Any]
    prompts: dict[str, str] = field(default_factory=dict)
    """Role -> the prompt it sees for this row (a task's try)."""
    grades: list[tuple[str, str, Grade]] = field(default_factory=list)
    """(what was graded, grader name, its grade): "answerer" or "team", and the grader."""

    @property
    def failed(self) -> list[str]:
        return [f"{what} ({name}): {grade.error}" for what, name, grade in self.grades if not grade.ok]


# == graders ==========================================================================================


def grader_save(*, team: Team, instance: Grader | None = None, actor: User | None = None, try_on: Dataset | None = None,
                answer: str = "", **values: Any) -> Grader:
    """Create or update a grader. With `try_on`, it is first tried on that dataset's first rows with
    `answer` (`grader_try`); a grader that fails on any of them (raises, times out, returns what is
    not a finite number) is refused with the reason, and nothing is saved."""
    grader = instance or Grader(team=team)
    for key in GRADER_FIELDS:
        if key in values:
            setattr(grader, key, values[key])
    check_name_free(grader)
    grader.full_clean()
    if try_on is not None:
        failed = [f"row {i}: {problem}" for i, tried in enumerate(grader_try(team=team, grader=grader, dataset=try_on, answer=answer), 1)
                  for problem in tried.failed]
        if failed:
            raise ValidationError({"code" if grader.kind == "python" else "settings": f"It failed when tried, so it was not saved: {failed[0]}"})
    with transaction.atomic():
        created = grader.pk is None
        grader.save()
        if created:
            audit_record(team=team, actor=actor, verb=Verb.CREATE, obj=grader, kind=grader.kind)
    return grader


def grader_try(*, team: Team, grader: Grader, dataset: Dataset | None, answer: str) -> list[TriedRow]:
    """The grader (saved or not; checked) on `answer` for each of the dataset's first rows (with no
    dataset, one empty row). One sandbox process grades them all for a Python grader."""
    if dataset is not None and dataset.team_id != team.pk:
        raise ValidationError({"dataset": "Pick one of your team's datasets."})
    rows = reads.sample_rows(dataset=dataset) or [{}]
    try:
        graders = check_graders(reads.grader_set(team=team, names=[grader.name], drafts={grader.name: grader.spec()}))
    except (ConfigError, GraderError) as exc:
        raise ValidationError({"settings": str(exc)}) from None
    grades = grade_batch(graders, grader.name, [Item(answer, row) for row in rows])
    return [TriedRow(row=row, grades=[("answer", grader.name, g)]) for row, g in zip(rows, grades)]


def grader_delete(*, grader: Grader, actor: User | None = None) -> None:
    if blocker := reads.grader_delete_blocker(grader=grader):
        raise ValidationError(blocker)
    with transaction.atomic():
        audit_record(team=grader.team_id, actor=actor, verb=Verb.DELETE, obj=grader, kind=grader.kind)
        grader.delete()


# == tasks ============================================================================================


def task_save(*, team: Team, instance: Task | None = None, actor: User | None = None, answers: dict[str, str] | None = None,
              **values: Any) -> Task:
    """Create or update a task; its definition (roles, their graders, the team reward) must be one
    the `task` environment takes. With `answers` (role -> text) and a dataset, it is first tried on
    the dataset's first rows (`task_try`): a grader that fails there is refused with the reason."""
    task = instance or Task(team=team)
    for key in TASK_FIELDS:
        if key in values:
            setattr(task, key, values[key])
    check_name_free(task)
    task.full_clean()
    _check_task(task)
    if answers and task.dataset is not None:
        failed = [f"row {i}: {problem}" for i, tried in enumerate(task_try(team=team, task=task, answers=answers), 1) for problem in tried.failed]
        if failed:
            raise ValidationError({"roles": f"A grader failed when tried, so the task was not saved: {failed[0]}"})
    with transaction.atomic():
        created = task.pk is None
        task.save()
        if created:
            audit_record(team=team, actor=actor, verb=Verb.CREATE, obj=task, roles=task.role_names())
    return task


def _check_task(task: Task) -> dict[str, Any]:
    try:
        return check_definition(reads.task_definition(task=task))
    except ConfigError as exc:
        raise ValidationError({"roles": exc.message}) from None
    except GraderError as exc:
        where = exc.field.removeprefix("definition.")
        key = "team_grader" if where.startswith("team") else "rounds" if where == "rounds" else "roles"
        raise ValidationError({key: f"{where}: {exc.message}"}) from None


def task_try(*, team: Team, task: Task, answers: dict[str, str]) -> list[TriedRow]:
    """The task (saved or not) on its dataset's first rows: each role's prompt, and each role's grader
    (and the team's) on the answer typed for that role, the earlier roles' answers as its turns."""
    if task.dataset is not None and task.dataset.team_id != team.pk:
        raise ValidationError({"dataset": "Pick one of your team's datasets."})
    definition = _check_task(task)
    graders = definition["graders"]
    rows = reads.sample_rows(dataset=task.dataset) or [{}]
    tried = [TriedRow(row=row) for row in rows]
    turns: tuple[tuple[str, str], ...] = ()
    for role in definition["roles"]:
        name, answer = role["name"], str(answers.get(role["name"], ""))
        for t in tried:
            try:
                t.prompts[name] = render(role["prompt"], t.row)
            except KeyError as exc:
                t.prompts[name] = f"(cannot be shown: {exc.args[0]})"
        items = [Item(answer, t.row, turns) for t in tried]
        if role["grader"]:
            for t, g in zip(tried, grade_batch(graders, role["grader"], items)):
                t.grades.append((name, role["grader"], g))
        team = definition["team"]
        if team is not None and team["role"] == name:
            for t, g in zip(tried, grade_batch(graders, team["grader"], items)):
                t.grades.append(("team", team["grader"], g))
        turns = (*turns, (name, answer))
    return tried


def task_delete(*, task: Task, actor: User | None = None) -> None:
    if blocker := reads.task_delete_blocker(task=task):
        raise ValidationError(blocker)
    with transaction.atomic():
        audit_record(team=task.team_id, actor=actor, verb=Verb.DELETE, obj=task)
        task.delete()


@transaction.atomic
def task_topology_create(*, task: Task, model_source: ModelSource, specialization: str = "lora", actor: User | None = None) -> Topology:
    """A topology that plays the task: one new agent per role (named after it, on `model_source`),
    in the task's turn order, with the environment `task` and `{"task": "<name>"}`."""
    if model_source.team_id != task.team_id:
        raise ValidationError({"model_source": "Pick one of your team's models."})
    agents = []
    for role in task.role_names():
        agent = Agent(team_id=task.team_id, name=free_name(Agent, task.team, role, max_length=40, suffixes=_AS_IS_FIRST()), role=role, model_source=model_source)
        agent.full_clean()
        agent.save()
        agents.append(agent)
    topology = Topology(team_id=task.team_id, name=free_name(Topology, task.team, task.name, max_length=100, suffixes=_AS_IS_FIRST()), environment="task",
                        env_args={"task": task.name}, max_turns=len(agents) * task.rounds,
                        specialization=specialization if len(agents) > 1 or specialization == "single" else "single")
    topology.full_clean()
    topology.save()
    TopologyAgent.objects.bulk_create(TopologyAgent(topology=topology, agent=a, position=i) for i, a in enumerate(agents, start=1))
    audit_record(team=task.team_id, actor=actor, verb=Verb.CREATE, obj=topology, environment="task", task=task.name,
                 agents=[a.name for a in agents])
    return topology

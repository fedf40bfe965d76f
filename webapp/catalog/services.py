"""The catalog's workflows: model sources, agents, topologies and datasets (uploaded or
generated), and the environments they are built for. Every write to them goes through here.

Functions are keyword-only and named `<entity>_<action>`. Domain errors are Django
`ValidationError`s keyed by the field at fault, so a view shows them next to that field.
`topology_config_tree` and `dataset_config_tree` give the parts of a run config a topology and a
dataset stand for (`webapp.runs.services` builds runs from them).
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import UploadedFile
from django.db import transaction

from agents import plugins
from agents.base import Environment, fields_of
from agents.envs import EnvironmentInfo, describe_environment, list_environments, load_environment
from training.config import ConfigError
from training.data import DataError, DataErrors, read_rows
from webapp.core.private import data_dir_tighten, private_file
from webapp.models import (
    Agent,
    Dataset,
    ModelSource,
    Run,
    Team,
    Topology,
    TopologyAgent,
)
from webapp.teams.audit import Verb, audit_record

log = logging.getLogger(__name__)


PREVIEW_ROWS = 5


PREVIEW_CHARS = 300


# == environments (agents.envs) =====================================================================


def environment_infos() -> dict[str, EnvironmentInfo]:
    """The environments the forms offer (name, summary, roles, required fields, arguments): the
    built-ins, then the plugins the operator registered (`agents.plugins`, named by their dotted
    path). A registered plugin whose class cannot even be described is logged and left out."""
    infos = {info.name: info for info in list_environments()}
    for path, cls in plugins.registered(plugins.ENVIRONMENT).items():
        try:
            infos[path] = describe_environment(path, cls)
        except Exception as exc:  # noqa: BLE001 (an operator's broken plugin must not take every form down)
            log.warning("environment plugin %s is left out: %s", path, exc)
    return infos


def environment_names() -> list[str]:
    return list(environment_infos())


def environment_load(*, name: str, env_args: Mapping[str, Any] | None = None, args_field: str = "env_args") -> Environment:
    """The environment, or a ValidationError on `environment` (unknown) or `args_field` (bad args)."""
    if name not in environment_names():
        raise ValidationError({"environment": f"Unknown environment {name!r}."})
    try:
        return load_environment(name, **dict(env_args or {}))
    except Exception as exc:  # an environment's own argument checks raise what they like
        raise ValidationError({args_field: f"{name} rejected these arguments: {exc}"}) from None


def environment_describe(*, name: str) -> EnvironmentInfo | None:
    """What pages show about an environment; None when there is no such built-in."""
    return environment_infos().get(name)


def environment_roles() -> dict[str, tuple[str, ...]]:
    """Environment name -> the roles agents can play there."""
    return {name: info.roles for name, info in environment_infos().items()}


# == model sources ==================================================================================


def model_source_save(*, team: Team, name: str, source: str, notes: str = "", instance: ModelSource | None = None,
                      actor: User | None = None) -> ModelSource:
    """Create or update a model source; `ModelSource.clean` checks the source like the engine.
    `actor` (here and below): the member doing it, for the audit trail (None: Troupe itself)."""
    obj = instance or ModelSource(team=team)
    obj.name, obj.source, obj.notes = name, source, notes
    _check_name_free(obj)
    obj.full_clean()
    with transaction.atomic():
        obj.save()
        if instance is None:
            audit_record(team=team, actor=actor, verb=Verb.CREATE, obj=obj, source=obj.source)
    return obj


def model_source_delete_blocker(*, source: ModelSource) -> str | None:
    """Why this model cannot be deleted now (the confirmation page says it before the click), or None."""
    users = list(source.agents.values_list("name", flat=True))
    return f"Agents use this model: {', '.join(users)}. Point them elsewhere first." if users else None


def model_source_delete(*, source: ModelSource, actor: User | None = None) -> None:
    if blocker := model_source_delete_blocker(source=source):
        raise ValidationError(blocker)
    with transaction.atomic():
        audit_record(team=source.team_id, actor=actor, verb=Verb.DELETE, obj=source, source=source.source)
        source.delete()


# == agents =========================================================================================

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
    for check in (lambda: _check_name_free(agent), agent.full_clean):
        try:
            check()
        except ValidationError as exc:
            for field, messages in exc.message_dict.items():
                problems[field] += [m for m in messages if m not in problems[field]]
    roles = environment_roles()
    if agent.role and not any(agent.role in env_roles for env_roles in roles.values()):
        by_env = "; ".join(f"{env}: {', '.join(env_roles)}" for env, env_roles in roles.items())
        problems["role"].append(f"No environment has the role {agent.role!r}, so no topology could use this agent. Roles by environment: {by_env}.")
    if problems:
        raise ValidationError(dict(problems))
    agent.save()
    return agent


def agent_duplicate(*, agent: Agent, actor: User | None = None) -> Agent:
    copy = Agent(team=agent.team, **{k: getattr(agent, k) for k in AGENT_FIELDS if k != "name"})
    copy.name = _free_name(Agent, agent.team, agent.name, max_length=40)
    copy.full_clean()
    with transaction.atomic():
        copy.save()
        audit_record(team=agent.team_id, actor=actor, verb=Verb.CREATE, obj=copy, role=copy.role, copy_of=agent.name)
    return copy


def agent_delete_blocker(*, agent: Agent) -> str | None:
    names = sorted(set(agent.memberships.values_list("topology__name", flat=True)))
    return f"Used by topologies: {', '.join(names)}. Remove it there first." if names else None


def agent_delete(*, agent: Agent, actor: User | None = None) -> None:
    if blocker := agent_delete_blocker(agent=agent):
        raise ValidationError(blocker)
    with transaction.atomic():
        audit_record(team=agent.team_id, actor=actor, verb=Verb.DELETE, obj=agent, role=agent.role)
        agent.delete()


# == topologies =====================================================================================


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
    _check_name_free(topology)
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


def tool_template_notes(*, agents: list[Agent]) -> list[str]:
    """What the author of a topology should know about its agents' tools: for each agent with
    tools whose model's chat template cannot render them (or cannot be read here yet), a sentence."""
    from training.models import local_tokenizer
    from training.tool_turns import tool_support

    notes = []
    for agent in agents:
        if not agent.tools:
            continue
        source = agent.model_source.source
        tokenizer = local_tokenizer(source)
        if tokenizer is None:
            notes.append(f"{agent.name}: {source} is not on this machine yet, so whether its chat template renders tools is "
                         "checked when a run loads it (the run's log says).")
        elif not tool_support(tokenizer):
            notes.append(f"{agent.name}: the chat template of {source} has no tool support. Troupe describes "
                         f"{', '.join(agent.tools)} in the agent's system prompt and returns each result as a user message; "
                         "a model trained for tool calls (its template renders tools=) follows them far more reliably.")
    return notes


def topology_problems(*, topology: Topology, agents: list[Agent]) -> dict[str, list[str]]:
    """Every reason these agents, in this order, cannot make this topology, by field (all of them
    at once, for the form to show): unknown environment or bad arguments, roles the environment
    lacks, repeats, another team's agents, a specialization that does not fit."""
    problems: dict[str, list[str]] = defaultdict(list)
    env: Environment | None = None
    try:
        env = environment_load(name=topology.environment, env_args=topology.env_args)
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
        name=_free_name(Topology, topology.team, topology.name, max_length=100),
        environment=topology.environment,
        env_args=topology.env_args,
        max_turns=topology.max_turns,
        specialization=topology.specialization,
        agents=topology.ordered_agents(),
    )


def topology_delete_blocker(*, topology: Topology) -> str | None:
    if topology.runs.filter(status__in=Run.ACTIVE).exists():
        return "A queued or running run uses this topology; cancel it first."
    return None


def topology_delete_effects(*, topology: Topology) -> list[str]:
    """What deleting this topology does to the runs that used it, for the confirmation page."""
    runs = topology.runs.order_by("-created")
    count = runs.count()
    if not count:
        return []
    names = ", ".join(f"#{pk} {name}" for pk, name in runs.values_list("pk", "name")[:5])
    more = f" and {count - 5} more" if count > 5 else ""
    return [f"{count} run{'s' if count > 1 else ''} used it: {names}{more}. They keep their config snapshot (each can be "
            "re-run or cloned from it), but their pages will name no topology. Its agents stay."]


def topology_delete(*, topology: Topology, actor: User | None = None) -> None:
    if blocker := topology_delete_blocker(topology=topology):
        raise ValidationError(blocker)
    with transaction.atomic():
        audit_record(team=topology.team_id, actor=actor, verb=Verb.DELETE, obj=topology, environment=topology.environment)
        topology.delete()  # finished runs keep their config snapshot


# == datasets =======================================================================================


def dataset_upload(*, team: Team, name: str, environment: str, upload: UploadedFile, eval_fraction: float,
                   actor: User | None = None) -> Dataset:
    """Validate an uploaded JSONL/CSV file completely, then store it under a random name.

    Either the file is stored and the row saved, or neither: errors leave nothing behind."""
    dataset = Dataset(
        team=team, name=name, kind=Dataset.Kind.UPLOAD, environment=environment, eval_fraction=eval_fraction,
        original_filename=(upload.name or "upload")[-255:], size_bytes=upload.size or 0,
    )
    _check_name_free(dataset)
    dataset.full_clean(exclude=["file", "format"])
    env = environment_load(name=environment)
    if not upload.size:
        raise ValidationError({"file": "The file is empty."})
    if upload.size > settings.TROUPE_UPLOAD_MAX_BYTES:
        raise ValidationError({"file": f"The file is {upload.size:,} bytes; the limit is {settings.TROUPE_UPLOAD_MAX_BYTES:,}."})
    dataset.format = _upload_format(upload)

    folder = Path(settings.TROUPE_DATA_DIR) / "datasets" / str(team.pk)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    data_dir_tighten(folder.parent, deep=False)  # datasets/ and this team's folder: the owner's alone
    token = secrets.token_hex(16)
    final = folder / f"{token}.{dataset.format}"
    part = folder / f".{token}.part.{dataset.format}"  # read_rows picks the format by suffix
    try:
        private_file(part)  # 0600 whatever the umask
        with part.open("wb") as out:
            for chunk in upload.chunks():
                out.write(chunk)
        rows = _dataset_read(part, env, field="file")
        part.rename(final)
        dataset.file = str(final.relative_to(settings.TROUPE_DATA_DIR))
        _dataset_describe(dataset, rows, row_count=len(rows))
        with transaction.atomic():
            dataset.save()
            audit_record(team=team, actor=actor, verb=Verb.CREATE, obj=dataset, kind=dataset.kind,
                         file=dataset.original_filename, rows=dataset.row_count)
    except BaseException:
        part.unlink(missing_ok=True)
        final.unlink(missing_ok=True)
        raise
    return dataset


def _upload_format(upload: UploadedFile) -> str:
    """JSONL or CSV by extension, else by content (a first `{` means JSONL), as the engine reads it."""
    suffix = Path(upload.name or "").suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return Dataset.Format.JSONL
    if suffix == ".csv":
        return Dataset.Format.CSV
    upload.seek(0)
    head = upload.read(4096).lstrip()
    upload.seek(0)
    return Dataset.Format.JSONL if head.startswith((b"{", b"\xef\xbb\xbf{")) else Dataset.Format.CSV


def _dataset_read(path: Path, env: Environment, *, field: str) -> list[dict[str, Any]]:
    """The rows, checked against the environment's declared row fields; a ValidationError on
    `field` naming the line, the field and the limit otherwise."""
    try:
        fields = fields_of(env)
    except ValueError as exc:  # a plugin's malformed declaration
        raise ValidationError({"environment": str(exc)}) from None
    try:
        return read_rows(
            path,
            fields=fields,
            max_rows=settings.TROUPE_UPLOAD_MAX_ROWS,
            max_bytes=settings.TROUPE_UPLOAD_MAX_BYTES,
        )
    except DataError as exc:  # every bad line found, each its own message
        needs = f"{env.name} rows need: {', '.join(env.required_fields)}."
        problems = [str(p) for p in exc.problems]
        if isinstance(exc, DataErrors) and exc.stopped:
            problems.append(f"Stopped looking after {len(exc.problems)} problems; lines after line {exc.problems[-1].line} were not checked.")
        if any("missing" in p.message for p in exc.problems):
            problems.append(needs)
        raise ValidationError({field: problems}) from None


def _dataset_describe(dataset: Dataset, rows: list[dict[str, Any]], *, row_count: int) -> None:
    schema: dict[str, None] = {}
    for row in rows:
        schema.update(dict.fromkeys(row))
    dataset.schema = list(schema)
    dataset.preview = [{k: _short(v) for k, v in row.items()} for row in rows[:PREVIEW_ROWS]]
    dataset.row_count = row_count
    dataset.status, dataset.status_message = Dataset.Status.VALID, _formula_note(rows)


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


"""A cell starting with one of these is a formula to a spreadsheet (CSV injection)."""


_PLAIN_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def _formula_note(rows: list[dict[str, Any]]) -> str:
    """Flag cells a spreadsheet would run as formulas if the rows were opened as CSV (plain
    signed numbers such as -3 are fine); the dataset stays valid: training reads them as text."""
    count, first = 0, ""
    for i, row in enumerate(rows, start=1):
        for key, value in row.items():
            if isinstance(value, str) and value.startswith(FORMULA_START) and not _PLAIN_NUMBER.match(value.strip()):
                count += 1
                first = first or f"row {i}, field {key}"
    if not count:
        return ""
    return (f"Note: {count} cell{'s' if count > 1 else ''} start{'' if count > 1 else 's'} with =, +, -, @ or a tab "
            f"(first: {first}); a spreadsheet would run such a cell as a formula. Troupe's CSV exports prefix them with '.")


def _short(value: Any) -> Any:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def dataset_generator_create(
    *, team: Team, name: str, environment: str, env_args: dict[str, Any], size: int, eval_size: int, actor: User | None = None,
) -> Dataset:
    """A dataset made by the environment's procedural generator; a sample is generated now."""
    dataset = Dataset(team=team, kind=Dataset.Kind.GENERATOR)
    with transaction.atomic():
        dataset_generator_update(dataset=dataset, name=name, environment=environment, env_args=env_args, size=size, eval_size=eval_size)
        audit_record(team=team, actor=actor, verb=Verb.CREATE, obj=dataset, kind=dataset.kind, environment=environment)
    return dataset


def dataset_generator_update(
    *, dataset: Dataset, name: str, environment: str, env_args: dict[str, Any], size: int, eval_size: int
) -> Dataset:
    dataset.name, dataset.environment, dataset.env_args = name, environment, env_args or {}
    dataset.size, dataset.eval_size = size, eval_size
    if not size:
        raise ValidationError({"size": "Generate at least one training task."})
    _check_name_free(dataset)
    dataset.full_clean()
    env = environment_load(name=environment, env_args=dataset.env_args)
    try:
        sample = env.generate(PREVIEW_ROWS, seed=0)
    except Exception as exc:  # plugin code: any failure means these arguments do not work
        raise ValidationError({"env_args": f"{environment} could not generate tasks with these arguments: {exc}"}) from None
    _dataset_describe(dataset, sample, row_count=size + eval_size)
    dataset.save()
    return dataset


def dataset_upload_update(*, dataset: Dataset, name: str, eval_fraction: float) -> Dataset:
    dataset.name, dataset.eval_fraction = name, eval_fraction
    _check_name_free(dataset)
    dataset.full_clean()
    dataset.save()
    return dataset


def dataset_revalidate(*, dataset: Dataset) -> Dataset:
    """Check a stored dataset again (the file is still there, the environment still accepts it)."""
    try:
        env = environment_load(name=dataset.environment, env_args=dataset.env_args if dataset.kind == Dataset.Kind.GENERATOR else {})
        if dataset.kind == Dataset.Kind.UPLOAD:
            if dataset.path is None or not dataset.path.is_file():
                raise ValidationError("The stored file is missing.")
            rows = _dataset_read(dataset.path, env, field="file")
            _dataset_describe(dataset, rows, row_count=len(rows))
        else:
            env.generate(1, seed=0)
            dataset.status, dataset.status_message = Dataset.Status.VALID, ""
    except ValidationError as exc:
        dataset.status, dataset.status_message = Dataset.Status.INVALID, "; ".join(exc.messages)
    except Exception as exc:  # plugin code: any failure makes the dataset invalid
        dataset.status, dataset.status_message = Dataset.Status.INVALID, str(exc)
    dataset.save()
    return dataset


def dataset_delete_blocker(*, dataset: Dataset) -> str | None:
    if dataset.runs.filter(status__in=Run.ACTIVE).exists():
        return "A queued or running run uses this dataset; cancel it first."
    return None


def dataset_delete_effects(*, dataset: Dataset) -> list[str]:
    """What deleting this dataset does to the runs that used it, for the confirmation page."""
    effects = []
    runs = dataset.runs.order_by("-created")
    count = runs.count()
    if count:
        names = ", ".join(f"#{pk} {name}" for pk, name in runs.values_list("pk", "name")[:5])
        more = f" and {count - 5} more" if count > 5 else ""
        effects.append(f"{count} run{'s' if count > 1 else ''} used it: {names}{more}. They keep their config, metrics and "
                       "checkpoints, but their pages will name no dataset.")
        if dataset.kind != Dataset.Kind.GENERATOR:
            effects.append("Its file is deleted: resuming or re-running those runs needs the file uploaded again.")
    if dataset.kind != Dataset.Kind.GENERATOR:
        effects.insert(0, f"Its file goes from disk ({dataset.original_filename}, {dataset.row_count or 0:,} rows).")
    return effects


def dataset_delete(*, dataset: Dataset, actor: User | None = None) -> None:
    if blocker := dataset_delete_blocker(dataset=dataset):
        raise ValidationError(blocker)
    path = dataset.path
    with transaction.atomic():
        audit_record(team=dataset.team_id, actor=actor, verb=Verb.DELETE, obj=dataset, kind=dataset.kind)
        dataset.delete()
        if path is not None:
            transaction.on_commit(lambda: path.unlink(missing_ok=True))


def topology_config_tree(*, topology: Topology) -> dict[str, Any]:
    """The `model` and `topology` sections of a RunConfig for a topology (its agents in order)."""
    agents = topology.ordered_agents()
    if not agents:
        raise ConfigError("topology.agents", f"topology {topology.name!r} has no agents")
    return {
        "model": {"source": agents[0].model_source.source},
        "topology": {
            "environment": topology.environment,
            "env_args": dict(topology.env_args),
            "specialization": topology.specialization,
            "agents": [
                {
                    "name": a.name,
                    "role": a.role,
                    "instructions": a.instructions,
                    "model": a.model_source.source,
                    "trainable": a.trainable,
                    "temperature": a.temperature,
                    "max_new_tokens": a.max_new_tokens,
                    "tools": list(a.tools or []),
                }
                for a in agents
            ],
            "max_turns": topology.max_turns,
        },
    }


def dataset_matching(*, topology: Topology) -> Dataset | None:
    """The team's valid dataset a run of this topology most likely wants: one for its environment,
    with the topology's own environment arguments first (a generator at its level), newest first."""
    candidates = list(Dataset.objects.filter(team_id=topology.team_id, environment=topology.environment,
                                             status=Dataset.Status.VALID).exclude(kind=Dataset.Kind.CHATS).order_by("-created", "-id")[:50])
    same_args = [d for d in candidates if d.kind == Dataset.Kind.GENERATOR and d.env_args == topology.env_args]
    return (same_args or candidates or [None])[0]


def topology_matching(*, dataset: Dataset) -> Topology | None:
    """The team's topology a run on this dataset most likely wants: one for its environment (the
    same environment arguments first), the most recently changed first."""
    candidates = list(Topology.objects.filter(team_id=dataset.team_id, environment=dataset.environment).order_by("-updated", "-id")[:50])
    same_args = [t for t in candidates if dataset.kind == Dataset.Kind.GENERATOR and t.env_args == dataset.env_args]
    return (same_args or candidates or [None])[0]


def run_pair_complete(*, team: Team, topology_id: int | None, dataset_id: int | None) -> tuple[Topology | None, Dataset | None]:
    """The team's topology and dataset with these ids, the missing one filled in by a match
    (`dataset_matching`, `topology_matching`): what the run form starts from."""
    topology = Topology.objects.filter(team=team, pk=topology_id).first() if topology_id else None
    dataset = Dataset.objects.filter(team=team, pk=dataset_id).first() if dataset_id else None
    if topology is not None and dataset is None and not dataset_id:
        dataset = dataset_matching(topology=topology)
    elif dataset is not None and topology is None and not topology_id:
        topology = topology_matching(dataset=dataset)
    return topology, dataset


def dataset_config_tree(*, dataset: Dataset) -> tuple[dict[str, Any], dict[str, Any]]:
    """(env_args the dataset adds to the topology's, the `data` section) for a valid dataset."""
    if dataset.status != Dataset.Status.VALID:
        raise ConfigError("data", f"dataset {dataset.name!r} is invalid: {dataset.status_message}")
    if dataset.kind == Dataset.Kind.GENERATOR:
        return dict(dataset.env_args), {"path": None, "train_size": dataset.size, "eval_size": dataset.eval_size or 0}
    train, held = dataset.split  # the engine's split of the file: record its sizes, not the generator default
    return {}, {"path": str(dataset.path), "eval_fraction": dataset.eval_fraction, "eval_size": held, "train_size": max(train, 1)}


# == helpers ===================================================================================


def _check_name_free(obj: Any) -> None:
    """Names are unique per team; say so next to the name field (the DB constraint backs it)."""
    taken = type(obj).objects.filter(team_id=obj.team_id, name=obj.name).exclude(pk=obj.pk).exists()
    if taken:
        kind = str(type(obj)._meta.verbose_name)
        raise ValidationError({"name": f"Your team already has {'an' if kind[:1] in 'aeiou' else 'a'} {kind} named {obj.name!r}."})


def _free_name(model: Any, team: Team, name: str, *, max_length: int) -> str:
    """`name-copy`, `name-copy2`, ... the first one the team does not use yet."""
    for i in range(1, 1000):
        suffix = "-copy" if i == 1 else f"-copy{i}"
        candidate = name[: max_length - len(suffix)] + suffix
        if not model.objects.filter(team=team, name=candidate).exists():
            return candidate
    raise ValidationError("Too many copies of this name.")

"""The catalog's reads: what blocks a delete and what it would do, the run-config sections a
topology and a dataset stand for (`webapp.runs.services` builds runs from them), the matching
topology or dataset the run form starts from, and notes on agents' tools."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training.config import ConfigError
from webapp.catalog.graders import task_env_args
from webapp.models import Agent, Dataset, Job, ModelSource, Run, Team, Topology


def model_source_delete_blocker(*, source: ModelSource) -> str | None:
    """Why this model cannot be deleted now (the confirmation page says it before the click), or None."""
    users = list(source.agents.values_list("name", flat=True))
    return f"Agents use this model: {', '.join(users)}. Point them elsewhere first." if users else None


def agent_delete_blocker(*, agent: Agent) -> str | None:
    names = sorted(set(agent.memberships.values_list("topology__name", flat=True)))
    return f"Used by topologies: {', '.join(names)}. Remove it there first." if names else None


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


def dataset_delete_blocker(*, dataset: Dataset) -> str | None:
    """Why this dataset cannot be deleted now, or None: a queued or running run trains on it (its
    `dataset`), or learns from or reads its file (an SFT run's `sft.path`, any run's `data.path`),
    or a queued or running job evaluates on it."""
    if dataset.runs.filter(status__in=Run.ACTIVE).exists():
        return "A queued or running run uses this dataset; cancel it first."
    if dataset.path is not None:
        file = dataset.path.resolve()
        mentioning = Run.objects.filter(team_id=dataset.team_id, status__in=Run.ACTIVE, config_yaml__contains=file.name)
        for run in mentioning.only("pk", "config_yaml"):  # (a stored file's name is random, without spaces: never folded in the YAML)
            if any(Path(path).resolve() == file for field, path in run.reads().items() if field in ("data.path", "sft.path")):
                return f"Run #{run.pk} (queued or running) learns from this dataset's file; cancel it first, or wait for it to end."
    if dataset.jobs.filter(status__in=Job.ACTIVE).exists():
        return "A queued or running evaluation uses this dataset; wait for it to end."
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


def topology_config_tree(*, topology: Topology) -> dict[str, Any]:
    """The `model` and `topology` sections of a RunConfig for a topology (its agents in order)."""
    agents = topology.ordered_agents()
    if not agents:
        raise ConfigError("topology.agents", f"topology {topology.name!r} has no agents")
    return {
        "model": {"source": agents[0].model_source.source},
        "topology": {
            "environment": topology.environment,
            # a task topology's {"task": name} becomes the task's whole definition now: the run's snapshot keeps it
            "env_args": task_env_args(team=topology.team_id, env_args=topology.env_args) if topology.environment == "task"
            else dict(topology.env_args),
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


def dataset_config_tree(*, dataset: Dataset) -> tuple[dict[str, Any], dict[str, Any]]:
    """(env_args the dataset adds to the topology's, the `data` section) for a valid dataset."""
    if dataset.status != Dataset.Status.VALID:
        raise ConfigError("data", f"dataset {dataset.name!r} is invalid: {dataset.status_message}")
    if dataset.kind == Dataset.Kind.GENERATOR:
        return dict(dataset.env_args), {"path": None, "train_size": dataset.size, "eval_size": dataset.eval_size or 0}
    train, held = dataset.split  # the engine's split of the file: record its sizes, not the generator default
    return {}, {"path": str(dataset.path), "eval_fraction": dataset.eval_fraction, "eval_size": held, "train_size": max(train, 1)}


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


def team_topology(*, team: Team, pk: int) -> Topology | None:
    """The team's topology with this id, or None (another team's is None too)."""
    return Topology.objects.filter(team=team, pk=pk).first()


def team_dataset(*, team: Team, pk: int, kind: str | None = None, valid: bool = False) -> Dataset | None:
    """The team's dataset with this id (of `kind`, and valid if asked), or None."""
    rows = Dataset.objects.filter(team=team, pk=pk)
    rows = rows.filter(kind=kind) if kind else rows
    return (rows.filter(status=Dataset.Status.VALID) if valid else rows).first()


def team_catalog(*, team: Team, model: type[ModelSource | Agent | Topology | Dataset]) -> Any:
    """The team's model sources, agents, topologies or datasets, oldest first (the API's lists)."""
    return model.objects.filter(team=team).order_by("pk")

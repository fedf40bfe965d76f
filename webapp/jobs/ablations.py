"""Ablations of a finished team run, as evaluation jobs: role swap, untrained team, an agent alone,
and (from an experiment's page, which pairs its trials) trained apart.

An ablation is an evaluation job (`Job.Kind.EVALUATE`) whose `params["ablation"]` names it
(`role_swap`, `untrained`, `alone:<agent>`, `apart`): it is claimed, run and recorded like any
evaluation (`services.evaluation_execute`, which hands it to `training.ablation.evaluate_ablation`),
and its result lands in the run's evaluation jobs, labelled. It plays the run's own held-out tasks
with the run's newest checkpoint (the base weights for `untrained`), greedily. `apart` also names a
partner run (`params["partner_run"]`, `["partner_checkpoint"]`): the agents this run froze act with
the weights the partner trained for them.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction

from training.ablation import Ablation, AblationError, ablations_for, check_ablation, partner_agents
from training.config import ConfigError, RunConfig
from webapp.artifacts import files as artifacts
from webapp.catalog import environments
from webapp.jobs.services import job_create
from webapp.models import Checkpoint, Job, Run


def _config_and_env(run: Run) -> tuple[RunConfig, Any]:
    try:
        config = run.to_config()
    except ConfigError as exc:
        raise ValidationError({"ablation": f"This run's config no longer validates: {exc}"}) from None
    env = environments.environment_load(name=config.topology.environment, env_args=config.topology.env_args, args_field="ablation")
    return config, env


def run_ablations(*, run: Run) -> list[Ablation]:
    """The ablations the run's page offers: none while it is active or for a one-agent run."""
    if run.is_active:
        return []
    try:
        config, env = _config_and_env(run)
    except ValidationError:
        return []
    return ablations_for(config, env)


def newest_checkpoint(*, run: Run) -> Checkpoint | None:
    return run.checkpoints.kept().newest()


def ablation_request(*, run: Run, user: User | None, key: str, partner: Run | None = None) -> Job:
    """Queue the ablation `key` of a finished team run (a ValidationError on `ablation` saying why
    not). An ablation already queued, running or done at the same checkpoint is returned instead,
    also to a request at the same moment: the lookup and the insert hold the run's row lock, so
    concurrent requests make one job. `partner` (`apart` only): the finished run of the team that
    trained exactly the agents this run froze; its newest checkpoint gives those agents."""
    if run.is_active:
        raise ValidationError({"ablation": "The run is still going: ablate it once it has finished."})
    try:
        ablation = Ablation.parse(key, paired=True)
    except AblationError as exc:
        raise ValidationError({"ablation": str(exc)}) from None
    if (ablation.kind == "apart") != (partner is not None):
        raise ValidationError({"ablation": "trained apart teams two trials: ablate it from their experiment's page" if partner is None
                                           else f"{ablation.label} takes no partner run"})
    config, env = _config_and_env(run)
    try:
        check_ablation(config, ablation, env)
    except AblationError as exc:
        raise ValidationError({"ablation": str(exc)}) from None
    extra: dict[str, Any] = {}
    if partner is not None:
        extra = _partner_params(run, config, partner)
    checkpoint = None
    if ablation.kind != "untrained":
        checkpoint = _checkpoint_on_disk(run, f"{ablation.label} needs the run's trained weights, and it saved no checkpoint.")
    with transaction.atomic():  # the check and the insert under the run's lock (SQLite: the write lock taken at BEGIN)
        Run.objects.select_for_update().filter(pk=run.pk).first()
        same = Job.objects.filter(run=run, kind=Job.Kind.EVALUATE, params__ablation=ablation.key, checkpoint=checkpoint)
        if partner is not None:
            same = same.filter(params__partner_checkpoint=extra["partner_checkpoint"])
        existing = same.exclude(status=Job.Status.FAILED).order_by("-created").first()
        if existing is not None:
            return existing
        return job_create(
            team=run.team, user=user, kind=Job.Kind.EVALUATE, run=run, checkpoint=checkpoint, dataset=run.dataset,
            params={"config_yaml": config.to_yaml(), "checkpoint_step": checkpoint.step if checkpoint else None,
                    "dataset_name": run.dataset.name if run.dataset else "the run's held-out tasks",
                    "ablation": ablation.key, "ablation_label": ablation.label, **extra},
        )


def _partner_params(run: Run, config: RunConfig, partner: Run) -> dict[str, Any]:
    """The job's params naming `partner`'s newest checkpoint, once `partner` is checked: the same
    team, finished, a config that trained exactly the agents `run` froze, a checkpoint on disk."""
    if partner.team_id != run.team_id or partner.pk == run.pk:
        raise ValidationError({"ablation": "trained apart needs another run of the same team as the partner"})
    if partner.status != Run.Status.SUCCEEDED:
        raise ValidationError({"ablation": f"the partner run #{partner.pk} has not succeeded"})
    try:
        trained = partner_agents(config, partner.to_config())
    except (AblationError, ConfigError) as exc:
        raise ValidationError({"ablation": f"run #{partner.pk} cannot be the partner: {exc}"}) from None
    checkpoint = _checkpoint_on_disk(partner, f"the partner run #{partner.pk} saved no checkpoint")
    return {"partner_run": partner.pk, "partner_checkpoint": checkpoint.pk, "partner_step": checkpoint.step,
            "partner_agents": list(trained)}


def _checkpoint_on_disk(run: Run, none: str) -> Checkpoint:
    """`run`'s newest checkpoint, whose folder is still there; a ValidationError on `ablation`
    saying `none` when it kept none, or what is missing."""
    checkpoint = newest_checkpoint(run=run)
    if checkpoint is None:
        raise ValidationError({"ablation": none})
    try:
        artifacts.checkpoint_folder(run=run, checkpoint=checkpoint)
    except artifacts.ArtifactMissing as exc:
        raise ValidationError({"ablation": str(exc)}) from None
    return checkpoint


def ablation_results(*, runs: list[Run]) -> dict[int, dict[str, list[dict[str, Any]]]]:
    """Run id -> ablation key -> the newest succeeded ablation job's evaluations."""
    out: dict[int, dict[str, list[dict[str, Any]]]] = {}
    jobs = (Job.objects.filter(run__in=runs, kind=Job.Kind.EVALUATE, status=Job.Status.SUCCEEDED, params__has_key="ablation")
            .order_by("created", "id").values("run_id", "params", "result"))
    for job in jobs:
        out.setdefault(job["run_id"], {})[job["params"]["ablation"]] = (job["result"] or {}).get("evaluations", [])
    return out

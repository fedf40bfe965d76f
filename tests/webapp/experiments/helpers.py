"""Shared helpers for the experiment tests: a spec on a team's world, and finishing a trial with a
held-out evaluation as the trainer's sink would record it."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from webapp.experiments import services
from webapp.models import Evaluation, Experiment, Run


def launch(persona: Any, world: Any, *, axes: Any = None, seeds: Any = None, name: str = "lr sweep") -> Experiment:
    spec = services.experiment_spec_build(
        team=persona.team, topology=world.topology, dataset=world.dataset, name=name,
        axes={"optim.lr": [1e-4, 1e-3]} if axes is None else axes, seeds=[0, 1, 2] if seeds is None else seeds,
        advanced_yaml="optim: {steps: 2}\neval: {every: 1}",
    )
    return services.experiment_create(team=persona.team, user=persona.user, spec=spec, topology=world.topology, dataset=world.dataset)


def finish(run: Run, team_success: float, *, status: str = "succeeded", step: int = 2, sampled: float | None = None) -> None:
    """The run ended with a last greedy held-out evaluation of `team_success` (and an earlier one);
    with `sampled`, also a sampled one at its last step (`eval.sampled`)."""
    now = timezone.now()
    Run.objects.filter(pk=run.pk).update(status=status, step=step, started=now - timezone.timedelta(seconds=20), finished=now)
    for at, value in ((0, 0.0), (step, team_success)):
        Evaluation.objects.create(run=run, step=at, temperature=0.0, team_success=value, agents={}, data={
            "step": at, "split": "eval", "temperature": 0.0, "n": 8, "team": {"success": value},
            "agents": {"tool": {"success": value, "reward": 0.5}, "reasoner": {"success": value / 2, "reward": 0.1}}})
    if sampled is not None:
        Evaluation.objects.create(run=run, step=step, temperature=1.0, team_success=sampled, agents={}, data={
            "step": step, "split": "eval", "temperature": 1.0, "n": 8, "team": {"success": sampled}, "agents": {}})


def trials(experiment: Experiment) -> list[Run]:
    return list(experiment.runs.order_by("trial_index", "created"))

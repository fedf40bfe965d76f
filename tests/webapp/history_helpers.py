"""Helpers for the history tests: runs with metrics, evaluations and real (tiny) checkpoints,
written straight to the database and disk the way the worker's sink and trainer write them."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from django.utils import timezone

from webapp.models import Checkpoint, Evaluation, EvaluationEpisode, MetricPoint, Rollout, Run, Team


def make_run(team: Team, template: Run, **fields: Any) -> Run:
    """A run like `template` (same config snapshot) with `fields` changed."""
    values: dict[str, Any] = {
        "name": "run", "config_yaml": template.config_yaml, "topology": template.topology, "dataset": template.dataset,
        "environment": "math_tool", "specialization": "lora", "status": Run.Status.SUCCEEDED,
    }
    values.update(fields)
    return Run.objects.create(team=team, **values)


def add_metrics(run: Run, steps: int, *, agents: tuple[str, ...] = ("tool", "reasoner"), slope: float = 0.01) -> None:
    now = timezone.now()
    MetricPoint.objects.bulk_create([
        MetricPoint(run=run, step=s, time=now + timedelta(seconds=s),
                    values={"reward/total": slope * s, "success": min(1.0, slope * s / 2), "loss": 1.0 / s},
                    agents={a: {"reward/total": slope * s + i, "loss": 0.5 / s} for i, a in enumerate(agents)})
        for s in range(1, steps + 1)
    ])
    Run.objects.filter(pk=run.pk).update(step=steps, total_steps=steps,
                                         final_metrics={"reward/total": slope * steps, "success": min(1.0, slope * steps / 2)})


def add_evaluations(run: Run, points: list[tuple[int, float, dict[str, float]]]) -> None:
    for step, team, agents in points:
        Evaluation.objects.create(run=run, step=step, temperature=0.0, team_success=team,
                                  agents={a: {"success": v, "reward": v - 0.5} for a, v in agents.items()},
                                  data={"step": step, "n": 8, "team": {"success": team}})


def add_evaluation_episodes(evaluation: Evaluation, n: int) -> None:
    """`n` held-out episodes of `evaluation`, each task solved when its index is a multiple of 3."""
    EvaluationEpisode.objects.bulk_create([
        EvaluationEpisode(evaluation=evaluation, episode=i, agent_names=["tool", "reasoner"], success=i % 3 == 0, team_reward=float(i % 3 == 0),
                          data={"task_id": f"eval-{i}", "success": i % 3 == 0, "question": f"Compute {i} * 3.", "turns": [
                              {"index": 0, "agent": "tool", "role": "tool", "prompt": f"Compute {i} * 3.", "chosen": 0,
                               "candidates": [{"text": f"print({i} * 3)", "local": 0.0, "tool_output": str(i * 3)}]}]})
        for i in range(n)
    ])


def add_rollouts(run: Run, steps: int, per_step: int = 2) -> None:
    Rollout.objects.bulk_create([
        Rollout(run=run, step=s, episode=e, agent_names=["tool", "reasoner"], success=e == 0, team_reward=float(e == 0),
                data={"task_id": f"t{s}-{e}", "step": s, "success": e == 0, "question": f"Compute {s} + {e}.", "turns": []})
        for s in range(1, steps + 1) for e in range(per_step)
    ])


def save_checkpoint(run: Run, step: int, *, perturb: float = 0.05) -> Checkpoint:
    """A real checkpoint of the run's config (tiny random model): PEFT adapters (or full models)
    as `save_policies` writes them, the adapters' B matrices moved off zero so that the
    "trained" agents differ from the base."""
    import torch

    from training.policies import build_policies, save_policies

    config = run.to_config()
    policies = build_policies(config, device=torch.device("cpu"))
    if perturb:
        gen = torch.Generator().manual_seed(step)
        with torch.no_grad():
            for policy in policies.policies.values():
                for p in policy.params:
                    p.add_(torch.randn(p.shape, generator=gen) * perturb)
    out = Path(run.out_dir)
    folder = out / "checkpoints" / f"step-{step:06d}"
    save_policies(policies, folder)
    torch.save({"step": step, "config": config.to_yaml()}, folder / "trainer_state.pt")
    return Checkpoint.objects.create(run=run, step=step, path=str(folder))


def with_out_dir(run: Run, data_dir: Path) -> Run:
    out = data_dir / "runs" / str(run.pk)
    out.mkdir(parents=True, exist_ok=True)
    Run.objects.filter(pk=run.pk).update(out_dir=str(out))
    run.refresh_from_db()
    return run


def held_out_episode(i: int, *, solved_every: int) -> dict[str, Any]:
    """Task `i` of a held-out evaluation as the engine reports it: the reasoner acts on every task,
    the tool too on odd ones; solved when `i` is a multiple of `solved_every`; each answer says
    whose it is ("answer of task 3 by tool")."""
    agents = ["tool", "reasoner"] if i % 2 else ["reasoner"]
    return {"task_id": f"eval-{i}", "success": i % solved_every == 0, "team_reward": float(i % solved_every == 0), "turns": [
        {"index": j, "agent": a, "role": a, "prompt": f"task {i}", "chosen": 0,
         "candidates": [{"text": f"answer of task {i} by {a}", "local": 0.0}]} for j, a in enumerate(agents)]}

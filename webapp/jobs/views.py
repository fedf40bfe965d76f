"""Pages that start jobs: a run's held-out evaluation, ablations and LoRA merge, and the playground.

Each view: fetch within the current team (another team's object is a 404), call one service,
render or redirect; htmx requests get the page's named partial (`page.html#name`).
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from training.config import ConfigError
from webapp.catalog import environments
from webapp.jobs import ablations, services
from webapp.jobs.forms import EvaluationForm, PlaygroundForm, playground_agents
from webapp.models import Checkpoint, Job, Run, Topology
from webapp.teams.access import TeamRequest, team_object_or_404


@require_http_methods(["GET", "POST"])
def run_evaluate(request: TeamRequest, pk: int) -> HttpResponse:
    """GET: the evaluation jobs (htmx polls it while one is active). POST: queue an evaluation."""
    run = team_object_or_404(request, Run, pk)
    form = EvaluationForm(request.POST or None, run=run)
    if request.method == "POST" and form.is_valid():
        try:
            services.evaluation_request(run=run, user=request.user, **form.cleaned_data)
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            form = EvaluationForm(run=run)
            if not request.htmx:
                messages.success(request, "Evaluation queued; the result appears under Held-out evaluation.")
                return redirect(run)
    context = {"run": run, "eval_form": form,
               "eval_jobs": run.jobs.filter(kind=Job.Kind.EVALUATE).select_related("checkpoint")[:20]}
    if request.htmx:  # the form and the list after a POST; the list alone when it polls
        return render(request, f"history/run_sections.html#{'eval-panel' if request.method == 'POST' else 'eval-jobs'}", context)
    return redirect(run)


@require_POST
def run_ablate(request: TeamRequest, pk: int) -> HttpResponse:
    """Queue one ablation of a finished team run (role swap, untrained team, an agent alone)."""
    run = team_object_or_404(request, Run, pk)
    try:
        job = ablations.ablation_request(run=run, user=request.user, key=request.POST.get("ablation", ""))
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"Ablation {job.params['ablation_label']} queued (job #{job.pk}); its result appears under "
                                  "Held-out evaluation, with the other evaluations.")
    return redirect(reverse("run_detail", args=[run.pk]) + "#held-out")


@require_POST
def run_merge(request: TeamRequest, pk: int, step: int, name: str) -> HttpResponse:
    run = team_object_or_404(request, Run, pk)
    checkpoint = get_object_or_404(Checkpoint, run=run, step=step)
    dtype = request.POST.get("dtype") or "bfloat16"
    try:
        if dtype.startswith("gguf-"):  # GGUF f16 / q8_0 for llama.cpp and Ollama
            job = services.gguf_request(run=run, user=request.user, checkpoint=checkpoint, agent=name,
                                        gguf_type=dtype.removeprefix("gguf-"))
        else:
            job = services.merge_request(run=run, user=request.user, checkpoint=checkpoint, agent=name, dtype=dtype)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"Merging {name} into its base model (job #{job.pk}); the download appears under Artifacts.")
    return redirect(reverse("run_detail", args=[run.pk]) + "#artifacts")


# == playground ===========================================================================================


def _task_fields(chosen: Topology | Checkpoint | None) -> tuple[tuple[str, ...], dict[str, Any] | None]:
    """(the task fields the chosen agents' environment needs, its (name, env_args))."""
    if chosen is None:
        return (), None
    try:
        config = services.playground_config(**({"checkpoint": chosen} if isinstance(chosen, Checkpoint) else {"topology": chosen}))
        env = environments.environment_load(name=config.topology.environment, env_args=config.topology.env_args)
    except (ConfigError, ValidationError):
        return (), None
    return tuple(env.required_fields), {"environment": config.topology.environment, "env_args": config.topology.env_args}


@require_http_methods(["GET", "POST"])
def playground(request: TeamRequest) -> HttpResponse:
    """Pick agents, type a task, play it (a job on the GPU worker); the job page shows the turns."""
    data = request.POST if request.method == "POST" else request.GET
    chosen = playground_agents(request.team, data.get("agents", ""))
    fields, env = _task_fields(chosen)
    initial: dict[str, Any] = {"agents": data.get("agents", "")}
    if request.method == "GET" and env and request.GET.get("example") == "1":
        row = services.playground_example(**env)
        initial.update({f"task_{k}": v if isinstance(v, str) else _json(v) for k, v in row.items() if k in fields})
    form = PlaygroundForm(request.POST if request.method == "POST" else None, team=request.team, task_fields=fields, initial=initial)
    if request.method == "POST" and form.is_valid():
        chosen = form.cleaned_data["agents"]
        try:
            row = services.playground_row(environment_fields=fields, values=form.task_values())
            job = services.playground_start(
                team=request.team, user=request.user, row=row,
                topology=chosen if isinstance(chosen, Topology) else None,
                checkpoint=chosen if isinstance(chosen, Checkpoint) else None,
                with_base=form.cleaned_data["with_base"], temperature=form.cleaned_data["temperature"],
                max_new_tokens=form.cleaned_data["max_new_tokens"],
            )
        except ValidationError as exc:
            form.add_error(None, exc if not hasattr(exc, "error_dict") else _task_errors(exc))
        else:
            return redirect("playground_job", job.pk)
    context = {"form": form, "chosen": chosen, "env": env,
               "recent": Job.objects.filter(team=request.team, kind=Job.Kind.PLAYGROUND).select_related("owner")[:10]}
    template = "jobs/playground.html#task" if request.htmx else "jobs/playground.html"
    return render(request, template, context)


def _task_errors(exc: ValidationError) -> ValidationError:
    return ValidationError(" ".join(f"{k}: {' '.join(v)}" if k != "__all__" else " ".join(v) for k, v in exc.message_dict.items()))


def _json(value: Any) -> str:
    import json

    return json.dumps(value, ensure_ascii=False)


@require_GET
def playground_job(request: TeamRequest, pk: int) -> HttpResponse:
    """A playground session: the lanes side by side, turn by turn (htmx polls while it runs)."""
    job = get_object_or_404(Job.objects.select_related("run", "checkpoint", "topology", "owner"), pk=pk, team=request.team,
                            kind=Job.Kind.PLAYGROUND)
    context = {"job": job, "lanes": job.result.get("lanes", []), "row": job.params.get("row", {})}
    return render(request, "jobs/playground_job.html#transcript" if request.htmx else "jobs/playground_job.html", context)

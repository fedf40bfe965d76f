"""A run's pages: the dashboard, the new-run form and its live preview, the run page (its live card,
rollouts, queue place and the sections other packages contribute), cancel and resume.

Each view: fetch within the current team (another team's object is a 404), call one service,
render or redirect; htmx requests get the page's named partial (`page.html#name`).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from training.config import ConfigError, RunConfig
from webapp.catalog import selectors as catalog_selectors
from webapp.core.values import id_or_none
from webapp.jobs import ablations
from webapp.jobs import selectors as job_selectors
from webapp.jobs.forms import EvaluationForm
from webapp.models import Evaluation, Job, Run
from webapp.runs import estimates, lineage, queue, rollouts, selectors, services, warmstart
from webapp.runs.forms import RunForm, WarmStartForm
from webapp.teams.access import TeamRequest, team_object_or_404

# == dashboard and team ===========================================================================


@require_GET
def dashboard(request: TeamRequest) -> HttpResponse:
    template = "runs/dashboard.html#runs" if request.htmx else "runs/dashboard.html"  # the runs part polls itself
    return render(request, template, {
        **selectors.dashboard_runs(team=request.team),
        "jobs": job_selectors.team_active_jobs(team=request.team),
        "experiment_cap": settings.TROUPE_EXPERIMENT_CONCURRENCY,
        "can_reorder": request.user.is_staff or request.membership.role == "admin",
    })


# == runs =========================================================================================


def run_new(request: TeamRequest) -> HttpResponse:
    form = RunForm(request.POST or None, team=request.team, initial=_run_initial(request))
    if request.method == "POST":
        config = _run_form_config(form)
        if config is not None:
            data = form.cleaned_data
            run = services.run_create(team=request.team, user=request.user, name=form.run_name(), config=config,
                                      topology=data["topology"], dataset=data["dataset"])
            messages.success(request, f"Queued run #{run.pk}.", extra_tags="while-queued")  # the run page drops it once it runs
            return redirect(run)
    return render(request, "runs/new.html", {"form": form})


def _run_form_config(form: RunForm) -> RunConfig | None:
    """The form's RunConfig, or None with every problem added to the form at once: its own field
    errors, and every problem the engine and the trust boundary find in one pass
    (`services.run_config_build`), each next to the field it concerns."""
    form.is_valid()
    data = form.cleaned_data
    if not (data.get("topology") and data.get("dataset")):
        return None
    try:
        config = services.run_config_build(
            team=form.team, topology=data["topology"], dataset=data["dataset"], name=form.run_name(),
            overrides=form.overrides(), advanced_yaml=data.get("advanced_yaml", ""),
        )
    except ConfigError as exc:
        for problem in exc.problems:
            form.add_config_error(problem)
        return None
    return config if not form.errors else None


def _run_initial(request: TeamRequest) -> dict[str, Any]:
    """Preselect a topology/dataset passed in the query string (links from their pages), or
    everything from a run's config (`?clone=<run id>`, "Clone and edit")."""
    clone_id = id_or_none(request.GET.get("clone"))
    if clone_id is not None:
        clone = services.run_clone_initial(run=team_object_or_404(request, Run, clone_id))
        for note in clone.notes:
            messages.info(request, note)
        return clone.initial
    picked = {key: id_or_none(request.GET.get(key)) for key in ("topology", "dataset")}
    # "Run" from a topology (or a dataset) picks the other half too when one fits its environment
    topology, dataset = catalog_selectors.run_pair_complete(team=request.team, topology_id=picked["topology"], dataset_id=picked["dataset"])
    initial = {key: str(obj.pk) for key, obj in (("topology", topology), ("dataset", dataset)) if obj is not None}
    checkpoint = id_or_none(request.GET.get("init_checkpoint"))  # "New run from its weights" on a run page
    if checkpoint is not None:
        initial["init_checkpoint"] = str(checkpoint)  # the form's choices hold only the team's kept checkpoints
    return initial


@require_POST
def run_preview(request: TeamRequest) -> HttpResponse:
    """The resolved config YAML for the run form as it stands (htmx), or every problem with it;
    each field's error block is swapped in out of band, so a fixed field loses its old error."""
    form = RunForm(request.POST, team=request.team)
    picked = bool(request.POST.get("topology") and request.POST.get("dataset"))
    config = _run_form_config(form) if picked else None
    order = [*form.fields, "__all__"]  # the form's order, not the order the checks found them in
    errors = [f"{form[name].label}: {e}" if name in form.fields else e  # one problem per bullet, so the count matches
              for name, errs in sorted(form.errors.items(), key=lambda item: order.index(item[0])) for e in errs] if picked else []
    return render(request, "runs/new.html#preview", {
        "form": form, "config_yaml": config.to_yaml() if config is not None else None, "errors": errors, "oob_errors": picked,
        "steps": config.optim.steps if config is not None else None,
        "estimate": estimates.run_estimate(team=request.team, config=config) if config is not None else None,
    })


RUN_PARTS = ("actions", "held-out", "artifacts", "eval-panel")
"""Parts of the run page outside its live card that the live page refreshes with the summary
(`?parts=actions,held-out`), swapped out-of-band: they change with the run's state too."""


def run_detail(request: TeamRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(selectors.run_page_runs(team=request.team), pk=pk)
    parts = [p for p in request.GET.get("parts", "").split(",") if p in RUN_PARTS] if request.htmx else []
    context = {"run": run, "parts": parts, **selectors.run_live_card(run=run), "conversations": selectors.run_conversations(run=run)}
    if not request.htmx:
        context.update(origin=lineage.run_origin(run=run), descendants=lineage.run_descendants(run=run))
    if not request.htmx or parts:
        context.update(selectors.run_history_sections(run=run), eval_form=EvaluationForm(run=run),
                       ablations=ablations.run_ablations(run=run))
    template = "runs/detail.html#refresh" if request.htmx else "runs/detail.html"
    return render(request, template, context)


def run_warm_start(request: TeamRequest, pk: int) -> HttpResponse:
    """"Warm start from this run": the SFT set its episodes give (a preview that follows the form
    over htmx: examples per agent and a few of them), and on POST the SFT run on it."""
    run = team_object_or_404(request, Run, pk)
    data = request.POST if request.method == "POST" else (request.GET or None)
    form = WarmStartForm(data, checkpoints=warmstart.warm_start_checkpoints(run=run))
    episodes, problems = None, []
    if not form.is_bound or form.is_valid():
        try:
            episodes = warmstart.warm_start_set(run=run, threshold=form.cleaned_data.get("threshold") if form.is_bound else None)
        except ValidationError as exc:
            if form.is_bound:
                _add_errors(form, exc)
            else:  # the first view (a run still queued, or one without episodes): said on the page
                problems = exc.messages
    if request.method == "POST" and episodes is not None and not form.errors:
        d = form.cleaned_data
        try:
            new = warmstart.warm_start_launch(run=run, user=request.user, threshold=d["threshold"], steps=d["steps"],
                                              batch_size=d["batch_size"], lr=d["lr"], start_from=d["start_from"], name=d["name"])
        except (ValidationError, ConfigError) as exc:
            _add_errors(form, exc)
        else:
            messages.success(request, f"Queued SFT run #{new.pk} on {sum(episodes.counts.values())} examples of run #{run.pk}.",
                             extra_tags="while-queued")
            return redirect(new)
    context = {"run": run, "form": form, "episodes": episodes, "problems": problems,
               "samples": episodes.samples() if episodes else {}}
    return render(request, "runs/warm_start.html#preview" if request.htmx else "runs/warm_start.html", context)


def _add_errors(form: WarmStartForm, exc: ValidationError | ConfigError) -> None:
    """Each problem next to the form field it names, else above the form."""
    if isinstance(exc, ConfigError):
        for problem in exc.problems:
            form.add_error(None, f"{problem.field}: {problem.message}")
    elif hasattr(exc, "error_dict"):
        for name, errors in exc.message_dict.items():
            for message in errors:
                form.add_error(name if name in form.fields else None, message)
    else:
        for message in exc.messages:
            form.add_error(None, message)


@require_GET
def run_rollouts(request: TeamRequest, pk: int) -> HttpResponse:
    """The rollout viewer's episodes: a filter change, "load older" (`before`=id), or the live
    page fetching what a websocket notification announced (`after`=id)."""
    run = team_object_or_404(request, Run, pk)
    page = rollouts.rollouts_page(run=run, filters=rollouts.RolloutFilter.from_query(request.GET),
                                   before=id_or_none(request.GET.get("before")), after=id_or_none(request.GET.get("after")))
    return render(request, "runs/_episodes.html", page)


@require_GET
def run_evaluation(request: TeamRequest, pk: int, evaluation: int) -> HttpResponse:
    """One held-out evaluation's episodes (each task as the agents played it), filtered by agent
    and success, a page at a time."""
    run = team_object_or_404(request, Run, pk)
    row = get_object_or_404(Evaluation, pk=evaluation, run=run)
    page = id_or_none(request.GET.get("page")) or 1
    context = rollouts.evaluation_page(evaluation=row, filters=rollouts.RolloutFilter.from_query(request.GET), page=page)
    return render(request, "runs/evaluation.html", {
        "run": run, "heading": f"Held-out evaluation at step {row.step}", "subject": "This evaluation",
        "filter_url": reverse("run_evaluation", args=[run.pk, row.pk]), **context})


@require_GET
def run_job_episodes(request: TeamRequest, pk: int, job: int) -> HttpResponse:
    """An evaluation job's episodes (a checkpoint on a dataset, or an ablation of the run), as a
    held-out evaluation's show theirs."""
    run = team_object_or_404(request, Run, pk)
    row = get_object_or_404(Job, pk=job, run=run, kind=Job.Kind.EVALUATE)
    page = id_or_none(request.GET.get("page")) or 1
    context = rollouts.job_evaluation_page(job=row, filters=rollouts.RolloutFilter.from_query(request.GET), page=page)
    step = row.params.get("checkpoint_step")
    weights = f"step {step}" if step is not None else "the base models"
    label = f" · {row.params['ablation_label']}" if row.params.get("ablation_label") else ""
    tasks = row.params.get("dataset_name") or "the run's held-out tasks"  # an ablation plays the run's own
    return render(request, "runs/evaluation.html", {
        "run": run, "heading": f"Evaluation job #{row.pk}: {weights} on {tasks}{label}",
        "subject": "This job", "pending": row.get_status_display().lower() if row.is_active else "",
        "failed": row.error or "no reason recorded" if row.status == Job.Status.FAILED else "",
        "filter_url": reverse("run_job_episodes", args=[run.pk, row.pk]), **context})


@require_POST
def run_cancel(request: TeamRequest, pk: int) -> HttpResponse:
    run = services.run_cancel(run=team_object_or_404(request, Run, pk), actor=request.user)
    if run.status == Run.Status.CANCELLED:
        messages.info(request, "Cancelled.")
    else:
        messages.info(request, "Asked the run to stop after its current step.", extra_tags="while-running")
    return redirect(run)


@require_POST
def run_resume(request: TeamRequest, pk: int) -> HttpResponse:
    run = team_object_or_404(request, Run, pk)
    try:
        new = services.run_resume(run=run, user=request.user)
    except (ValidationError, ConfigError) as exc:
        messages.error(request, " ".join(exc.messages) if isinstance(exc, ValidationError) else str(exc))
        return redirect(run)
    messages.success(request, f"Queued run #{new.pk}, resuming #{run.pk}.", extra_tags="while-queued")
    return redirect(new)


@require_POST
def run_queue_move(request: TeamRequest, pk: int, direction: str) -> HttpResponse:
    """Move a queued run up or down among its team's queued runs (team admins and staff)."""
    run = team_object_or_404(request, Run, pk)
    queue.run_queue_move(run=run, user=request.user, direction=direction)
    back = request.POST.get("next", "")
    if url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        return redirect(back)
    return redirect(run)


@require_GET
def run_queue_position(request: TeamRequest, pk: int) -> HttpResponse:
    """The run page's queue line (htmx polls it while the run waits)."""
    run = team_object_or_404(request, Run, pk)
    if request.GET.get("part") == "waiting":  # the log box's sentence
        return render(request, "runs/detail.html#log-waiting", {"run": run, "waiting_for": queue.run_waiting_for(run=run)})
    return render(request, "runs/detail.html#queue", _queue_context(request, run))


def _queue_context(request: TeamRequest, run: Run) -> dict[str, object]:
    return {
        "run": run,
        "queue_position": queue.run_queue_position(run=run),
        "can_reorder": run.status == Run.Status.QUEUED and queue.run_can_reorder(run=run, user=request.user),
    }

"""Pages of the shared history: the run list (filters, sort, CSV), compare, the run page's
labels, held-out evaluation and artifacts sections, the playground and API tokens.

Each view: fetch within the current team (another team's object is a 404), call one service,
render or redirect; htmx requests get the page's named partial."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from training.config import ConfigError
from webapp import artifacts, history, jobs, services, storage, tokens
from webapp.access import TeamRequest, is_team_admin, team_object_or_404
from webapp.downloads import checkpoint_download, merged_download, run_file_download, streamed
from webapp.forms_history import ApiTokenForm, EvaluationForm, PlaygroundForm, RunNotesForm, RunTagsForm, playground_agents
from webapp.models import SPECIALIZATION_LABELS, ApiToken, Checkpoint, Job, Run, Topology

PER_PAGE = 25
SECTIONS = "runs/history_sections.html"

# == the run list ======================================================================================


@require_GET
def run_list(request: TeamRequest) -> HttpResponse:
    filters = history.RunFilter.from_query(request.GET)
    page = Paginator(history.run_search(team=request.team, filters=filters), PER_PAGE).get_page(request.GET.get("page"))
    context = {
        "page": page, "f": filters, "choices": history.run_filter_choices(team=request.team),
        "statuses": Run.Status.choices, "specialization_labels": SPECIALIZATION_LABELS,
        "query": filters.query_string(), "compare_max": history.COMPARE_MAX,
    }
    if not request.htmx:
        return render(request, "runs/list.html", context)
    response = render(request, "runs/list.html#table", context)
    page_part = f"page={page.number}" if page.number > 1 else ""
    response["HX-Push-Url"] = "?".join(filter(None, [reverse("run_list"), "&".join(filter(None, [context["query"], page_part]))]))
    return response


@require_GET
def run_export(request: TeamRequest) -> HttpResponse:
    """The filtered list as CSV (every page), with the final metrics as columns."""
    filters = history.RunFilter.from_query(request.GET)
    runs = history.run_search(team=request.team, filters=filters)
    metrics = history.run_filter_choices(team=request.team).metrics
    return streamed(request, history.run_export_csv(runs=runs, metrics=metrics), filename="troupe-runs.csv",
                    content_type="text/csv; charset=utf-8")


# == compare ===============================================================================================


def _compared(request: TeamRequest) -> list[Run]:
    try:
        return history.compare_runs(team=request.team, ids=request.GET.getlist("ids"))
    except Run.DoesNotExist:
        raise Http404("not your team's runs") from None


@require_GET
def run_compare(request: TeamRequest) -> HttpResponse:
    try:
        runs = _compared(request)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
        return redirect("run_list")
    differences_only = request.GET.get("diff") == "1"
    context = {
        "runs": runs, "ids": [r.pk for r in runs], "differences_only": differences_only,
        "diff": history.compare_config_diff(runs=runs, differences_only=differences_only),
    }
    if request.htmx:
        return render(request, "runs/compare.html#diff", context)
    held_out = history.run_held_out(runs=runs)
    agent_names = list(dict.fromkeys(n for r in runs for n in (held_out[r.pk].agents or {})))
    context.update(
        metrics=history.compare_metric_names(runs=runs), final=history.compare_final_table(runs=runs),
        held_out=[held_out[r.pk] for r in runs], held_out_agents=agent_names,
        data_url=reverse("run_compare_data") + "?" + "&".join(f"ids={r.pk}" for r in runs),
    )
    return render(request, "runs/compare.html", context)


@require_GET
def run_compare_data(request: TeamRequest) -> HttpResponse:
    """One metric's curves for the compared runs (JSON for the chart)."""
    try:
        runs = _compared(request)
        return JsonResponse(history.compare_series(runs=runs, metric=request.GET.get("metric") or "reward/total"))
    except ValidationError as exc:
        return JsonResponse({"error": " ".join(exc.messages)}, status=400)


# == the run page's sections ===========================================================================


def run_history_context(*, run: Run) -> dict[str, Any]:
    """What the run page's history sections show (called by `views.run_detail`)."""
    evaluations = list(run.evaluations.order_by("step", "temperature"))
    return {
        "tags_text": ", ".join(t.name for t in run.tags.all()),
        "held_out": history.run_held_out(runs=[run])[run.pk],
        "eval_rows": evaluations,
        "eval_chart": _eval_chart(run, evaluations),
        "eval_jobs": run.jobs.filter(kind=Job.Kind.EVALUATE).select_related("checkpoint")[:20],
        "eval_form": EvaluationForm(run=run),
        **_artifacts_context(run),
        "latest_checkpoint": run.checkpoints.filter(deleted__isnull=True).order_by("-step").first(),
    }


def _artifacts_context(run: Run) -> dict[str, Any]:
    """The artifacts section: checkpoints on disk with their sizes and whether they may be deleted,
    the ones deleted, merged exports with their sizes."""
    merge_jobs = list(run.jobs.filter(kind=Job.Kind.MERGE)[:20])
    found = artifacts.run_artifacts(run=run)
    return {
        "artifacts": found,
        "deletable": {c.pk for c in run.checkpoints.filter(deleted__isnull=True) if storage.checkpoint_delete_blocker(checkpoint=c) is None},
        "deleted_steps": sorted({c.step for c in run.checkpoints.filter(deleted__isnull=False)}
                                | {a.checkpoint.step for a in found if not a.on_disk}),
        "merge_jobs": merge_jobs,
        "export_sizes": {job.pk: storage.folder_size(job.output) for job in merge_jobs if job.output},
        "model_dtype": _model_dtype(run),
    }


def _model_dtype(run: Run) -> str:
    try:
        return run.to_config().model.dtype
    except ConfigError:
        return ""


def _eval_chart(run: Run, evaluations: list[Any]) -> dict[str, Any]:
    """Greedy held-out success per step: the team's and each agent's (for the chart)."""
    greedy = min((e.temperature for e in evaluations), default=0.0)
    rows = [e for e in evaluations if e.temperature == greedy]
    names = list(dict.fromkeys(n for e in rows for n in e.agents))
    return {
        "steps": [e.step for e in rows],
        "series": {"team": [e.team_success for e in rows],
                   **{n: [(e.agents.get(n) or {}).get("success") for e in rows] for n in names}},
    }


def _run(request: TeamRequest, pk: int) -> Run:
    return team_object_or_404(request, Run, pk)


@require_http_methods(["GET", "POST"])
def run_tags(request: TeamRequest, pk: int) -> HttpResponse:
    """htmx inline edit: GET the form, POST saves and shows the tags again."""
    run = _run(request, pk)
    form = RunTagsForm(request.POST or None, initial={"tags": ", ".join(t.name for t in run.tags.all())})
    editing = request.method == "GET" and request.GET.get("edit") == "1"
    if request.method == "POST" and form.is_valid():
        try:
            history.run_tags_set(run=run, text=form.cleaned_data["tags"])
        except ValidationError as exc:
            form.add_error("tags", exc.messages[0])
            editing = True
    elif request.method == "POST":
        editing = True
    context = {"run": run, "tags_form": form, "editing_tags": editing}
    if request.htmx:
        return render(request, f"{SECTIONS}#tags", context)
    return redirect(run)


@require_http_methods(["GET", "POST"])
def run_notes(request: TeamRequest, pk: int) -> HttpResponse:
    run = _run(request, pk)
    form = RunNotesForm(request.POST or None, initial={"notes": run.notes})
    editing = request.method == "GET" and request.GET.get("edit") == "1"
    if request.method == "POST" and form.is_valid():
        try:
            history.run_notes_set(run=run, notes=form.cleaned_data["notes"])
        except ValidationError as exc:
            form.add_error("notes", exc.messages[0])
            editing = True
    elif request.method == "POST":
        editing = True
    context = {"run": run, "notes_form": form, "editing_notes": editing}
    if request.htmx:
        return render(request, f"{SECTIONS}#notes", context)
    return redirect(run)


@require_POST
def run_archive(request: TeamRequest, pk: int) -> HttpResponse:
    run = _run(request, pk)
    try:
        history.run_archive(run=run, archived=request.POST.get("archived") == "1")
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, "Archived: hidden from the run list (filter “Archived” to see it)." if run.archived else "Unarchived.")
    return redirect(run)


@require_http_methods(["GET", "POST"])
def run_evaluate(request: TeamRequest, pk: int) -> HttpResponse:
    """GET: the evaluation jobs (htmx polls it while one is active). POST: queue an evaluation."""
    run = _run(request, pk)
    form = EvaluationForm(request.POST or None, run=run)
    if request.method == "POST" and form.is_valid():
        try:
            jobs.evaluation_request(run=run, user=request.user, **form.cleaned_data)
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
        return render(request, f"{SECTIONS}#{'eval-panel' if request.method == 'POST' else 'eval-jobs'}", context)
    return redirect(run)


@require_GET
def run_artifacts(request: TeamRequest, pk: int) -> HttpResponse:
    """The artifacts section (htmx polls it while a merged export is being built)."""
    run = _run(request, pk)
    return render(request, f"{SECTIONS}#artifacts", {"run": run, **_artifacts_context(run)})


def _team_admin(request: TeamRequest) -> None:
    if not is_team_admin(request):
        raise PermissionDenied("Only a team admin can delete checkpoints and exports.")


@require_POST
def run_checkpoint_delete(request: TeamRequest, pk: int, step: int) -> HttpResponse:
    """A team admin deletes one of a finished run's older checkpoints from disk."""
    run = _run(request, pk)
    checkpoint = get_object_or_404(Checkpoint, run=run, step=step)
    _team_admin(request)
    return _delete_then_back(request, run, lambda: storage.checkpoint_delete(checkpoint=checkpoint),
                             f"Deleted checkpoint step {step} of run #{run.pk}.")


@require_POST
def run_export_delete(request: TeamRequest, pk: int, job_id: int) -> HttpResponse:
    """A team admin deletes a merged export."""
    run = _run(request, pk)
    job = get_object_or_404(Job, pk=job_id, run=run, kind=Job.Kind.MERGE)
    _team_admin(request)
    return _delete_then_back(request, run, lambda: storage.export_delete(job=job),
                             f"Deleted the merged export of {job.params.get('agent', 'the agent')} (job #{job.pk}).")


def _delete_then_back(request: TeamRequest, run: Run, delete: Callable[[], object], done: str) -> HttpResponse:
    """Run one storage deletion, say how it went, and go back to the storage page or the run's artifacts."""
    try:
        delete()
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, done)
    return redirect(request.POST.get("next") if request.POST.get("next") == reverse("storage") else run.get_absolute_url() + "#artifacts")


@require_GET
def run_file(request: TeamRequest, pk: int, name: str) -> HttpResponse:
    try:
        return run_file_download(request, run=_run(request, pk), name=name)
    except artifacts.ArtifactMissing as exc:
        raise Http404(str(exc)) from None


@require_GET
def run_checkpoint_download(request: TeamRequest, pk: int, step: int, name: str) -> HttpResponse:
    run = _run(request, pk)
    try:
        return checkpoint_download(request, run=run, checkpoint=run.checkpoints.filter(step=step).first(), name=name)
    except artifacts.ArtifactMissing as exc:
        raise Http404(str(exc)) from None


@require_POST
def run_merge(request: TeamRequest, pk: int, step: int, name: str) -> HttpResponse:
    run = _run(request, pk)
    checkpoint = get_object_or_404(Checkpoint, run=run, step=step)
    try:
        job = jobs.merge_request(run=run, user=request.user, checkpoint=checkpoint, agent=name,
                                 dtype=request.POST.get("dtype") or "bfloat16")
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"Merging {name} into its base model (job #{job.pk}); the download appears under Artifacts.")
    return redirect(reverse("run_detail", args=[run.pk]) + "#artifacts")


@require_GET
def run_merged_download(request: TeamRequest, pk: int, job_id: int) -> HttpResponse:
    run = _run(request, pk)
    job = get_object_or_404(Job, pk=job_id, run=run, kind=Job.Kind.MERGE)
    try:
        return merged_download(request, job=job)
    except artifacts.ArtifactMissing as exc:
        raise Http404(str(exc)) from None


# == playground ===========================================================================================


def _task_fields(chosen: Topology | Checkpoint | None) -> tuple[tuple[str, ...], dict[str, Any] | None]:
    """(the task fields the chosen agents' environment needs, its (name, env_args))."""
    if chosen is None:
        return (), None
    try:
        config = jobs.playground_config(**({"checkpoint": chosen} if isinstance(chosen, Checkpoint) else {"topology": chosen}))
        env = services.environment_load(name=config.topology.environment, env_args=config.topology.env_args)
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
        row = jobs.playground_example(**env)
        initial.update({f"task_{k}": v if isinstance(v, str) else _json(v) for k, v in row.items() if k in fields})
    form = PlaygroundForm(request.POST if request.method == "POST" else None, team=request.team, task_fields=fields, initial=initial)
    if request.method == "POST" and form.is_valid():
        chosen = form.cleaned_data["agents"]
        try:
            row = jobs.playground_row(environment_fields=fields, values=form.task_values())
            job = jobs.playground_start(
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
    template = "playground.html#task" if request.htmx else "playground.html"
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
    return render(request, "playground_job.html#transcript" if request.htmx else "playground_job.html", context)


# == API tokens ===========================================================================================


@require_http_methods(["GET", "POST"])
def api_tokens(request: TeamRequest) -> HttpResponse:
    """The user's tokens; POST creates one and shows it once (it is not stored)."""
    form = ApiTokenForm(request.POST or None)
    new_token = None
    if request.method == "POST" and form.is_valid():
        try:
            _, new_token = tokens.api_token_create(user=request.user, team=request.team, name=form.cleaned_data["name"])
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            form = ApiTokenForm()
    context = {"form": form, "new_token": new_token,
               "tokens": ApiToken.objects.filter(user=request.user).select_related("team"),
               "api_root": request.build_absolute_uri(reverse("api_index"))}
    response = render(request, "account/tokens.html", context)
    response["Cache-Control"] = "no-store"
    return response


@require_POST
def api_token_revoke(request: TeamRequest, pk: int) -> HttpResponse:
    token = get_object_or_404(ApiToken, pk=pk, user=request.user)
    tokens.api_token_revoke(token=token)
    messages.success(request, f"Revoked {token.name}.")
    return redirect("api_tokens")

"""Experiment pages: the list, the new-experiment form with its preview (how many runs, roughly how
long), the experiment page (arms as rows with their ablations, live by htmx polling while trials or
ablations are active), its learning curves (JSON), the config diff between two arms, cancel, resume
and the CSV export. Each view fetches within the current team, calls one service, renders."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from typing import Any

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from training.experiment import ExperimentError, ExperimentSpec
from webapp.artifacts.downloads import streamed
from webapp.core.values import csv_cell, id_or_none
from webapp.experiments import selectors, services
from webapp.experiments.forms import ExperimentForm
from webapp.history.selectors import METRIC_KEY
from webapp.models import Experiment
from webapp.runs import services as runs
from webapp.teams.access import TeamRequest, team_object_or_404


@require_GET
def experiment_list(request: TeamRequest) -> HttpResponse:
    return render(request, "experiments/list.html", {"experiments": selectors.experiment_list(team=request.team)})


def _form_spec(request: TeamRequest, form: ExperimentForm) -> ExperimentSpec | None:
    """The form's spec, or None with every problem added next to its field."""
    if not form.is_valid():
        return None
    data = form.cleaned_data
    try:
        return services.experiment_spec_build(
            team=request.team, topology=data["topology"], dataset=data["dataset"], name=data["name"],
            axes=data["axes_yaml"], seeds=data["seeds"], metric=data["metric"], direction=data["direction"],
            advanced_yaml=data["advanced_yaml"], search=data["search_yaml"],
            overrides=runs.run_source_overrides(team=request.team, conversations=data.get("conversations")),
        )
    except ExperimentError as exc:
        for problem in exc.problems:
            form.add_problem(problem)
        return None


def experiment_new(request: TeamRequest) -> HttpResponse:
    initial = {key: value for key in ("topology", "dataset") if (value := id_or_none(request.GET.get(key))) is not None}
    form = ExperimentForm(request.POST or None, team=request.team, initial=initial)
    if request.method == "POST":
        spec = _form_spec(request, form)
        if spec is not None:
            try:
                experiment = services.experiment_create(team=request.team, user=request.user, spec=spec,
                                                        topology=form.cleaned_data["topology"], dataset=form.cleaned_data["dataset"])
            except ExperimentError as exc:
                for problem in exc.problems:
                    form.add_problem(problem)
            else:
                messages.success(request, f"Queued experiment #{experiment.pk}: {experiment.trial_count} runs.")
                return redirect(experiment)
    return render(request, "experiments/new.html", {"form": form})


@require_POST
def experiment_preview(request: TeamRequest) -> HttpResponse:
    """How many runs the form starts and roughly how long they take, or every problem with it."""
    form = ExperimentForm(request.POST, team=request.team)
    picked = bool(request.POST.get("topology") and request.POST.get("dataset"))
    spec = _form_spec(request, form) if picked else None
    errors = [f"{form[name].label if name in form.fields else ''}: {e}".lstrip(": ") for name, errs in form.errors.items() for e in errs]
    context: dict[str, Any] = {"form": form, "errors": errors if picked else [], "spec": spec}
    if spec is not None:
        context["estimate"] = selectors.experiment_estimate(team=request.team, spec=spec)
        context["arms"] = ([] if spec.search is not None else
                           [", ".join(f"{f}={v}" for f, v in arm) or "base" for arm in spec.arms()])
    return render(request, "experiments/new.html#preview", context)


def experiment_detail(request: TeamRequest, pk: int) -> HttpResponse:
    experiment = team_object_or_404(request, Experiment, pk)
    try:
        results = selectors.experiment_results(experiment=experiment)
    except ExperimentError as exc:  # the stored spec no longer validates (a plugin it names was unregistered, ...)
        messages.error(request, f"This experiment's spec no longer validates, so its arms cannot be read: {exc}")
        return render(request, "experiments/list.html", {"experiments": selectors.experiment_list(team=request.team)})
    context = {"experiment": experiment, "results": results, "active": selectors.experiment_is_live(experiment=experiment),
               "trials_active": experiment.is_active, "unfinished": selectors.experiment_unfinished(experiment=experiment, spec=results.spec)}
    if request.htmx:
        return render(request, "experiments/detail.html#refresh", context)  # the results, and the head's buttons out of band
    context["ablation_choices"] = services.experiment_ablation_choices(experiment=experiment)
    context["curve_metrics"] = selectors.experiment_curve_metrics(experiment=experiment, results=results)
    context["diff_choices"] = [(key, label) for key, label, _ in selectors.experiment_diff_choices(results=results)]
    return render(request, "experiments/detail.html", context)


@require_GET
def experiment_curves(request: TeamRequest, pk: int) -> HttpResponse:
    """One metric against the step per arm, mean and 95 % band over seeds (JSON for the chart)."""
    experiment = team_object_or_404(request, Experiment, pk)
    metric = request.GET.get("metric") or f"{selectors.HELD_OUT}team.success"  # the page's first choice
    if not METRIC_KEY.match(metric.removeprefix(selectors.HELD_OUT)):
        return JsonResponse({"error": f"Unknown metric {metric[:60]!r}."}, status=400)
    return JsonResponse(selectors.experiment_curves(experiment=experiment, metric=metric))


@require_GET
def experiment_diff(request: TeamRequest, pk: int) -> HttpResponse:
    """The config keys whose values differ between two arms (two trials of a search)."""
    experiment = team_object_or_404(request, Experiment, pk)
    results = selectors.experiment_results(experiment=experiment)
    labels, rows = selectors.experiment_arm_diff(results=results, a=request.GET.get("a", ""), b=request.GET.get("b", ""))
    context = {"experiment": experiment, "diff_labels": labels, "diff_rows": rows, "diff_asked": True}
    return render(request, "experiments/detail.html#arm-diff", context)


@require_POST
def experiment_cancel(request: TeamRequest, pk: int) -> HttpResponse:
    experiment = team_object_or_404(request, Experiment, pk)
    try:
        stopped = services.experiment_cancel(experiment=experiment, actor=request.user)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.info(request, f"Cancelled {stopped} queued or running trial{'s' if stopped != 1 else ''}.")
    return redirect(experiment)


@require_POST
def experiment_resume(request: TeamRequest, pk: int) -> HttpResponse:
    experiment = team_object_or_404(request, Experiment, pk)
    try:
        started = services.experiment_resume(experiment=experiment, user=request.user)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"Started {started} unfinished trial{'s' if started != 1 else ''} again.")
    return redirect(experiment)


@require_POST
def experiment_ablate(request: TeamRequest, pk: int) -> HttpResponse:
    """Queue one ablation of every finished trial; the results fill the arms' ablation rows."""
    experiment = team_object_or_404(request, Experiment, pk)
    queued, refused = services.experiment_ablate(experiment=experiment, user=request.user, key=request.POST.get("ablation", ""))
    if queued:
        messages.success(request, f"Ablation queued for {queued} finished trial{'s' if queued != 1 else ''}; "
                                  "the rows under each arm fill in as the jobs finish.")
    elif not refused:
        messages.info(request, "No trial has finished yet: ablate once some have.")
    for problem in refused[:5]:
        messages.error(request, f"Not ablated: {problem}")
    return redirect(experiment)


@require_GET
def experiment_export(request: TeamRequest, pk: int) -> HttpResponse:
    experiment = team_object_or_404(request, Experiment, pk)
    results = selectors.experiment_results(experiment=experiment)
    return streamed(request, _csv(selectors.experiment_csv_rows(results=results)), filename=f"experiment-{experiment.pk}.csv",
                    content_type="text/csv; charset=utf-8")


def _csv(rows: Iterator[list[Any]]) -> Iterator[str]:
    for row in rows:
        buffer = io.StringIO()
        csv.writer(buffer).writerow([csv_cell(v) for v in row])
        yield buffer.getvalue()

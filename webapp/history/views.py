"""Pages of the shared history: the run list (filters, sort, CSV), compare, and a run's labels.

Each view: fetch within the current team (another team's object is a 404), call one service,
render or redirect; htmx requests get the page's named partial (`page.html#name`).
"""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from webapp.artifacts.downloads import streamed
from webapp.history import selectors, services
from webapp.history.forms import RunNotesForm, RunTagsForm
from webapp.models import SPECIALIZATION_LABELS, Run
from webapp.teams.access import TeamRequest, team_object_or_404

PER_PAGE = 25


SECTIONS = "history/run_sections.html"


# == the run list ======================================================================================


@require_GET
def run_list(request: TeamRequest) -> HttpResponse:
    filters = selectors.RunFilter.from_query(request.GET)
    for name, problem in filters.problems:
        messages.warning(request, f"{name}: {problem} Ignored.")
    page = Paginator(selectors.run_search(team=request.team, filters=filters), PER_PAGE).get_page(request.GET.get("page"))
    context = {
        "page": page, "f": filters, "choices": selectors.run_filter_choices(team=request.team),
        "statuses": Run.Status.choices, "specialization_labels": SPECIALIZATION_LABELS,
        "query": filters.query_string(), "compare_max": selectors.COMPARE_MAX,
        "active": any(run.status in Run.ACTIVE for run in page),
    }
    if not request.htmx:
        return render(request, "history/list.html", context)
    response = render(request, "history/list.html#table", context)
    if request.htmx.trigger == "runs-table":  # the table's own refresh: the address stays as it is
        return response
    page_part = f"page={page.number}" if page.number > 1 else ""
    response["HX-Push-Url"] = "?".join(filter(None, [reverse("run_list"), "&".join(filter(None, [context["query"], page_part]))]))
    return response


@require_GET
def run_export(request: TeamRequest) -> HttpResponse:
    """The filtered list as CSV (every page), with the final metrics as columns."""
    filters = selectors.RunFilter.from_query(request.GET)
    if filters.problems:  # answered before the stream starts: a 200 must never die half-way
        return HttpResponse("".join(f"{name}: {problem}\n" for name, problem in filters.problems), status=400,
                            content_type="text/plain; charset=utf-8")
    runs = selectors.run_search(team=request.team, filters=filters)
    metrics = selectors.run_filter_choices(team=request.team).metrics
    return streamed(request, selectors.run_export_csv(runs=runs, metrics=metrics), filename="troupe-runs.csv",
                    content_type="text/csv; charset=utf-8")


# == compare ===============================================================================================


def _compared(request: TeamRequest) -> list[Run]:
    try:
        return selectors.compare_runs(team=request.team, ids=request.GET.getlist("ids"))
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
        "diff": selectors.compare_config_diff(runs=runs, differences_only=differences_only),
    }
    if request.htmx:
        return render(request, "history/compare.html#diff", context)
    held_out = selectors.run_held_out(runs=runs)
    agent_names = list(dict.fromkeys(n for r in runs for n in (held_out[r.pk].agents or {})))
    context.update(
        metrics=selectors.compare_metric_names(runs=runs), final=selectors.compare_final_table(runs=runs),
        held_out=[held_out[r.pk] for r in runs], held_out_agents=agent_names,
        data_url=reverse("run_compare_data") + "?" + "&".join(f"ids={r.pk}" for r in runs),
    )
    return render(request, "history/compare.html", context)


@require_GET
def run_compare_data(request: TeamRequest) -> HttpResponse:
    """One metric's curves for the compared runs (JSON for the chart)."""
    try:
        runs = _compared(request)
        return JsonResponse(selectors.compare_series(runs=runs, metric=request.GET.get("metric") or "reward/total"))
    except ValidationError as exc:
        return JsonResponse({"error": " ".join(exc.messages)}, status=400)


@require_http_methods(["GET", "POST"])
def run_tags(request: TeamRequest, pk: int) -> HttpResponse:
    """htmx inline edit: GET the form, POST saves and shows the tags again."""
    run = team_object_or_404(request, Run, pk)
    form = RunTagsForm(request.POST or None, initial={"tags": ", ".join(t.name for t in run.tags.all())})
    editing = request.method == "GET" and request.GET.get("edit") == "1"
    if request.method == "POST" and form.is_valid():
        try:
            services.run_tags_set(run=run, text=form.cleaned_data["tags"])
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
    run = team_object_or_404(request, Run, pk)
    form = RunNotesForm(request.POST or None, initial={"notes": run.notes})
    editing = request.method == "GET" and request.GET.get("edit") == "1"
    if request.method == "POST" and form.is_valid():
        try:
            services.run_notes_set(run=run, notes=form.cleaned_data["notes"])
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
    run = team_object_or_404(request, Run, pk)
    try:
        services.run_archive(run=run, archived=request.POST.get("archived") == "1")
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, "Archived: hidden from the run list (filter “Archived” to see it)." if run.archived else "Unarchived.")
    return redirect(run)

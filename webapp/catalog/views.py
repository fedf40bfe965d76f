"""The catalog's pages: model sources, agents, topologies, datasets, graders and tasks.

Each view: fetch within the current team (another team's object is a 404), call one service,
render or redirect; htmx requests get the page's named partial (`page.html#name`).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.db.models import Count
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from training.config import ConfigError
from training.data import MAX_FIELD_CHARS, MAX_FIELDS, MAX_JSON_DEPTH
from webapp.catalog import conversations, environments, graders, selectors, services
from webapp.catalog.forms import (
    AgentForm,
    ConversationsUploadForm,
    DatasetGeneratorForm,
    DatasetUploadEditForm,
    DatasetUploadForm,
    GraderForm,
    ModelSourceForm,
    TaskForm,
    TaskTopologyForm,
    TopologyForm,
)
from webapp.core.bodylimit import upload_view
from webapp.core.values import id_or_none
from webapp.models import Agent, Dataset, Grader, ModelSource, Task, Topology
from webapp.teams.access import TeamRequest, team_object_or_404
from webapp.teams.audit import Verb, audit_record


@require_GET
def environment_hint(request: TeamRequest) -> HttpResponse:
    """Roles, required fields and default instructions of an environment (htmx, shared)."""
    try:
        env = environments.environment_load(name=request.GET.get("environment", ""))
    except ValidationError:
        env = None
    return render(request, "catalog/_environment_hint.html", {"env": env})


def _picked_environment(form: Any) -> Any:
    """The environment the form's select shows picked, for the help box: none while none is."""
    name = form["environment"].value()
    return environments.environment_describe(name=name) if name else None


def _delete(request: TeamRequest, obj: Any, delete: Any, kind: str, back: str, blocker: Any, effects: Any = None) -> HttpResponse:
    """Confirm on GET, saying already why it cannot be deleted if it cannot (`blocker(obj)`), or
    else what the deletion takes with it (`effects(obj)`: the runs that used it, its file);
    delete through the service on POST, or show why not."""
    error = blocker(obj)
    if request.method == "POST":
        try:
            delete(obj)
        except ValidationError as exc:
            error = " ".join(exc.messages)
        else:
            messages.success(request, f"Deleted {kind} {obj}.")
            return redirect(back)
    return render(request, "confirm_delete.html", {"object": obj, "kind": kind, "back": back, "error": error,
                                                   "effects": effects(obj) if effects and not error else []})


# == model sources ================================================================================


@require_GET
def model_source_list(request: TeamRequest) -> HttpResponse:
    sources = ModelSource.objects.filter(team=request.team).annotate(n_agents=Count("agents"))
    return render(request, "catalog/model_sources/list.html", {"sources": sources})


def model_source_edit(request: TeamRequest, pk: int | None = None) -> HttpResponse:
    source = team_object_or_404(request, ModelSource, pk) if pk else None
    form = ModelSourceForm(request.POST or None, instance=source or ModelSource(team=request.team))  # team: what its folders may be
    if request.method == "POST" and form.is_valid():
        try:
            source = services.model_source_save(team=request.team, instance=source, actor=request.user, **form.cleaned_data)
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            messages.success(request, f"Saved model {source.name}.")
            return redirect("model_source_list")
    return render(request, "form.html", {"form": form, "object": source, "kind": "model", "back": "model_source_list"})


def model_source_delete(request: TeamRequest, pk: int) -> HttpResponse:
    source = team_object_or_404(request, ModelSource, pk)
    return _delete(request, source, lambda s: services.model_source_delete(source=s, actor=request.user), "model", "model_source_list",
                   lambda s: selectors.model_source_delete_blocker(source=s))


# == agents =======================================================================================


@require_GET
def agent_list(request: TeamRequest) -> HttpResponse:
    agents = Agent.objects.filter(team=request.team).select_related("model_source").annotate(n_topologies=Count("memberships"))
    return render(request, "catalog/agents/list.html", {"agents": agents})


def agent_edit(request: TeamRequest, pk: int | None = None) -> HttpResponse:
    agent = team_object_or_404(request, Agent, pk) if pk else None
    form = AgentForm(request.POST or None, instance=agent, team=request.team)
    if request.method == "POST" and form.is_valid():
        try:
            if agent is None:
                agent = services.agent_create(team=request.team, actor=request.user, **form.cleaned_data)
            else:
                agent = services.agent_update(agent=agent, **form.cleaned_data)
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            messages.success(request, f"Saved agent {agent.name}.")
            return redirect("agent_list")
    return render(request, "catalog/agents/form.html", {"form": form, "object": agent, "roles": environments.environment_roles()})


@require_POST
def agent_duplicate(request: TeamRequest, pk: int) -> HttpResponse:
    copy = services.agent_duplicate(agent=team_object_or_404(request, Agent, pk), actor=request.user)
    messages.success(request, f"Created {copy.name}.")
    return redirect(copy)


def agent_delete(request: TeamRequest, pk: int) -> HttpResponse:
    agent = team_object_or_404(request, Agent, pk)
    return _delete(request, agent, lambda a: services.agent_delete(agent=a, actor=request.user), "agent", "agent_list",
                   lambda a: selectors.agent_delete_blocker(agent=a))


# == topologies ===================================================================================


@require_GET
def topology_list(request: TeamRequest) -> HttpResponse:
    topologies = Topology.objects.filter(team=request.team).prefetch_related("members__agent").annotate(n_runs=Count("runs"))
    saved = request.GET.get("saved", "")
    checking = Topology.objects.filter(team=request.team, pk=saved_id).first() if (saved_id := id_or_none(saved)) else None
    return render(request, "catalog/topologies/list.html", {"topologies": topologies, "checking": checking})


@require_GET
def topology_tool_notes(request: TeamRequest, pk: int) -> HttpResponse:
    """What the author should know about the tools of a topology's agents (htmx, after a save)."""
    topology = team_object_or_404(request, Topology, pk)
    return render(request, "catalog/topologies/list.html#tool-notes", {
        "checking": topology, "notes": selectors.tool_template_notes(agents=topology.ordered_agents()), "checked": True})


def topology_edit(request: TeamRequest, pk: int | None = None) -> HttpResponse:
    topology = team_object_or_404(request, Topology, pk) if pk else None
    form = TopologyForm(request.POST or None, instance=topology, team=request.team)
    if request.method == "POST" and form.is_valid():
        try:
            if topology is None:
                topology = services.topology_create(team=request.team, actor=request.user, **form.cleaned_data)
            else:
                topology = services.topology_update(topology=topology, **form.cleaned_data)
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            messages.success(request, f"Saved topology {topology.name}.")
            # whether its models' chat templates render tools is checked after the redirect (the first
            # check in a web process imports torch and transformers: seconds the save need not wait)
            saved = f"?saved={topology.pk}" if any(a.tools for a in topology.ordered_agents()) else ""
            return redirect(reverse("topology_list") + saved)
    return render(request, "catalog/topologies/form.html", {"form": form, "object": topology, "env": _picked_environment(form)})


@require_POST
def topology_duplicate(request: TeamRequest, pk: int) -> HttpResponse:
    copy = services.topology_duplicate(topology=team_object_or_404(request, Topology, pk), actor=request.user)
    messages.success(request, f"Created {copy.name}.")
    return redirect(copy)


def topology_delete(request: TeamRequest, pk: int) -> HttpResponse:
    topology = team_object_or_404(request, Topology, pk)
    return _delete(request, topology, lambda t: services.topology_delete(topology=t, actor=request.user), "topology", "topology_list",
                   lambda t: selectors.topology_delete_blocker(topology=t), lambda t: selectors.topology_delete_effects(topology=t))


# == datasets =====================================================================================


@require_GET
def dataset_list(request: TeamRequest) -> HttpResponse:
    return render(request, "catalog/datasets/list.html", {"datasets": Dataset.objects.filter(team=request.team)})


@upload_view
def dataset_upload(request: TeamRequest) -> HttpResponse:
    form = DatasetUploadForm(request.POST or None, request.FILES or None)
    if request.method == "POST" and form.is_valid():
        try:
            dataset = services.dataset_upload(team=request.team, upload=form.cleaned_data.pop("file"), actor=request.user, **form.cleaned_data)
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            messages.success(request, f"Uploaded {dataset.name}: {dataset.row_count} rows.")
            return redirect(dataset)
    return render(request, "catalog/datasets/new.html", {
        "form": form, "mode": "upload", "env": _picked_environment(form),
        "max_bytes": settings.TROUPE_UPLOAD_MAX_BYTES, "max_rows": settings.TROUPE_UPLOAD_MAX_ROWS,
        "row_limits": {"fields": MAX_FIELDS, "chars": f"{MAX_FIELD_CHARS:,}", "depth": MAX_JSON_DEPTH},
        "environments": environments.environment_infos().values(),
    })


@upload_view
def dataset_upload_conversations(request: TeamRequest) -> HttpResponse:
    form = ConversationsUploadForm(request.POST or None, request.FILES or None)
    if request.method == "POST" and form.is_valid():
        try:
            dataset = conversations.conversations_upload(team=request.team, upload=form.cleaned_data.pop("file"), actor=request.user,
                                                         **form.cleaned_data)
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            messages.success(request, f"Uploaded {dataset.name}: {dataset.row_count} conversations.")
            return redirect(dataset)
    return render(request, "catalog/datasets/new.html", {"form": form, "mode": "conversations", "env": _picked_environment(form)})


def dataset_generate(request: TeamRequest) -> HttpResponse:
    form = DatasetGeneratorForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            dataset = services.dataset_generator_create(team=request.team, actor=request.user, **form.cleaned_data)
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            messages.success(request, f"Created {dataset.name}.")
            return redirect(dataset)
    return render(request, "catalog/datasets/new.html", {"form": form, "mode": "generate", "env": _picked_environment(form)})


def dataset_detail(request: TeamRequest, pk: int) -> HttpResponse:
    dataset = team_object_or_404(request, Dataset, pk)
    is_upload = dataset.kind != Dataset.Kind.GENERATOR  # a file: its name and split are what may change
    form: DatasetUploadEditForm | DatasetGeneratorForm
    form = (DatasetUploadEditForm if is_upload else DatasetGeneratorForm)(request.POST or None, instance=dataset)
    if request.method == "POST" and form.is_valid():
        try:
            if is_upload:
                services.dataset_upload_update(dataset=dataset, **form.cleaned_data)
            else:
                services.dataset_generator_update(dataset=dataset, **form.cleaned_data)
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            messages.success(request, f"Saved {dataset.name}.")
            return redirect(dataset)
        dataset.refresh_from_db()
    return render(request, "catalog/datasets/detail.html", {"dataset": dataset, "form": form})


@require_POST
def dataset_revalidate(request: TeamRequest, pk: int) -> HttpResponse:
    dataset = team_object_or_404(request, Dataset, pk)
    if dataset.kind == Dataset.Kind.CHATS:
        conversations.conversations_revalidate(dataset=dataset)
    else:
        services.dataset_revalidate(dataset=dataset)
    messages.info(request, f"{dataset.name} is {dataset.get_status_display().lower()}.")
    return redirect(dataset)


def dataset_delete(request: TeamRequest, pk: int) -> HttpResponse:
    dataset = team_object_or_404(request, Dataset, pk)
    return _delete(request, dataset, lambda d: services.dataset_delete(dataset=d, actor=request.user), "dataset", "dataset_list",
                   lambda d: selectors.dataset_delete_blocker(dataset=d), lambda d: selectors.dataset_delete_effects(dataset=d))


# == graders and tasks ============================================================================


@require_GET
def grader_list(request: TeamRequest) -> HttpResponse:
    return render(request, "catalog/graders/list.html", {"graders": graders.graders_of(team=request.team)})


def grader_edit(request: TeamRequest, pk: int | None = None) -> HttpResponse:
    """The grader form. Its Try button (htmx, `action=try`) grades the answer typed on the chosen
    dataset's first rows without saving; Save tries it there too and refuses a grader that fails."""
    grader = team_object_or_404(request, Grader, pk) if pk else None
    form = GraderForm(request.POST or None, instance=grader, team=request.team)
    tried: list[services.TriedRow] | None = None
    if request.method == "POST" and form.is_valid():
        data = dict(form.cleaned_data)
        dataset, answer = data.pop("try_dataset"), data.pop("try_answer")
        try:
            if request.POST.get("action") == "try":
                tried = services.grader_try(team=request.team, grader=form.instance, dataset=dataset, answer=answer)
            else:
                grader = services.grader_save(team=request.team, instance=grader, actor=request.user, try_on=dataset, answer=answer, **data)
                messages.success(request, f"Saved grader {grader.name}.")
                return redirect("grader_list")
        except ValidationError as exc:
            form.add_error(None, exc)
    context = {"form": form, "object": grader, "tried": tried}
    return render(request, "catalog/graders/form.html#tried" if request.htmx else "catalog/graders/form.html", context)


def grader_delete(request: TeamRequest, pk: int) -> HttpResponse:
    grader = team_object_or_404(request, Grader, pk)
    return _delete(request, grader, lambda g: services.grader_delete(grader=g, actor=request.user), "grader", "grader_list",
                   lambda g: graders.grader_delete_blocker(grader=g))


@require_GET
def grader_export(request: TeamRequest, pk: int) -> HttpResponse:
    grader = team_object_or_404(request, Grader, pk)
    return _yaml_download(request, grader, graders.grader_yaml(grader=grader), f"grader-{grader.name}.yaml")


@require_GET
def task_list(request: TeamRequest) -> HttpResponse:
    return render(request, "catalog/tasks/list.html", {"tasks": graders.tasks_of(team=request.team)})


def task_edit(request: TeamRequest, pk: int | None = None) -> HttpResponse:
    """The task form, with Try (htmx, `action=try`: each role's prompt and grades on the dataset's
    first rows, nothing saved) and, once saved, a button that makes a topology playing it."""
    task = team_object_or_404(request, Task, pk) if pk else None
    form = TaskForm(request.POST or None, instance=task, team=request.team)
    tried: list[services.TriedRow] | None = None
    if request.method == "POST" and form.is_valid():
        data = dict(form.cleaned_data)
        answers = data.pop("try_answers")
        try:
            if request.POST.get("action") == "try":
                tried = services.task_try(team=request.team, task=form.instance, answers=answers)
            else:
                task = services.task_save(team=request.team, instance=task, actor=request.user, answers=answers, **data)
                messages.success(request, f"Saved task {task.name}.")
                return redirect(task)
        except ValidationError as exc:
            form.add_error(None, exc)
    context = {"form": form, "object": task, "tried": tried, "roles": form.instance.role_names() if tried else [],
               "topology_form": TaskTopologyForm(team=request.team) if task else None,
               "topologies": graders.task_topologies(task=task) if task else []}
    return render(request, "catalog/tasks/form.html#tried" if request.htmx else "catalog/tasks/form.html", context)


@require_POST
def task_topology(request: TeamRequest, pk: int) -> HttpResponse:
    task = team_object_or_404(request, Task, pk)
    form = TaskTopologyForm(request.POST, team=request.team)
    if form.is_valid():
        try:
            topology = services.task_topology_create(task=task, actor=request.user, **form.cleaned_data)
        except ValidationError as exc:
            messages.error(request, " ".join(exc.messages))
        else:
            messages.success(request, f"Created topology {topology.name} with one agent per role.")
            return redirect(topology)
    else:
        messages.error(request, " ".join(m for errors in form.errors.values() for m in errors))
    return redirect(task)


def task_delete(request: TeamRequest, pk: int) -> HttpResponse:
    task = team_object_or_404(request, Task, pk)
    return _delete(request, task, lambda t: services.task_delete(task=t, actor=request.user), "task", "task_list",
                   lambda t: graders.task_delete_blocker(task=t))


@require_GET
def task_export(request: TeamRequest, pk: int) -> HttpResponse:
    task = team_object_or_404(request, Task, pk)
    try:
        text = graders.task_yaml(task=task)
    except ConfigError as exc:
        messages.error(request, f"Task {task.name} cannot be exported: {exc.message}")
        return redirect(task)
    return _yaml_download(request, task, text, f"task-{task.name}.yaml")


def _yaml_download(request: TeamRequest, obj: Any, text: str, filename: str) -> HttpResponse:
    audit_record(team=request.team, actor=request.user, verb=Verb.EXPORT, obj=obj, format="yaml")
    response = HttpResponse(text, content_type="application/yaml; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response

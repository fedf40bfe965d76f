"""Every model in the admin: useful columns, filters, search; actions call services."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.contrib.auth.admin import UserAdmin
from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.timezone import localtime

from webapp.artifacts.selectors import checkpoint_readers_blocker
from webapp.catalog import services as catalog
from webapp.catalog.graders import grader_delete_blocker, task_delete_blocker
from webapp.catalog.selectors import dataset_delete_blocker
from webapp.experiments import services as experiment_services
from webapp.models import (
    Agent,
    ApiToken,
    AuditEvent,
    Checkpoint,
    Dataset,
    Evaluation,
    EvaluationEpisode,
    Experiment,
    Grader,
    Invitation,
    Job,
    JobEpisode,
    LogLine,
    Membership,
    MetricPoint,
    ModelSource,
    Rollout,
    Run,
    Tag,
    Task,
    Team,
    Topology,
    TopologyAgent,
    Worker,
)
from webapp.runs import services as run_services
from webapp.teams.forms import AccountChangeForm, AdminSignupForm
from webapp.teams.services import api_token_revoke, invitation_revoke

admin.site.site_header = admin.site.site_title = "Troupe administration"
# The app list is one click away (Home); the 300 px it took left the run list no room on a 1280 px screen.
admin.site.enable_nav_sidebar = False


class TeamFixedAdmin(admin.ModelAdmin):
    """An object's team is chosen when it is added and never changed here: moving a model source,
    agent, topology, dataset or tag to another team would leave the first team's objects linked to
    it (an agent's model, a run's dataset, a run's tags) and give the second team the first one's
    files. Links between objects are checked on the models (`clean`): one team each."""

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        fields = list(super().get_readonly_fields(request, obj))
        return fields + ["team"] if obj is not None and "team" not in fields else fields


class RecordAdmin(admin.ModelAdmin):
    """Rows the engine, the workers or the services write (metric points, rollouts, checkpoints,
    evaluations, log lines, jobs): shown, never added or edited here, so no run, checkpoint, dataset
    or topology of one team can be linked to another team's."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ["user"]


admin.site.unregister(User)


@admin.register(User)
class AccountAdmin(UserAdmin):
    """Django's user admin; usernames meet the sign-up page's rules (one script, no look-alike)."""

    add_form = AdminSignupForm
    form = AccountChangeForm


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["name", "created"]
    search_fields = ["name"]
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "team", "role", "created"]
    list_filter = ["role", "team"]
    search_fields = ["user__username", "team__name"]
    autocomplete_fields = ["user", "team"]

    def get_readonly_fields(self, request: HttpRequest, obj: Membership | None = None) -> list[str]:
        """A membership is one user in one team: its role changes; moving it is a removal and an addition."""
        return ["user", "team"] if obj is not None else []


@admin.register(ModelSource)
class ModelSourceAdmin(TeamFixedAdmin):
    list_display = ["name", "source", "team", "created"]
    list_filter = ["team"]
    search_fields = ["name", "source", "notes"]


@admin.register(Agent)
class AgentAdmin(TeamFixedAdmin):
    list_display = ["name", "role", "model_source", "trainable", "temperature", "max_new_tokens", "team", "updated"]
    list_filter = ["team", "role", "trainable", "model_source"]
    search_fields = ["name", "role", "instructions"]
    list_select_related = ["team", "model_source"]
    actions = ["duplicate"]

    @admin.action(description="Duplicate selected agents")
    def duplicate(self, request: HttpRequest, queryset: QuerySet[Agent]) -> None:
        copies = [catalog.agent_duplicate(agent=agent, actor=request.user) for agent in queryset]
        self.message_user(request, f"Created {', '.join(a.name for a in copies)}.", messages.SUCCESS)


class TopologyAgentInline(admin.TabularInline):
    model = TopologyAgent
    extra = 1
    ordering = ["position"]
    autocomplete_fields = ["agent"]


@admin.register(Topology)
class TopologyAdmin(TeamFixedAdmin):
    list_display = ["name", "environment", "specialization", "max_turns", "agent_list", "team", "updated"]
    list_filter = ["team", "environment", "specialization"]
    search_fields = ["name", "environment", "members__agent__name"]
    inlines = [TopologyAgentInline]
    actions = ["duplicate"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Topology]:
        return super().get_queryset(request).select_related("team").prefetch_related("members__agent")

    @admin.display(description="agents")
    def agent_list(self, obj: Topology) -> str:
        return " → ".join(m.agent.name for m in obj.members.all())

    @admin.action(description="Duplicate selected topologies")
    def duplicate(self, request: HttpRequest, queryset: QuerySet[Topology]) -> None:
        copies = [catalog.topology_duplicate(topology=t, actor=request.user) for t in queryset]
        self.message_user(request, f"Created {', '.join(t.name for t in copies)}.", messages.SUCCESS)


@admin.register(TopologyAgent)
class TopologyAgentAdmin(admin.ModelAdmin):
    list_display = ["topology", "position", "agent"]
    list_filter = ["topology__team"]
    search_fields = ["topology__name", "agent__name"]
    autocomplete_fields = ["topology", "agent"]


@admin.register(Dataset)
class DatasetAdmin(TeamFixedAdmin):
    list_display = ["name", "kind", "environment", "format", "row_count", "eval_fraction", "status", "team", "created"]
    list_filter = ["team", "kind", "environment", "format", "status"]
    search_fields = ["name", "original_filename", "environment"]
    readonly_fields = ["file", "original_filename", "format", "size_bytes", "row_count", "schema", "preview", "status", "status_message"]
    actions = ["revalidate"]

    def get_readonly_fields(self, request: HttpRequest, obj: Dataset | None = None) -> list[str]:
        """What a stored dataset is (its kind; an uploaded file's environment, which its rows were
        checked against) stays: a task file made a conversations dataset would be accepted as
        `sft.path` and fail when the run starts."""
        fields = super().get_readonly_fields(request, obj)
        if obj is None:
            return fields
        return fields + ["kind"] + (["environment"] if obj.kind != Dataset.Kind.GENERATOR else [])

    def has_delete_permission(self, request: HttpRequest, obj: Dataset | None = None) -> bool:
        """Not while a queued or running run or job needs it (`dataset_delete_blocker`, as on its page)."""
        return super().has_delete_permission(request, obj) and (obj is None or dataset_delete_blocker(dataset=obj) is None)

    @admin.action(description="Re-validate selected datasets")
    def revalidate(self, request: HttpRequest, queryset: QuerySet[Dataset]) -> None:
        results = [catalog.dataset_revalidate(dataset=d) for d in queryset]
        bad = [d.name for d in results if d.status != Dataset.Status.VALID]
        self.message_user(request, f"{len(results) - len(bad)} valid" + (f"; invalid: {', '.join(bad)}" if bad else ""))


@admin.register(Grader)
class GraderAdmin(TeamFixedAdmin):
    """A team's grader: its settings and code are checked on the model (`Grader.clean`, as in the form)."""

    list_display = ["name", "kind", "description", "team", "updated"]
    list_filter = ["team", "kind"]
    search_fields = ["name", "description", "code"]

    def has_delete_permission(self, request: HttpRequest, obj: Grader | None = None) -> bool:
        """Not while a task or a combination names it (`grader_delete_blocker`, as on its page)."""
        return super().has_delete_permission(request, obj) and (obj is None or grader_delete_blocker(grader=obj) is None)


@admin.register(Task)
class TaskAdmin(TeamFixedAdmin):
    list_display = ["name", "team_grader", "team_role", "rounds", "dataset", "team", "updated"]
    list_filter = ["team"]
    search_fields = ["name", "description"]
    list_select_related = ["team", "dataset"]

    def has_delete_permission(self, request: HttpRequest, obj: Task | None = None) -> bool:
        """Not while a topology plays it (`task_delete_blocker`, as on its page)."""
        return super().has_delete_permission(request, obj) and (obj is None or task_delete_blocker(task=obj) is None)


class CheckpointInline(admin.TabularInline):
    model = Checkpoint
    extra = 0
    fields = readonly_fields = ["step", "path", "created", "deleted"]
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    # Few enough columns to fit a 1280 px screen beside the admin's menu and filters; the rest is on the run.
    list_display = ["id", "name", "status", "progress", "priority", "owner", "team", "created"]
    list_editable = ["priority"]  # site staff order the shared queue: higher priority starts first
    list_filter = ["status", "algorithm", "team", "cancel_requested", "created"]
    search_fields = ["name", "owner__username", "topology__name", "dataset__name", "error_message", "celery_task_id"]
    list_select_related = ["owner", "topology", "dataset", "team"]
    date_hierarchy = "created"
    # The admin's run form is for site staff ordering the shared queue (README: "site staff also set
    # a priority in the admin"), and naming, noting and archiving a run. Whose run it is (team,
    # owner), what it ran on (topology, dataset, experiment, its config) and what happened to it are
    # records: moving a run to another team would hand that team its agents' instructions and weights.
    # An allow-list: a field added to Run later is not editable here until someone decides it should be.
    readonly_fields = [
        "team", "owner", "topology", "dataset", "experiment", "trial_index", "pruned_at_step", "tag_list", "resumed_from",
        "resumed_at_step", "config", "environment", "specialization", "algorithm", "gpus", "hosts", "cluster", "plan", "status", "step",
        "total_steps", "metrics", "created", "started", "finished", "heartbeat", "phase", "phase_detail", "phase_progress", "eta",
        "error_message", "error_traceback", "out_dir", "cancel_requested", "celery_task_id", "worker", "queue_order",
    ]
    fields = ["name", "priority", "archived", "notes", *readonly_fields]  # config_yaml, final_metrics, traceback and tags are
    # shown preformatted instead (config, metrics, error_traceback, tag_list)
    inlines = [CheckpointInline]
    actions = ["cancel"]

    @admin.display(description="Tags")
    def tag_list(self, run: Run) -> str:
        return ", ".join(t.name for t in run.tags.all()) or "—"

    @admin.display(description="Progress")
    def progress(self, run: Run) -> str:
        return f"{run.step}/{run.total_steps}"

    @admin.display(description="Config YAML")
    def config(self, run: Run) -> SafeString:
        """The snapshot as YAML, indentation kept (the run form and the CLI re-run it)."""
        return format_html('<pre class="admin-yaml">{}</pre>', run.config_yaml)

    @admin.display(description="Final metrics")
    def metrics(self, run: Run) -> SafeString:
        return format_html("<pre>{}</pre>", json.dumps(run.final_metrics, indent=2, sort_keys=True))

    @admin.display(description="Traceback")
    def error_traceback(self, run: Run) -> SafeString | str:
        return format_html("<pre>{}</pre>", run.traceback) if run.traceback else "—"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # runs start from the run form, which builds and validates the RunConfig

    def has_delete_permission(self, request: HttpRequest, obj: Run | None = None) -> bool:
        """Not a queued or running run, nor one whose checkpoints a queued or running run starts from."""
        if not super().has_delete_permission(request, obj):
            return False
        return obj is None or not obj.is_active and checkpoint_readers_blocker(
            team_id=obj.team_id, paths=list(obj.checkpoints.values_list("path", flat=True))) is None

    @admin.action(description="Cancel selected runs")
    def cancel(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        runs = [run_services.run_cancel(run=run, actor=request.user) for run in queryset.filter(status__in=Run.ACTIVE)]
        self.message_user(request, f"Cancelled or asked to stop {len(runs)} run(s).", messages.SUCCESS)


class TrialInline(admin.TabularInline):
    model = Run
    fields = ["trial_index", "name", "status", "step", "total_steps"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True
    ordering = ["trial_index", "created"]

    def has_add_permission(self, request: HttpRequest, obj: Experiment | None = None) -> bool:
        return False


@admin.register(Experiment)
class ExperimentAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "team", "owner", "trial_count", "state", "created"]
    list_filter = ["team", "created", ("cancelled", admin.EmptyFieldListFilter)]
    search_fields = ["name", "owner__username", "topology__name", "dataset__name", "notes"]
    list_select_related = ["team", "owner"]
    date_hierarchy = "created"
    readonly_fields = ["spec", "trial_count", "created", "cancelled", "topology", "dataset", "team", "owner"]
    exclude = ["spec_yaml"]
    inlines = [TrialInline]
    actions = ["cancel"]

    @admin.display(description="Status")
    def state(self, experiment: Experiment) -> str:
        return Experiment.Status(experiment.status).label

    @admin.display(description="Spec YAML")
    def spec(self, experiment: Experiment) -> SafeString:
        return format_html('<pre class="admin-yaml">{}</pre>', experiment.spec_yaml)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # experiments start from their form or the API, which check the spec

    @admin.action(description="Cancel the selected experiments' queued and running trials")
    def cancel(self, request: HttpRequest, queryset: QuerySet[Experiment]) -> None:
        stopped = sum(experiment_services.experiment_cancel(experiment=e, actor=request.user) for e in queryset if e.is_active)
        self.message_user(request, f"Cancelled or asked to stop {stopped} trial(s).", messages.SUCCESS)


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    """Written by the workers themselves (heartbeats); read-only here."""

    list_display = ["hostname", "online", "run", "rss_bytes", "pid", "started", "last_seen", "stopped"]
    search_fields = ["hostname"]
    list_select_related = ["run"]
    readonly_fields = ["hostname", "pid", "queues", "started", "last_seen", "stopped", "run", "rss_bytes", "gpu"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.display(boolean=True)
    def online(self, worker: Worker) -> bool:
        return worker.is_online()


@admin.register(MetricPoint)
class MetricPointAdmin(RecordAdmin):
    list_display = ["run", "step", "time"]
    list_filter = ["run__team"]
    search_fields = ["run__name"]


@admin.register(Rollout)
class RolloutAdmin(RecordAdmin):
    list_display = ["run", "step", "episode", "success", "team_reward", "agent_names"]
    list_filter = ["success", "run__team"]
    search_fields = ["run__name"]


@admin.register(Checkpoint)
class CheckpointAdmin(RecordAdmin):
    list_display = ["run", "step", "path", "created", "files"]
    list_filter = [("deleted", admin.EmptyFieldListFilter), "run__team"]
    search_fields = ["run__name", "path"]

    def has_delete_permission(self, request: HttpRequest, obj: Checkpoint | None = None) -> bool:
        """Not one a queued or running run resumes or starts from (its row is what the launch checks)."""
        return super().has_delete_permission(request, obj) and (
            obj is None or checkpoint_readers_blocker(team_id=obj.run.team_id, paths=[obj.path]) is None)

    @admin.display(description="files", ordering="deleted")
    def files(self, obj: Checkpoint) -> str:
        """A row outlives its files (checkpoint.keep, Delete from disk): say so."""
        return f"deleted {date_format(localtime(obj.deleted), 'DATETIME_FORMAT')}" if obj.deleted else "on disk"


@admin.register(Evaluation)
class EvaluationAdmin(RecordAdmin):
    list_display = ["run", "step", "temperature", "team_success", "created"]
    list_filter = ["temperature", "run__team"]
    search_fields = ["run__name"]


@admin.register(EvaluationEpisode)
class EvaluationEpisodeAdmin(RecordAdmin):
    list_display = ["evaluation", "episode", "success", "team_reward", "agent_names"]
    list_filter = ["success", "evaluation__run__team"]
    search_fields = ["evaluation__run__name"]


@admin.register(LogLine)
class LogLineAdmin(RecordAdmin):
    list_display = ["run", "time", "level", "message"]
    list_filter = ["level", "run__team"]
    search_fields = ["message", "run__name"]



# -- the shared history (webapp/history, jobs, teams) --------------------------------------


@admin.register(Tag)
class TagAdmin(TeamFixedAdmin):
    list_display = ["name", "team"]
    list_filter = ["team"]
    search_fields = ["name"]


@admin.register(Job)
class JobAdmin(RecordAdmin):
    list_display = ["id", "kind", "status", "run", "owner", "team", "created", "finished", "output_files"]
    list_filter = ["kind", "status", "team"]
    search_fields = ["run__name", "error"]
    list_select_related = ["run", "owner", "team"]

    @admin.display(description="output")
    def output_files(self, obj: Job) -> str:
        """A merged export's folder, or when it was deleted (the job row stays)."""
        deleted = (obj.result or {}).get("deleted") if isinstance(obj.result, dict) else None
        return f"deleted {deleted[:16].replace('T', ' ')}" if deleted else obj.output or "—"


@admin.register(JobEpisode)
class JobEpisodeAdmin(RecordAdmin):
    list_display = ["job", "evaluation", "episode", "success", "team_reward", "agent_names"]
    list_filter = ["success", "job__team"]
    search_fields = ["job__run__name"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are created on the API tokens page (their text is shown once there); here they can
    only be looked at and revoked."""

    list_display = ["name", "user", "team", "prefix", "created", "last_used", "revoked"]
    list_filter = ["team", ("revoked", admin.EmptyFieldListFilter)]
    search_fields = ["name", "user__username", "prefix"]
    readonly_fields = ["user", "team", "name", "prefix", "digest", "created", "last_used", "revoked"]
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        for token in queryset:
            api_token_revoke(token=token, actor=request.user)
        self.message_user(request, f"Revoked {queryset.count()} token(s).", messages.SUCCESS)


@admin.register(Invitation)
class InvitationAdmin(admin.ModelAdmin):
    """Invitations are made on a team's Members page (their link is shown once there); here they can
    only be looked at and revoked."""

    list_display = ["team", "role", "email", "created_by", "created", "expires", "accepted_by", "accepted", "revoked"]
    list_filter = ["team", "role", ("accepted", admin.EmptyFieldListFilter), ("revoked", admin.EmptyFieldListFilter)]
    search_fields = ["email", "team__name", "created_by__username", "accepted_by__username"]
    readonly_fields = ["team", "created_by", "email", "role", "digest", "created", "expires", "accepted", "accepted_by", "revoked"]
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Revoke the selected invitations")
    def revoke(self, request: HttpRequest, queryset: QuerySet[Invitation]) -> None:
        for invitation in queryset:
            invitation_revoke(invitation=invitation, actor=request.user)
        self.message_user(request, f"Revoked {queryset.count()} invitation(s).", messages.SUCCESS)


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    """The teams' audit trails, written by the services: read-only. A superuser may still delete a
    team, which takes its trail with it."""

    list_display = ["time", "team", "actor_name", "verb", "object_type", "object_id", "object_label"]
    list_filter = ["verb", "object_type", "team"]
    search_fields = ["actor_name", "object_label", "team__name"]
    date_hierarchy = "time"
    list_select_related = ["team"]
    readonly_fields = ["team", "actor", "actor_name", "verb", "object_type", "object_id", "object_label", "time", "details"]
    actions = None

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: AuditEvent | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: AuditEvent | None = None) -> bool:
        return bool(request.user.is_superuser)  # only so that deleting a team (and its trail) stays possible

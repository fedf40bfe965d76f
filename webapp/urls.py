"""Every URL of the site; each package's views serve their own (see docs/architecture.md).

`page()` declares a page of the current team: a logged-in user in no team gets the no-team page
there (`webapp.teams.access.CurrentTeamMiddleware`). The rest (login and account pages, invitation
links, health checks, the token-authenticated API, the admin) work without one.
"""

from typing import Any

from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import URLPattern, path, re_path

from webapp.api import openapi as api_openapi
from webapp.api import routes as api_routes
from webapp.artifacts import views as artifacts
from webapp.catalog import views as catalog
from webapp.experiments import views as experiments
from webapp.history import views as history
from webapp.jobs import views as jobs
from webapp.ops import views as ops
from webapp.runs import views as runs
from webapp.teams import views as teams
from webapp.teams.access import team_page


def page(route: str, view: Any, *, name: str) -> URLPattern:
    return path(route, team_page(view), name=name)


urlpatterns = [
    page("", runs.dashboard, name="dashboard"),
    path("login/", auth_views.LoginView.as_view(template_name="login.html"), name="login"),
    path("logout/", teams.LogoutView.as_view(), name="logout"),
    path("account/password/", teams.PasswordChangeView.as_view(template_name="teams/account/password_change.html"),
         name="password_change"),
    path("account/password/done/", auth_views.PasswordChangeDoneView.as_view(template_name="teams/account/password_change_done.html"),
         name="password_change_done"),
    path("password-reset/", teams.PasswordResetView.as_view(
        template_name="teams/account/password_reset.html", email_template_name="teams/account/password_reset_email.txt",
        subject_template_name="teams/account/password_reset_subject.txt"), name="password_reset"),
    path("password-reset/sent/", auth_views.PasswordResetDoneView.as_view(
        template_name="teams/account/password_reset_done.html", extra_context={"timeout_hours": settings.PASSWORD_RESET_TIMEOUT // 3600}),
        name="password_reset_done"),
    path("password-reset/<uidb64>/<token>/", teams.PasswordResetConfirmView.as_view(
        template_name="teams/account/password_reset_confirm.html"), name="password_reset_confirm"),
    path("password-reset/done/", auth_views.PasswordResetCompleteView.as_view(template_name="teams/account/password_reset_complete.html"),
         name="password_reset_complete"),
    path("healthz", ops.healthz, name="healthz"),
    path("favicon.ico", ops.favicon, name="favicon"),  # asked for by browsers on pages without a link (the admin)
    page("workers/", ops.worker_list, name="worker_list"),
    page("storage/", ops.storage_page, name="storage"),
    page("team/", teams.team_switch, name="team_switch"),
    page("team/members/", teams.team_members, name="team_members"),
    page("team/members/<int:pk>/role/", teams.team_member_role, name="team_member_role"),
    page("team/members/<int:pk>/remove/", teams.team_member_remove, name="team_member_remove"),
    page("team/invitations/", teams.team_invite, name="team_invite"),
    page("team/invitations/<int:pk>/revoke/", teams.team_invitation_revoke, name="team_invitation_revoke"),
    page("team/audit/", teams.team_audit, name="team_audit"),
    path("invite/<str:token>/", teams.invitation_accept, name="invitation_accept"),
    page("environment-hint/", catalog.environment_hint, name="environment_hint"),
    page("models/", catalog.model_source_list, name="model_source_list"),
    page("models/new/", catalog.model_source_edit, name="model_source_create"),
    page("models/<int:pk>/", catalog.model_source_edit, name="model_source_edit"),
    page("models/<int:pk>/delete/", catalog.model_source_delete, name="model_source_delete"),
    page("agents/", catalog.agent_list, name="agent_list"),
    page("agents/new/", catalog.agent_edit, name="agent_create"),
    page("agents/<int:pk>/", catalog.agent_edit, name="agent_edit"),
    page("agents/<int:pk>/duplicate/", catalog.agent_duplicate, name="agent_duplicate"),
    page("agents/<int:pk>/delete/", catalog.agent_delete, name="agent_delete"),
    page("topologies/", catalog.topology_list, name="topology_list"),
    page("topologies/new/", catalog.topology_edit, name="topology_create"),
    page("topologies/<int:pk>/", catalog.topology_edit, name="topology_edit"),
    page("topologies/<int:pk>/duplicate/", catalog.topology_duplicate, name="topology_duplicate"),
    page("topologies/<int:pk>/tool-notes/", catalog.topology_tool_notes, name="topology_tool_notes"),
    page("topologies/<int:pk>/delete/", catalog.topology_delete, name="topology_delete"),
    page("datasets/", catalog.dataset_list, name="dataset_list"),
    page("datasets/upload/", catalog.dataset_upload, name="dataset_upload"),
    page("datasets/generate/", catalog.dataset_generate, name="dataset_generate"),
    page("datasets/upload-conversations/", catalog.dataset_upload_conversations, name="dataset_upload_conversations"),
    page("datasets/<int:pk>/", catalog.dataset_detail, name="dataset_detail"),
    page("datasets/<int:pk>/revalidate/", catalog.dataset_revalidate, name="dataset_revalidate"),
    page("datasets/<int:pk>/delete/", catalog.dataset_delete, name="dataset_delete"),
    page("graders/", catalog.grader_list, name="grader_list"),
    page("graders/new/", catalog.grader_edit, name="grader_create"),
    page("graders/<int:pk>/", catalog.grader_edit, name="grader_edit"),
    page("graders/<int:pk>/export.yaml", catalog.grader_export, name="grader_export"),
    page("graders/<int:pk>/delete/", catalog.grader_delete, name="grader_delete"),
    page("tasks/", catalog.task_list, name="task_list"),
    page("tasks/new/", catalog.task_edit, name="task_create"),
    page("tasks/<int:pk>/", catalog.task_edit, name="task_edit"),
    page("tasks/<int:pk>/topology/", catalog.task_topology, name="task_topology"),
    page("tasks/<int:pk>/export.yaml", catalog.task_export, name="task_export"),
    page("tasks/<int:pk>/delete/", catalog.task_delete, name="task_delete"),
    page("runs/", history.run_list, name="run_list"),
    page("runs/export.csv", history.run_export, name="run_export"),
    page("runs/compare/", history.run_compare, name="run_compare"),
    page("runs/compare/data/", history.run_compare_data, name="run_compare_data"),
    page("runs/new/", runs.run_new, name="run_new"),
    page("runs/preview/", runs.run_preview, name="run_preview"),
    page("runs/<int:pk>/", runs.run_detail, name="run_detail"),
    page("runs/<int:pk>/rollouts/", runs.run_rollouts, name="run_rollouts"),
    page("runs/<int:pk>/evaluations/<int:evaluation>/", runs.run_evaluation, name="run_evaluation"),
    page("runs/<int:pk>/jobs/<int:job>/episodes/", runs.run_job_episodes, name="run_job_episodes"),
    page("runs/<int:pk>/cancel/", runs.run_cancel, name="run_cancel"),
    page("runs/<int:pk>/resume/", runs.run_resume, name="run_resume"),
    page("runs/<int:pk>/warm-start/", runs.run_warm_start, name="run_warm_start"),
    page("runs/<int:pk>/queue/", runs.run_queue_position, name="run_queue_position"),
    re_path(r"^runs/(?P<pk>[0-9]+)/queue/(?P<direction>up|down)/$", team_page(runs.run_queue_move), name="run_queue_move"),
    page("runs/<int:pk>/tags/", history.run_tags, name="run_tags"),
    page("runs/<int:pk>/notes/", history.run_notes, name="run_notes"),
    page("runs/<int:pk>/archive/", history.run_archive, name="run_archive"),
    page("runs/<int:pk>/evaluate/", jobs.run_evaluate, name="run_evaluate"),
    page("runs/<int:pk>/ablate/", jobs.run_ablate, name="run_ablate"),
    page("runs/<int:pk>/artifacts/", artifacts.run_artifacts, name="run_artifacts"),
    page("runs/<int:pk>/files/<str:name>", artifacts.run_file, name="run_file"),
    page("runs/<int:pk>/checkpoints/<int:step>/<str:name>.zip", artifacts.run_checkpoint_download, name="run_checkpoint_download"),
    page("runs/<int:pk>/checkpoints/<int:step>/<str:name>/merge/", jobs.run_merge, name="run_merge"),
    page("runs/<int:pk>/merged/<int:job_id>.zip", artifacts.run_merged_download, name="run_merged_download"),
    page("runs/<int:pk>/checkpoints/<int:step>/delete/", artifacts.run_checkpoint_delete, name="run_checkpoint_delete"),
    page("runs/<int:pk>/merged/<int:job_id>/delete/", artifacts.run_export_delete, name="run_export_delete"),
    page("experiments/", experiments.experiment_list, name="experiment_list"),
    page("experiments/new/", experiments.experiment_new, name="experiment_new"),
    page("experiments/preview/", experiments.experiment_preview, name="experiment_preview"),
    page("experiments/<int:pk>/", experiments.experiment_detail, name="experiment_detail"),
    page("experiments/<int:pk>/cancel/", experiments.experiment_cancel, name="experiment_cancel"),
    page("experiments/<int:pk>/resume/", experiments.experiment_resume, name="experiment_resume"),
    page("experiments/<int:pk>/export.csv", experiments.experiment_export, name="experiment_export"),
    page("experiments/<int:pk>/curves.json", experiments.experiment_curves, name="experiment_curves"),
    page("experiments/<int:pk>/diff/", experiments.experiment_diff, name="experiment_diff"),
    page("experiments/<int:pk>/ablate/", experiments.experiment_ablate, name="experiment_ablate"),
    page("playground/", jobs.playground, name="playground"),
    page("playground/<int:pk>/", jobs.playground_job, name="playground_job"),
    page("account/tokens/", teams.api_tokens, name="api_tokens"),
    page("account/tokens/<int:pk>/revoke/", teams.api_token_revoke, name="api_token_revoke"),
    path("api/v1/openapi.json", api_openapi.document, name="api_openapi"),
    *api_routes.urlpatterns(),  # the API's routes on django-ninja (webapp/api/routes.py mounts each module's router)
    path("admin/", admin.site.urls),
]

handler404 = "webapp.api.http.not_found"
handler500 = "webapp.api.http.server_error"

"""Every URL of the site; each package's views serve their own (see docs/architecture.md)."""

from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path, re_path

from webapp.api import catalog as api_catalog
from webapp.api import experiments as api_experiments
from webapp.api import jobs as api_jobs
from webapp.api import openapi as api_openapi
from webapp.api import views as api
from webapp.artifacts import views as artifacts
from webapp.catalog import views as catalog
from webapp.experiments import views as experiments
from webapp.history import views as history
from webapp.jobs import views as jobs
from webapp.ops import views as ops
from webapp.runs import views as runs
from webapp.teams import views as teams

urlpatterns = [
    path("", runs.dashboard, name="dashboard"),
    path("login/", auth_views.LoginView.as_view(template_name="login.html"), name="login"),
    path("logout/", teams.LogoutView.as_view(), name="logout"),
    path("account/password/", teams.PasswordChangeView.as_view(template_name="account/password_change.html"),
         name="password_change"),
    path("account/password/done/", auth_views.PasswordChangeDoneView.as_view(template_name="account/password_change_done.html"),
         name="password_change_done"),
    path("password-reset/", teams.PasswordResetView.as_view(
        template_name="account/password_reset.html", email_template_name="account/password_reset_email.txt",
        subject_template_name="account/password_reset_subject.txt"), name="password_reset"),
    path("password-reset/sent/", auth_views.PasswordResetDoneView.as_view(
        template_name="account/password_reset_done.html", extra_context={"timeout_hours": settings.PASSWORD_RESET_TIMEOUT // 3600}),
        name="password_reset_done"),
    path("password-reset/<uidb64>/<token>/", teams.PasswordResetConfirmView.as_view(
        template_name="account/password_reset_confirm.html"), name="password_reset_confirm"),
    path("password-reset/done/", auth_views.PasswordResetCompleteView.as_view(template_name="account/password_reset_complete.html"),
         name="password_reset_complete"),
    path("healthz", ops.healthz, name="healthz"),
    path("favicon.ico", ops.favicon, name="favicon"),  # asked for by browsers on pages without a link (the admin)
    path("workers/", ops.worker_list, name="worker_list"),
    path("storage/", ops.storage_page, name="storage"),
    path("team/", teams.team_switch, name="team_switch"),
    path("team/members/", teams.team_members, name="team_members"),
    path("team/members/<int:pk>/role/", teams.team_member_role, name="team_member_role"),
    path("team/members/<int:pk>/remove/", teams.team_member_remove, name="team_member_remove"),
    path("team/invitations/", teams.team_invite, name="team_invite"),
    path("team/invitations/<int:pk>/revoke/", teams.team_invitation_revoke, name="team_invitation_revoke"),
    path("team/audit/", teams.team_audit, name="team_audit"),
    path("invite/<str:token>/", teams.invitation_accept, name="invitation_accept"),
    path("environment-hint/", catalog.environment_hint, name="environment_hint"),
    path("models/", catalog.model_source_list, name="model_source_list"),
    path("models/new/", catalog.model_source_edit, name="model_source_create"),
    path("models/<int:pk>/", catalog.model_source_edit, name="model_source_edit"),
    path("models/<int:pk>/delete/", catalog.model_source_delete, name="model_source_delete"),
    path("agents/", catalog.agent_list, name="agent_list"),
    path("agents/new/", catalog.agent_edit, name="agent_create"),
    path("agents/<int:pk>/", catalog.agent_edit, name="agent_edit"),
    path("agents/<int:pk>/duplicate/", catalog.agent_duplicate, name="agent_duplicate"),
    path("agents/<int:pk>/delete/", catalog.agent_delete, name="agent_delete"),
    path("topologies/", catalog.topology_list, name="topology_list"),
    path("topologies/new/", catalog.topology_edit, name="topology_create"),
    path("topologies/<int:pk>/", catalog.topology_edit, name="topology_edit"),
    path("topologies/<int:pk>/duplicate/", catalog.topology_duplicate, name="topology_duplicate"),
    path("topologies/<int:pk>/tool-notes/", catalog.topology_tool_notes, name="topology_tool_notes"),
    path("topologies/<int:pk>/delete/", catalog.topology_delete, name="topology_delete"),
    path("datasets/", catalog.dataset_list, name="dataset_list"),
    path("datasets/upload/", catalog.dataset_upload, name="dataset_upload"),
    path("datasets/generate/", catalog.dataset_generate, name="dataset_generate"),
    path("datasets/upload-conversations/", catalog.dataset_upload_conversations, name="dataset_upload_conversations"),
    path("datasets/<int:pk>/", catalog.dataset_detail, name="dataset_detail"),
    path("datasets/<int:pk>/revalidate/", catalog.dataset_revalidate, name="dataset_revalidate"),
    path("datasets/<int:pk>/delete/", catalog.dataset_delete, name="dataset_delete"),
    path("runs/", history.run_list, name="run_list"),
    path("runs/export.csv", history.run_export, name="run_export"),
    path("runs/compare/", history.run_compare, name="run_compare"),
    path("runs/compare/data/", history.run_compare_data, name="run_compare_data"),
    path("runs/new/", runs.run_new, name="run_new"),
    path("runs/preview/", runs.run_preview, name="run_preview"),
    path("runs/<int:pk>/", runs.run_detail, name="run_detail"),
    path("runs/<int:pk>/rollouts/", runs.run_rollouts, name="run_rollouts"),
    path("runs/<int:pk>/cancel/", runs.run_cancel, name="run_cancel"),
    path("runs/<int:pk>/resume/", runs.run_resume, name="run_resume"),
    path("runs/<int:pk>/queue/", runs.run_queue_position, name="run_queue_position"),
    re_path(r"^runs/(?P<pk>[0-9]+)/queue/(?P<direction>up|down)/$", runs.run_queue_move, name="run_queue_move"),
    path("runs/<int:pk>/tags/", history.run_tags, name="run_tags"),
    path("runs/<int:pk>/notes/", history.run_notes, name="run_notes"),
    path("runs/<int:pk>/archive/", history.run_archive, name="run_archive"),
    path("runs/<int:pk>/evaluate/", jobs.run_evaluate, name="run_evaluate"),
    path("runs/<int:pk>/artifacts/", artifacts.run_artifacts, name="run_artifacts"),
    path("runs/<int:pk>/files/<str:name>", artifacts.run_file, name="run_file"),
    path("runs/<int:pk>/checkpoints/<int:step>/<str:name>.zip", artifacts.run_checkpoint_download, name="run_checkpoint_download"),
    path("runs/<int:pk>/checkpoints/<int:step>/<str:name>/merge/", jobs.run_merge, name="run_merge"),
    path("runs/<int:pk>/merged/<int:job_id>.zip", artifacts.run_merged_download, name="run_merged_download"),
    path("runs/<int:pk>/checkpoints/<int:step>/delete/", artifacts.run_checkpoint_delete, name="run_checkpoint_delete"),
    path("runs/<int:pk>/merged/<int:job_id>/delete/", artifacts.run_export_delete, name="run_export_delete"),
    path("experiments/", experiments.experiment_list, name="experiment_list"),
    path("experiments/new/", experiments.experiment_new, name="experiment_new"),
    path("experiments/preview/", experiments.experiment_preview, name="experiment_preview"),
    path("experiments/<int:pk>/", experiments.experiment_detail, name="experiment_detail"),
    path("experiments/<int:pk>/cancel/", experiments.experiment_cancel, name="experiment_cancel"),
    path("experiments/<int:pk>/resume/", experiments.experiment_resume, name="experiment_resume"),
    path("experiments/<int:pk>/export.csv", experiments.experiment_export, name="experiment_export"),
    path("playground/", jobs.playground, name="playground"),
    path("playground/<int:pk>/", jobs.playground_job, name="playground_job"),
    path("account/tokens/", teams.api_tokens, name="api_tokens"),
    path("account/tokens/<int:pk>/revoke/", teams.api_token_revoke, name="api_token_revoke"),
    path("api/v1/", api.index, name="api_index"),
    path("api/v1/openapi.json", api_openapi.document, name="api_openapi"),
    path("api/v1/models/", api_catalog.models, name="api_models"),
    path("api/v1/models/<int:pk>/", api_catalog.model_detail, name="api_model"),
    path("api/v1/agents/", api_catalog.agents, name="api_agents"),
    path("api/v1/agents/<int:pk>/", api_catalog.agent_detail, name="api_agent"),
    path("api/v1/topologies/", api_catalog.topologies, name="api_topologies"),
    path("api/v1/topologies/<int:pk>/", api_catalog.topology_detail, name="api_topology"),
    path("api/v1/datasets/", api_catalog.datasets, name="api_datasets"),
    path("api/v1/datasets/<int:pk>/", api_catalog.dataset_detail, name="api_dataset"),
    path("api/v1/playground/", api_jobs.playground, name="api_playground"),
    path("api/v1/jobs/", api_jobs.jobs, name="api_jobs"),
    path("api/v1/jobs/<int:pk>/", api_jobs.job_detail, name="api_job"),
    path("api/v1/experiments/", api_experiments.experiments, name="api_experiments"),
    path("api/v1/experiments/<int:pk>/", api_experiments.experiment_detail, name="api_experiment"),
    path("api/v1/experiments/<int:pk>/cancel/", api_experiments.experiment_cancel, name="api_experiment_cancel"),
    path("api/v1/experiments/<int:pk>/resume/", api_experiments.experiment_resume, name="api_experiment_resume"),
    path("api/v1/runs/", api.runs, name="api_runs"),
    path("api/v1/runs/<int:pk>/", api.run_detail, name="api_run"),
    path("api/v1/runs/<int:pk>/cancel/", api.run_cancel, name="api_run_cancel"),
    path("api/v1/runs/<int:pk>/metrics/", api.run_metrics, name="api_run_metrics"),
    path("api/v1/runs/<int:pk>/rollouts/", api.run_rollouts, name="api_run_rollouts"),
    path("api/v1/runs/<int:pk>/evaluations/", api.run_evaluations, name="api_run_evaluations"),
    path("api/v1/runs/<int:pk>/artifacts/checkpoints/<int:step>/<str:name>.zip", api.checkpoint_file, name="api_checkpoint_download"),
    path("api/v1/runs/<int:pk>/artifacts/merged/<int:job_id>.zip", api.merged_file, name="api_merged_download"),
    path("api/v1/runs/<int:pk>/artifacts/<str:name>", api.run_file, name="api_run_file"),
    path("admin/", admin.site.urls),
]

handler404 = "webapp.api.http.not_found"
handler500 = "webapp.api.http.server_error"

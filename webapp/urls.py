from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path, re_path

from webapp import views_ops
from webapp import views

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("login/", auth_views.LoginView.as_view(template_name="login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("healthz", views_ops.healthz, name="healthz"),
    path("workers/", views_ops.worker_list, name="worker_list"),
    path("team/", views.team_switch, name="team_switch"),
    path("environment-hint/", views.environment_hint, name="environment_hint"),
    path("models/", views.model_source_list, name="model_source_list"),
    path("models/new/", views.model_source_edit, name="model_source_create"),
    path("models/<int:pk>/", views.model_source_edit, name="model_source_edit"),
    path("models/<int:pk>/delete/", views.model_source_delete, name="model_source_delete"),
    path("agents/", views.agent_list, name="agent_list"),
    path("agents/new/", views.agent_edit, name="agent_create"),
    path("agents/<int:pk>/", views.agent_edit, name="agent_edit"),
    path("agents/<int:pk>/duplicate/", views.agent_duplicate, name="agent_duplicate"),
    path("agents/<int:pk>/delete/", views.agent_delete, name="agent_delete"),
    path("topologies/", views.topology_list, name="topology_list"),
    path("topologies/new/", views.topology_edit, name="topology_create"),
    path("topologies/<int:pk>/", views.topology_edit, name="topology_edit"),
    path("topologies/<int:pk>/duplicate/", views.topology_duplicate, name="topology_duplicate"),
    path("topologies/<int:pk>/delete/", views.topology_delete, name="topology_delete"),
    path("datasets/", views.dataset_list, name="dataset_list"),
    path("datasets/upload/", views.dataset_upload, name="dataset_upload"),
    path("datasets/generate/", views.dataset_generate, name="dataset_generate"),
    path("datasets/<int:pk>/", views.dataset_detail, name="dataset_detail"),
    path("datasets/<int:pk>/revalidate/", views.dataset_revalidate, name="dataset_revalidate"),
    path("datasets/<int:pk>/delete/", views.dataset_delete, name="dataset_delete"),
    path("runs/", views.run_list, name="run_list"),
    path("runs/new/", views.run_new, name="run_new"),
    path("runs/preview/", views.run_preview, name="run_preview"),
    path("runs/<int:pk>/", views.run_detail, name="run_detail"),
    path("runs/<int:pk>/rollouts/", views.run_rollouts, name="run_rollouts"),
    path("runs/<int:pk>/cancel/", views.run_cancel, name="run_cancel"),
    path("runs/<int:pk>/resume/", views.run_resume, name="run_resume"),
    path("runs/<int:pk>/queue/", views_ops.run_queue_position, name="run_queue_position"),
    re_path(r"^runs/(?P<pk>[0-9]+)/queue/(?P<direction>up|down)/$", views_ops.run_queue_move, name="run_queue_move"),
    path("admin/", admin.site.urls),
]

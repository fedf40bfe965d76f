"""Each page action has its API call (issue 46, class 4): every view of webapp/urls.py that takes a
POST is listed here with the API operation that does the same through the same service, or as
page-only by its nature (with why). A new page action fails this test until it is put in one of the
two lists; an API operation named here must exist and allow the method named."""

from __future__ import annotations

from typing import Any

from django.urls import URLPattern, URLResolver, get_resolver

API_CALLS: dict[str, tuple[str, str]] = {
    # page URL name -> (method, API URL name)
    "model_source_create": ("POST", "api_models"), "model_source_edit": ("PATCH", "api_model"), "model_source_delete": ("DELETE", "api_model"),
    "agent_create": ("POST", "api_agents"), "agent_edit": ("PATCH", "api_agent"), "agent_delete": ("DELETE", "api_agent"),
    "topology_create": ("POST", "api_topologies"), "topology_edit": ("PATCH", "api_topology"), "topology_delete": ("DELETE", "api_topology"),
    "dataset_upload": ("POST", "api_datasets"), "dataset_generate": ("POST", "api_datasets"), "dataset_delete": ("DELETE", "api_dataset"),
    "grader_create": ("POST", "api_graders"), "grader_edit": ("PATCH", "api_grader"), "grader_delete": ("DELETE", "api_grader"),
    "task_create": ("POST", "api_tasks"), "task_edit": ("PATCH", "api_task"), "task_delete": ("DELETE", "api_task"),
    "run_new": ("POST", "api_runs"), "run_cancel": ("POST", "api_run_cancel"), "run_resume": ("POST", "api_run_resume"),
    "run_warm_start": ("POST", "api_run_warm_start"), "run_queue_move": ("POST", "api_run_queue_move"),
    "run_tags": ("PATCH", "api_run"), "run_notes": ("PATCH", "api_run"), "run_archive": ("PATCH", "api_run"),
    "run_evaluate": ("POST", "api_run_evaluations"), "run_ablate": ("POST", "api_run_ablations"), "run_merge": ("POST", "api_run_export"),
    "experiment_new": ("POST", "api_experiments"), "experiment_preview": ("POST", "api_experiment_preview"),
    "experiment_cancel": ("POST", "api_experiment_cancel"), "experiment_resume": ("POST", "api_experiment_resume"),
    "playground": ("POST", "api_playground"),
    "agent_duplicate": ("POST", "api_agent_duplicate"), "topology_duplicate": ("POST", "api_topology_duplicate"),
    "dataset_revalidate": ("POST", "api_dataset_revalidate"), "task_topology": ("POST", "api_task_topology"),
    "run_checkpoint_delete": ("DELETE", "api_checkpoint_delete"), "run_export_delete": ("DELETE", "api_export_delete"),
    "experiment_ablate": ("POST", "api_experiment_ablations"), "run_preview": ("POST", "api_run_preview"),
    "dataset_detail": ("PATCH", "api_dataset"), "dataset_upload_conversations": ("POST", "api_conversations_upload"),
}
"""(The graders' and tasks' Try buttons post to their edit pages: POST /api/v1/graders/try/ and /api/v1/tasks/try/.)"""

PAGE_ONLY: dict[str, str] = {
    # Signing in and out, and the account: a person in a browser; a token is made by a signed-in person and acts as one.
    "login": "signing in", "logout": "signing out", "password_change": "the account's password",
    "password_reset": "the account's password", "password_reset_confirm": "the account's password",
    "invitation_accept": "joining a team is the invited person's own act, in the browser",
    # Who may act for the team: decided by a signed-in person, never by a token (a leaked token must not widen itself).
    "team_switch": "the browser session's current team (a token has one team already)",
    "team_member_role": "roles in the team", "team_member_remove": "membership", "team_invite": "membership",
    "team_invitation_revoke": "membership", "api_tokens": "tokens are made on the page", "api_token_revoke": "tokens are revoked on the page",
    # Pages that read, with no method decorator: a POST shows the same page.
    "run_detail": "the run page (GET /api/v1/runs/<id>/)", "experiment_detail": "the experiment page (GET /api/v1/experiments/<id>/)",
}

def _methods(callback: Any) -> set[str] | None:
    """The methods a page view allows (its require_http_methods list, or a class view's handlers); None: not limited."""
    view_class = getattr(callback, "view_class", None)
    if view_class is not None:
        return {m.upper() for m in view_class.http_method_names if hasattr(view_class, m)}
    function = callback
    while function is not None:
        for cell in getattr(function, "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            if isinstance(value, (list, tuple)) and value and all(isinstance(m, str) and m in ("GET", "HEAD", "POST", "PUT", "DELETE") for m in value):
                return set(value)
        function = getattr(function, "__wrapped__", None)
    return None


def _patterns() -> dict[str, Any]:
    out: dict[str, Any] = {}

    def walk(patterns: list[Any], prefix: str) -> None:
        for p in patterns:
            if isinstance(p, URLResolver):
                if not str(p.pattern).startswith("admin/"):  # the admin: site staff in the browser
                    walk(p.url_patterns, prefix + str(p.pattern))
            elif isinstance(p, URLPattern) and p.name:
                out[p.name] = (prefix + str(p.pattern), p.callback)

    walk(get_resolver().url_patterns, "")
    return out


def test_every_page_action_has_its_api_call():
    patterns = _patterns()
    actions = {name for name, (route, view) in patterns.items()
               if not route.startswith("api/") and ((methods := _methods(view)) is None or "POST" in methods)}
    listed = set(API_CALLS) | set(PAGE_ONLY)
    assert actions - listed == set(), f"page actions without an API call: {sorted(actions - listed)}"
    assert listed - actions == set(), f"listed but not a page action (any more): {sorted(listed - actions)}"
    assert not set(API_CALLS) & set(PAGE_ONLY)
    for page, (method, api_name) in API_CALLS.items():
        assert api_name in patterns, f"{page}: no API URL named {api_name}"
        allowed = getattr(patterns[api_name][1], "api_methods", ())
        assert method in allowed, f"{page}: {api_name} allows {allowed}, not {method}"

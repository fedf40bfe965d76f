"""Who sees what: every page works inside the user's current team.

A user in several teams picks the current one in the header (kept in the session); every page,
list and object lookup is scoped to it, so another team's object is a 404 even for a user who is
also in that team, until they switch. Login itself is enforced by Django's LoginRequiredMiddleware.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any, TypeVar

from django.conf import settings
from django.contrib.auth import SESSION_KEY as AUTH_SESSION_KEY
from django.contrib.auth.models import User
from django.db.models import Model
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django_htmx.middleware import HtmxDetails

from webapp.core import sockets
from webapp.core.bodylimit import Credentials
from webapp.models import Membership, Team
from webapp.teams.services import api_token_authenticate

SESSION_KEY = "troupe_team_id"


M = TypeVar("M", bound=Model)


class TeamRequest(HttpRequest):
    """What our views receive: a logged-in user, their current team, htmx details."""

    user: User
    team: Team
    membership: Membership
    memberships: list[Membership]
    htmx: HtmxDetails


def team_object_or_404(request: TeamRequest, model: type[M], pk: int) -> M:
    """The object if it belongs to the current team, else 404 (never 403: no existence leak)."""
    return get_object_or_404(model, pk=pk, team=request.team)


class CurrentTeamMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request.team = None  # type: ignore[attr-defined]
        request.membership = None  # type: ignore[attr-defined]
        request.memberships = []  # type: ignore[attr-defined]
        if request.user.is_authenticated:
            memberships = list(Membership.objects.filter(user=request.user).select_related("team"))
            wanted = request.session.get(SESSION_KEY)
            current = next((m for m in memberships if m.team_id == wanted), memberships[0] if memberships else None)
            request.memberships = memberships  # type: ignore[attr-defined]
            request.membership = current  # type: ignore[attr-defined]
            request.team = current.team if current else None  # type: ignore[attr-defined]
        return self.get_response(request)

    def process_view(self, request: HttpRequest, view_func: Callable[..., Any], *args: Any) -> HttpResponse | None:
        """A team's page (declared with `team_page` in webapp/urls.py) needs a current team; a
        logged-in user in none gets an explanation, not an error."""
        if getattr(view_func, "needs_team", False) and request.user.is_authenticated and request.team is None:  # type: ignore[attr-defined]
            return render(request, "no_team.html", status=403)
        return None


V = TypeVar("V", bound=Callable[..., Any])


def team_page(view: V) -> V:
    """Declare `view` a page of the current team (`CurrentTeamMiddleware` then asks for one). The
    URL map declares it for each page; the API, the account pages, invitations and health checks
    are not team pages."""
    view.needs_team = True  # type: ignore[attr-defined]
    return view


def team_context(request: HttpRequest) -> dict[str, Any]:
    return {
        "team": getattr(request, "team", None),
        "memberships": getattr(request, "memberships", []),
        "team_admin": is_team_admin(request),
    }


def is_team_admin(request: HttpRequest) -> bool:
    """An admin of the current team, or site staff: may delete the team's checkpoints and exports."""
    user = getattr(request, "user", None)
    membership = getattr(request, "membership", None)
    return bool(user is not None and user.is_authenticated and (user.is_staff or (membership is not None and membership.role == "admin")))


def credentials_signed_in(found: Credentials) -> bool:
    """Whether a request's credentials, read from its headers before its body, name a signed-in
    user: a live API token (`Authorization: Bearer`, as the API checks it), or a session of an
    active user whose password has not changed since (as a websocket checks it). What the body-size
    limits ask (webapp/core/bodylimit.py): a request that is not signed in gets the smallest limit.
    Reads only; runs in a worker thread, never on the event loop."""
    scheme, _, text = found.authorization.partition(" ")
    if scheme.lower() == "bearer" and api_token_authenticate(text=text.strip(), touch=False) is not None:
        return True
    if not found.session_key:
        return False
    session = import_module(settings.SESSION_ENGINE).SessionStore(session_key=found.session_key).load()
    user_id = session.get(AUTH_SESSION_KEY)
    return user_id is not None and sockets.socket_allowed(session_key=found.session_key, user_id=user_id, auth_hash=None) is not None

"""A member's own pages and the team's: switching team, members and roles, API tokens, and the
login page when locked out.

Each view: fetch within the current team (another team's object is a 404), call one service,
render or redirect; htmx requests get the page's named partial (`page.html#name`).
"""

from __future__ import annotations

import math
from typing import Any

from axes.helpers import get_cool_off
from django.contrib import messages
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from webapp.models import ApiToken, Membership
from webapp.teams import services
from webapp.teams.access import SESSION_KEY, TeamRequest, is_team_admin
from webapp.teams.forms import ApiTokenForm


@require_POST
def team_switch(request: TeamRequest) -> HttpResponse:
    membership = next((m for m in request.memberships if str(m.team_id) == request.POST.get("team")), None)
    if membership is None:
        raise Http404("not a member of that team")
    request.session[SESSION_KEY] = membership.team_id
    return redirect("dashboard")


# == members ==============================================================================================


@require_GET
def team_members(request: TeamRequest) -> HttpResponse:
    members = Membership.objects.filter(team=request.team).select_related("user").order_by("user__username")
    return render(request, "team/members.html", {"members": members, "can_manage": is_team_admin(request),
                                                 "roles": Membership.Role.choices})


def _managed_membership(request: TeamRequest, pk: int, *, own_allowed: bool = False) -> Membership:
    """A membership of the current team (another team's is a 404), for a team admin (else 403);
    with `own_allowed`, any member may act on their own (leaving the team)."""
    membership = get_object_or_404(Membership.objects.select_related("user"), pk=pk, team=request.team)
    if not (is_team_admin(request) or (own_allowed and membership.user_id == request.user.pk)):
        raise PermissionDenied("Only the team's admins manage its members.")
    return membership


@require_POST
def team_member_role(request: TeamRequest, pk: int) -> HttpResponse:
    membership = _managed_membership(request, pk)
    try:
        services.membership_set_role(membership=membership, role=request.POST.get("role", ""))
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"{membership.user.username} is now a team {membership.get_role_display().lower()}.")
    return redirect("team_members")


@require_http_methods(["GET", "POST"])
def team_member_remove(request: TeamRequest, pk: int) -> HttpResponse:
    """GET: what removing the member means, or why it cannot be done; POST: remove them. A member
    may remove themselves (leave the team)."""
    membership = _managed_membership(request, pk, own_allowed=True)
    error = services.membership_remove_blocker(membership=membership)
    if request.method == "POST" and error is None:
        services.membership_remove(membership=membership)
        messages.success(request, f"{membership.user.username} is no longer in {request.team}.")
        return redirect("dashboard" if membership.user_id == request.user.pk else "team_members")
    return render(request, "team/member_remove.html", {"membership": membership, "error": error})


# == API tokens ===========================================================================================


@require_http_methods(["GET", "POST"])
def api_tokens(request: TeamRequest) -> HttpResponse:
    """The user's tokens; POST creates one and shows it once (it is not stored)."""
    form = ApiTokenForm(request.POST or None)
    new_token = None
    if request.method == "POST" and form.is_valid():
        try:
            _, new_token = services.api_token_create(user=request.user, team=request.team, name=form.cleaned_data["name"])
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
    services.api_token_revoke(token=token)
    messages.success(request, f"Revoked {token.name}.")
    return redirect("api_tokens")


def login_locked_out(request: HttpRequest, original_response: HttpResponse | None = None,
                     credentials: dict[str, Any] | None = None) -> HttpResponse:
    """429 with the login form: "too many failed logins, try again in N minutes". Each try while
    locked out starts the cool-off again (axes' default), so N is counted from now."""
    cool_off = get_cool_off(request)
    minutes = math.ceil(cool_off.total_seconds() / 60) if cool_off else None
    username = request.POST.get("username", "")[:150]
    form = AuthenticationForm(request, initial={"username": username})
    return render(request, "login.html", {"form": form, "locked_out_minutes": minutes, "next": request.POST.get("next", "")},
                  status=429)

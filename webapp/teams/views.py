"""A member's own pages and the team's: switching team, members, roles and invitations, the
audit trail, API tokens, and the login page when locked out.

Each view: fetch within the current team (another team's object is a 404), call one service,
render or redirect; htmx requests get the page's named partial (`page.html#name`).
"""

from __future__ import annotations

import math
from typing import Any

from axes.helpers import get_cool_off
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_not_required
from django.contrib.auth.forms import AuthenticationForm, PasswordResetForm
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from webapp.core import sockets
from webapp.models import ApiToken, Invitation, Membership
from webapp.teams import audit, services
from webapp.teams.access import SESSION_KEY, TeamRequest, is_team_admin
from webapp.teams.forms import ApiTokenForm, AuditFilterForm, InvitationForm, PasswordChangeForm, SetPasswordForm, SignupForm


@require_POST
def team_switch(request: TeamRequest) -> HttpResponse:
    membership = next((m for m in request.memberships if str(m.team_id) == request.POST.get("team")), None)
    if membership is None:
        raise Http404("not a member of that team")
    request.session[SESSION_KEY] = membership.team_id
    return redirect("dashboard")


# == members ==============================================================================================


NEW_LINK_KEY = "troupe_new_invitation_link"
"""Where the link just made waits (in the server-side session) for the page after the redirect,
which shows it once: reloading that page neither shows it again nor makes another invitation."""


@require_GET
def team_members(request: TeamRequest) -> HttpResponse:
    response = _members_page(request, InvitationForm(), new_link=request.session.pop(NEW_LINK_KEY, ""))
    response["Cache-Control"] = "no-store"
    return response


def _members_page(request: TeamRequest, form: InvitationForm, *, new_link: str = "", status: int = 200) -> HttpResponse:
    can_manage = is_team_admin(request)
    members = Membership.objects.filter(team=request.team).select_related("user").order_by("user__username")
    pending = [i for i in Invitation.objects.filter(team=request.team, accepted=None, revoked=None) if i.is_pending] if can_manage else []
    return render(request, "teams/members.html", {
        "members": members, "can_manage": can_manage, "roles": Membership.Role.choices, "invite_form": form,
        "invitations": pending, "new_link": new_link, "invitation_days": settings.TROUPE_INVITATION_DAYS,
    }, status=status)


@require_POST
def team_invite(request: TeamRequest) -> HttpResponse:
    """A team admin makes an invitation link: shown once on the page, emailed when an address is given."""
    if not is_team_admin(request):
        raise PermissionDenied("Only the team's admins invite people.")
    form = InvitationForm(request.POST)
    if not form.is_valid():
        return _members_page(request, form, status=400)
    try:
        _, link = services.invitation_create(
            team=request.team, by=request.user, role=form.cleaned_data["role"], email=form.cleaned_data["email"],
            link_for=lambda token: services.site_link(reverse("invitation_accept", args=[token])),
        )
    except ValidationError as exc:
        form.add_error(None, exc)
        return _members_page(request, form, status=400)
    request.session[NEW_LINK_KEY] = link
    return redirect(reverse("team_members") + "#new-invitation")


@require_POST
def team_invitation_revoke(request: TeamRequest, pk: int) -> HttpResponse:
    invitation = get_object_or_404(Invitation, pk=pk, team=request.team)
    if not is_team_admin(request):
        raise PermissionDenied("Only the team's admins manage invitations.")
    services.invitation_revoke(invitation=invitation, actor=request.user)
    messages.success(request, "Invitation revoked: its link no longer works.")
    return redirect("team_members")


@login_not_required
@require_http_methods(["GET", "POST"])
def invitation_accept(request: HttpRequest, token: str) -> HttpResponse:
    """Join a team through an invitation link: a logged-in user joins with one click; a visitor
    makes an account (username and password) and joins."""
    invitation = services.invitation_find(token=token)
    if invitation is None:
        return render(request, "teams/invitation.html", {"invitation": None}, status=404)
    signup = None if request.user.is_authenticated else SignupForm(request.POST or None)
    error = ""
    if request.method == "POST":
        user = request.user
        if signup is not None:
            if not signup.is_valid():
                return render(request, "teams/invitation.html", {"invitation": invitation, "signup": signup}, status=400)
        try:
            with transaction.atomic():  # a new account and its membership, or neither (no account in no team)
                if signup is not None:
                    user = signup.save()
                membership = services.invitation_accept(token=token, user=user)
        except ValidationError as exc:
            error = " ".join(exc.messages)
        else:
            if signup is not None:
                login(request, user, backend="django.contrib.auth.backends.ModelBackend")
            request.session[SESSION_KEY] = membership.team_id
            messages.success(request, f"Welcome to {invitation.team}.")
            return redirect("dashboard")
    return render(request, "teams/invitation.html", {"invitation": invitation, "signup": signup, "error": error})


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
        membership = services.membership_set_role(membership=membership, role=request.POST.get("role", ""), actor=request.user)
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
        try:
            services.membership_remove(membership=membership, actor=request.user)
        except ValidationError as exc:  # another admin stepped down meanwhile
            error = " ".join(exc.messages)
        else:
            messages.success(request, f"{membership.user.username} is no longer in {request.team}.")
            return redirect("dashboard" if membership.user_id == request.user.pk else "team_members")
    return render(request, "teams/member_remove.html", {"membership": membership, "error": error})


# == audit trail ==========================================================================================

AUDIT_PER_PAGE = 50


@require_GET
def team_audit(request: TeamRequest) -> HttpResponse:
    """Who did what in the team, newest first, filtered by action, actor and kind of object (team admins)."""
    if not is_team_admin(request):
        raise PermissionDenied("Only the team's admins read its audit trail.")
    form = AuditFilterForm(request.GET, **audit.audit_filter_choices(team=request.team))
    filters = form.cleaned_data if form.is_valid() else {}
    events = audit.audit_search(team=request.team, **filters).select_related("actor")
    page = Paginator(events, AUDIT_PER_PAGE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    return render(request, "teams/audit.html", {"form": form, "page": page, "query": query.urlencode(),
                                               "filtered": any(filters.values())},
                  status=200 if form.is_valid() else 400)


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
    response = render(request, "teams/tokens.html", context)
    response["Cache-Control"] = "no-store"
    return response


@require_POST
def api_token_revoke(request: TeamRequest, pk: int) -> HttpResponse:
    token = get_object_or_404(ApiToken, pk=pk, user=request.user)
    services.api_token_revoke(token=token, actor=request.user)
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


class PasswordResetView(auth_views.PasswordResetView):
    """Django's reset page, with two differences: the emailed link is built from TROUPE_SITE_URL
    (Django's uses the request's Host, which a client chooses: ALLOWED_HOSTS checks the host, not
    the port), and requests are limited per client address and per email address
    (`services.password_reset_throttle`): a client past its limit is refused (429); an address past
    its limit gets no more emails, but its owner is not refused: the page says the links already
    sent to it still work."""

    def form_valid(self, form: PasswordResetForm) -> HttpResponse:
        decision = services.password_reset_throttle(client=self.request.META.get("REMOTE_ADDR", ""), email=form.cleaned_data["email"])
        minutes = settings.TROUPE_PASSWORD_RESET_WINDOW_MINUTES
        if decision == services.RESET_CLIENT_OVER:
            form.add_error(None, f"Too many password-reset requests from your address: try again in {minutes} minutes, or ask a team admin.")
            return self.render_to_response(self.get_context_data(form=form), status=429)
        if decision == services.RESET_ADDRESS_OVER:
            messages.info(self.request, f"If an account has that address, {settings.TROUPE_PASSWORD_RESET_LIMIT} reset links were sent to "
                          f"it in the last {minutes} minutes and no new one was sent: the newest email's link works.")
            return HttpResponseRedirect(self.get_success_url())
        scheme, _, rest = settings.TROUPE_SITE_URL.partition("://")
        form.save(
            domain_override=rest, use_https=scheme == "https", token_generator=self.token_generator,
            from_email=self.from_email, email_template_name=self.email_template_name,
            subject_template_name=self.subject_template_name, request=self.request,
            html_email_template_name=self.html_email_template_name, extra_email_context=self.extra_email_context,
        )
        return HttpResponseRedirect(self.get_success_url())


class LogoutView(auth_views.LogoutView):
    """Django's logout, which also closes the user's open websockets (a logged-out session no
    longer receives a run's metrics, logs and rollouts)."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        user_id = request.user.pk if request.user.is_authenticated else None
        response = super().post(request, *args, **kwargs)
        if user_id is not None:
            sockets.user_sockets_close(user_id=user_id, code=sockets.GONE, reason="logged out")
        return response


class PasswordChangeView(auth_views.PasswordChangeView):
    """Django's password change; the user's open websockets reconnect, so those of the sessions
    the change ended are refused (this one stays logged in)."""

    form_class = PasswordChangeForm  # what the password's validators say goes under the password

    def form_valid(self, form: Any) -> HttpResponse:
        response = super().form_valid(form)
        sockets.user_sockets_close(user_id=form.user.pk, code=sockets.RECONNECT, reason="password changed")
        return response


class PasswordResetConfirmView(auth_views.PasswordResetConfirmView):
    """Django's "choose a new password" page; as for a change, the user's sockets reconnect."""

    form_class = SetPasswordForm

    def form_valid(self, form: Any) -> HttpResponse:
        response = super().form_valid(form)
        sockets.user_sockets_close(user_id=form.user.pk, code=sockets.RECONNECT, reason="password reset")
        return response

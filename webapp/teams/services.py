"""A team's people: personal API tokens, members and their roles, invitations, and the throttle on
password-reset mail.

A token is `trp_` + 43 URL-safe characters (256 random bits), created and revoked by its user in
the UI, for one team. The database keeps its SHA-256 digest and its first characters (to recognise
it in the list); the token itself is shown once. A request authenticates when the digest matches a
token that is not revoked and its user is still an active member of the token's team. A team keeps
at least one admin (`membership_set_role`, `membership_remove`); an invitation link works once,
until it expires or is revoked.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone

from training.config import ConfigError
from webapp.core import sockets, trust
from webapp.models import ApiToken, Invitation, Membership, Team
from webapp.teams.audit import Verb, audit_record

PREFIX = "trp_"


MAX_ACTIVE = 20


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def api_token_create(*, user: User, team: Team, name: str) -> tuple[ApiToken, str]:
    """(the stored token, the token text to show once)."""
    name = name.strip()
    if not name:
        raise ValidationError({"name": "Name the token after where it is used (\"laptop notebook\")."})
    try:
        trust.check_name(name)
    except ConfigError as exc:
        raise ValidationError({"name": exc.message}) from None
    if not Membership.objects.filter(user=user, team=team).exists():
        raise ValidationError("You are not a member of this team.")
    if ApiToken.objects.filter(user=user, revoked=None).count() >= MAX_ACTIVE:
        raise ValidationError(f"You have {MAX_ACTIVE} active tokens; revoke one first.")
    text = PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        token = ApiToken.objects.create(user=user, team=team, name=name[:100], prefix=text[: len(PREFIX) + 6], digest=_digest(text))
        audit_record(team=team, actor=user, verb=Verb.CREATE, obj=token, prefix=token.prefix)
    return token, text


def api_token_revoke(*, token: ApiToken, actor: User | None = None) -> ApiToken:
    """`actor`: who revoked it (its owner on the tokens page, staff in the admin)."""
    if token.revoked is None:
        with transaction.atomic():
            token.revoked = timezone.now()
            token.save(update_fields=["revoked"])
            audit_record(team=token.team_id, actor=actor, verb=Verb.REVOKE, obj=token, owner=token.user.get_username())
    return token


def api_token_authenticate(*, text: str, touch: bool = True) -> ApiToken | None:
    """The live token for `text`, or None. Touches `last_used` at most once a minute (unless
    `touch` is False: a check that is not a use, such as the body-size limit's)."""
    if not text.startswith(PREFIX) or len(text) > 200:
        return None
    token = ApiToken.objects.select_related("user", "team").filter(digest=_digest(text), revoked=None).first()
    if token is None or not token.user.is_active:
        return None
    if not Membership.objects.filter(user_id=token.user_id, team_id=token.team_id).exists():
        return None
    now = timezone.now()
    if touch and (token.last_used is None or (now - token.last_used).total_seconds() > 60):
        ApiToken.objects.filter(pk=token.pk).update(last_used=now)
    return token


# == members ===========================================================================================


def _admins_left(membership: Membership, *, after_losing: bool) -> int:
    admins = Membership.objects.filter(team_id=membership.team_id, role=Membership.Role.ADMIN)
    return admins.exclude(pk=membership.pk).count() if after_losing else admins.count()


def membership_set_role(*, membership: Membership, role: str, actor: User | None = None) -> Membership:
    """Make a member an admin of their team, or an admin a member; a team always keeps an admin."""
    if role not in Membership.Role.values:
        raise ValidationError({"role": f"Unknown role {role!r}; a member is an admin or a member."})
    with transaction.atomic():
        membership = _locked(membership)
        if membership.role == Membership.Role.ADMIN and role != Membership.Role.ADMIN and not _admins_left(membership, after_losing=True):
            raise ValidationError({"role": f"{membership.user.username} is the team's only admin: make someone else an admin first."})
        if role == membership.role:
            return membership
        Membership.objects.filter(pk=membership.pk).update(role=role)
        audit_record(team=membership.team_id, actor=actor, verb=Verb.ROLE, obj=membership, before=membership.role, after=role)
        sockets.user_sockets_close(user_id=membership.user_id, code=sockets.RECONNECT, reason="role changed")
    membership.role = role
    return membership


def _locked(membership: Membership) -> Membership:
    """The membership as stored now, with its team's row locked until the transaction ends: two
    admins demoting or removing each other at once take turns, so the second sees the first's
    change and a team never ends without an admin (PostgreSQL; SQLite writes one at a time)."""
    Team.objects.select_for_update().filter(pk=membership.team_id).first()
    return Membership.objects.select_related("user").get(pk=membership.pk)


def membership_remove_blocker(*, membership: Membership) -> str | None:
    """Why the member cannot be removed now, or None."""
    if membership.role == Membership.Role.ADMIN and not _admins_left(membership, after_losing=True):
        return f"{membership.user.username} is the team's only admin: make someone else an admin first."
    return None


def membership_remove(*, membership: Membership, actor: User | None = None) -> None:
    """Take a user out of the team (their account, runs and tokens of other teams stay); a team
    always keeps an admin. Their API tokens for this team are revoked: they stop working at once
    and stay dead if the user is invited back (who joins again makes new ones), and their open
    websockets are closed. `actor` is who removed them (themselves: they left)."""
    with transaction.atomic():
        membership = _locked(membership)
        if blocker := membership_remove_blocker(membership=membership):
            raise ValidationError(blocker)
        revoked = ApiToken.objects.filter(user_id=membership.user_id, team_id=membership.team_id, revoked=None).update(
            revoked=timezone.now())
        audit_record(team=membership.team_id, actor=actor, verb=Verb.REMOVE, obj=membership, role=membership.role,
                     left=actor is not None and actor.pk == membership.user_id,
                     **({"tokens_revoked": revoked} if revoked else {}))
        membership.delete()
        # their pages reconnect: sockets of this team's runs are then refused, others carry on
        sockets.user_sockets_close(user_id=membership.user_id, code=sockets.RECONNECT, reason="removed from a team")


# == password resets ==================================================================================


def site_link(path: str) -> str:
    """An absolute link for an email: the configured site address (`TROUPE_SITE_URL`) and `path`,
    never the Host a request named."""
    return settings.TROUPE_SITE_URL + path


RESET_SEND, RESET_CLIENT_OVER, RESET_ADDRESS_OVER = "send", "client over its limit", "address over its limit"


def password_reset_throttle(*, client: str, email: str) -> str:
    """Count one password-reset request from `client` (an IP address) for `email`, and say what to
    do with it. Each client and each address gets `TROUPE_PASSWORD_RESET_LIMIT` requests a
    `TROUPE_PASSWORD_RESET_WINDOW_MINUTES` window, whether or not the address has an account (so
    the answer reveals nothing about it):

    - RESET_SEND: send the email;
    - RESET_CLIENT_OVER: this client has made too many requests: refuse it (and count nothing
      against the address: a client over its limit uses up no one else's);
    - RESET_ADDRESS_OVER: the address has had its emails for this window: send no more, but do not
      refuse. Every link sent in the window still works (`PASSWORD_RESET_TIMEOUT` is at least the
      window), so requests anyone makes for someone's address cannot keep its owner from resetting
      their password: the newest email they have works.

    Counted in Django's cache: one web process shares its counts, several need a shared cache."""
    from django.core.cache import cache

    window = settings.TROUPE_PASSWORD_RESET_WINDOW_MINUTES * 60
    address = hashlib.sha256(email.strip().lower().encode("utf-8", "surrogatepass")).hexdigest()

    def count(key: str) -> int:
        cache.add(key, 0, timeout=window)
        try:
            return int(cache.incr(key))
        except ValueError:  # expired between add and incr: a fresh window
            cache.add(key, 1, timeout=window)
            return 1

    if count(f"troupe:reset:client:{client}") > settings.TROUPE_PASSWORD_RESET_LIMIT:
        return RESET_CLIENT_OVER
    if count(f"troupe:reset:email:{address}") > settings.TROUPE_PASSWORD_RESET_LIMIT:
        return RESET_ADDRESS_OVER
    return RESET_SEND


# == invitations =======================================================================================

MAX_PENDING_INVITATIONS = 50


def invitation_create(*, team: Team, by: User, role: str, email: str = "", link_for: Callable[[str], str]) -> tuple[Invitation, str]:
    """A single-use link that adds one person to `team` as `role`: (the invitation, the link to
    show once). `link_for(token)` makes the absolute link; with an `email` it is also sent there."""
    if role not in Membership.Role.values:
        raise ValidationError({"role": f"Unknown role {role!r}; a member is an admin or a member."})
    if Invitation.objects.filter(team=team, accepted=None, revoked=None, expires__gt=timezone.now()).count() >= MAX_PENDING_INVITATIONS:
        raise ValidationError(f"{team} has {MAX_PENDING_INVITATIONS} open invitations; revoke some first.")
    token = secrets.token_urlsafe(32)
    with transaction.atomic():
        invitation = Invitation.objects.create(
            team=team, created_by=by, role=role, email=email.strip(), digest=_digest(token),
            expires=timezone.now() + timedelta(days=settings.TROUPE_INVITATION_DAYS),
        )
        audit_record(team=team, actor=by, verb=Verb.INVITE, obj=invitation, role=role,
                     expires=f"{invitation.expires:%Y-%m-%d %H:%M} UTC")
    link = link_for(token)
    if invitation.email:
        send_mail(
            f"Join {team} on Troupe",
            f"{by.get_username()} invites you to the team {team} on Troupe, as {invitation.get_role_display().lower()}.\n\n"
            f"Join here (the link works once, until {invitation.expires:%Y-%m-%d %H:%M} UTC):\n\n{link}\n",
            None, [invitation.email],
        )
    return invitation, link


def invitation_find(*, token: str) -> Invitation | None:
    """The pending invitation behind a link's token, or None (unknown, used, revoked or expired)."""
    if not token or len(token) > 100:
        return None
    invitation = Invitation.objects.select_related("team").filter(digest=_digest(token)).first()
    return invitation if invitation is not None and invitation.is_pending else None


def invitation_accept(*, token: str, user: User) -> Membership:
    """Add `user` to the invitation's team with its role, once: a second use, or a link that
    expired or was revoked meanwhile, is refused."""
    with transaction.atomic():
        invitation = Invitation.objects.select_for_update().filter(digest=_digest(token)).first()
        if invitation is None or not invitation.is_pending:
            raise ValidationError("This invitation no longer works: it was used, revoked or has expired.")
        if Membership.objects.filter(team_id=invitation.team_id, user=user).exists():
            raise ValidationError(f"You are already in {invitation.team}.")
        membership = Membership.objects.create(team_id=invitation.team_id, user=user, role=invitation.role)
        Invitation.objects.filter(pk=invitation.pk).update(accepted=timezone.now(), accepted_by=user)
        audit_record(team=invitation.team_id, actor=user, verb=Verb.JOIN, obj=membership, role=invitation.role,
                     invitation=invitation.pk)
    return membership


def invitation_revoke(*, invitation: Invitation, actor: User | None = None) -> Invitation:
    if invitation.revoked is None and invitation.accepted is None:
        with transaction.atomic():
            invitation.revoked = timezone.now()
            invitation.save(update_fields=["revoked"])
            audit_record(team=invitation.team_id, actor=actor, verb=Verb.REVOKE, obj=invitation)
    return invitation

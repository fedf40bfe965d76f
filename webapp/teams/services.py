"""Personal API tokens: created and revoked by their user in the UI, one team each.

A token is `trp_` + 43 URL-safe characters (256 random bits). The database keeps its SHA-256
digest and its first characters (to recognise it in the list); the token itself is shown once.
A request authenticates when the digest matches a token that is not revoked and its user is still
an active member of the token's team.
"""

from __future__ import annotations

import hashlib
import secrets

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.utils import timezone

from webapp.models import ApiToken, Membership, Team

PREFIX = "trp_"


MAX_ACTIVE = 20


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def api_token_create(*, user: User, team: Team, name: str) -> tuple[ApiToken, str]:
    """(the stored token, the token text to show once)."""
    name = name.strip()
    if not name:
        raise ValidationError({"name": "Name the token after where it is used (\"laptop notebook\")."})
    if not Membership.objects.filter(user=user, team=team).exists():
        raise ValidationError("You are not a member of this team.")
    if ApiToken.objects.filter(user=user, revoked=None).count() >= MAX_ACTIVE:
        raise ValidationError(f"You have {MAX_ACTIVE} active tokens; revoke one first.")
    text = PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(user=user, team=team, name=name[:100], prefix=text[: len(PREFIX) + 6], digest=_digest(text))
    return token, text


def api_token_revoke(*, token: ApiToken) -> ApiToken:
    if token.revoked is None:
        token.revoked = timezone.now()
        token.save(update_fields=["revoked"])
    return token


def api_token_authenticate(*, text: str) -> ApiToken | None:
    """The live token for `text`, or None. Touches `last_used` at most once a minute."""
    if not text.startswith(PREFIX) or len(text) > 200:
        return None
    token = ApiToken.objects.select_related("user", "team").filter(digest=_digest(text), revoked=None).first()
    if token is None or not token.user.is_active:
        return None
    if not Membership.objects.filter(user_id=token.user_id, team_id=token.team_id).exists():
        return None
    now = timezone.now()
    if token.last_used is None or (now - token.last_used).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used=now)
    return token

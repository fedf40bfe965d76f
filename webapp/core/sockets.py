"""Open websockets hear when their user's rights change.

A socket is authorized when it connects. Every socket also joins its user's group (`user_group`),
and the services that change what a user may see call `user_sockets_close` after their change
commits: removal from a team and logout close the user's sockets for good (`GONE`); a role change
and a password change close them with `RECONNECT`, so each page connects again and is authorized
afresh (a session the password change ended is then refused). What no service sees (the admin's
password form, `changepassword`, a session that expires) is caught by the consumers' own re-check
of the session and membership (`socket_allowed`), at most every few seconds, before they send.
"""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

GONE = 4401
"""Close code: this user may no longer watch (removed, logged out). Pages do not reconnect."""

RECONNECT = 4012
"""Close code: connect again and be authorized afresh (the run page reconnects on any code but
GONE). Not 1012 ("service restart"): an application may close only with 1000 or 3000-4999, and
the websocket library refuses any other code with an exception (a traceback per socket)."""


MAX_MESSAGE_BYTES = 1 << 20
"""The largest websocket message Daphne passes, in either direction: Autobahn applies
`--websocket-max-message-size` to what the server sends as well as to what it receives, so it must
hold the largest message Troupe sends (a backlog's metrics part, `webapp.runs.series.split_metrics`,
kept well under 1 MiB). A 4 KiB limit, tried first, dropped every run page's larger backlog
messages (the per-agent charts never drew). A page sends only pings, and the consumer reads at most
1,024 characters of one; a message over the limit closes the socket (1009) before it is held."""

DAPHNE_ARGS = ("--websocket-max-message-size", str(MAX_MESSAGE_BYTES), "--websocket-max-frame-size", str(MAX_MESSAGE_BYTES))
"""The arguments every start of Daphne passes (`manage.py troupe`, docker/Dockerfile,
docker/compose.yaml, the tests' stack); a test checks each of them."""


def close_code(code: object) -> int:
    """`code` if an application may close a websocket with it (1000, or 3000-4999 per RFC 6455 and
    IANA's registry), else RECONNECT: a group message from an older process, or a typo, must not
    make the close itself fail."""
    return code if isinstance(code, int) and (code == 1000 or 3000 <= code <= 4999) else RECONNECT


log = logging.getLogger(__name__)


def user_group(user_id: int) -> str:
    return f"user-{user_id}"


def user_sockets_close(*, user_id: int, code: int, reason: str) -> None:
    """Close every open socket of this user once the current transaction commits (at once outside
    one). Never raises: a channel layer that is down has no sockets to close, and each consumer
    re-checks by itself."""

    def send() -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        try:
            async_to_sync(layer.group_send)(user_group(user_id), {"type": "access.changed", "code": code, "reason": reason})
        except Exception as exc:  # noqa: BLE001 (the change itself is committed; this is a courtesy on top)
            log.warning("could not tell user %s's sockets (%s): %s", user_id, reason, exc)

    transaction.on_commit(send)


def socket_allowed(*, session_key: str | None, user_id: int, auth_hash: str | None) -> Any:
    """The user a socket was opened for, if its session still stands: the session exists and
    names the user, the user is active, and the password has not changed since (Django's session
    auth hash). None otherwise. Sync: call it through `database_sync_to_async`."""
    from importlib import import_module

    from django.conf import settings
    from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY, get_user_model
    from django.utils.crypto import constant_time_compare

    if not session_key:
        return None
    data = import_module(settings.SESSION_ENGINE).SessionStore(session_key=session_key).load()
    if str(data.get(SESSION_KEY)) != str(user_id):
        return None
    user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
    if user is None:
        return None
    stored = data.get(HASH_SESSION_KEY) or auth_hash or ""
    if not constant_time_compare(stored, user.get_session_auth_hash()):
        return None
    return user

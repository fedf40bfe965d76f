"""Websocket consumers: thin interfaces over `webapp.runs.streaming`.

`RunConsumer` at `/ws/runs/<id>/` streams one run to its page. It refuses (closes before the
handshake completes, so nothing is sent) an anonymous user or one outside the run's team. It joins
the run's group *before* reading the backlog, so a step committed while the backlog is read
arrives as a group message afterwards and is dropped as a duplicate by the cursor, never lost.
Group messages are handled one at a time, in order, after the backlog has been sent.

Authorization holds for the socket's whole life, not only at connect (`webapp.core.sockets`): it
joins its user's group, and a removal from the team, a logout, a role or password change closes
it; before it sends anything new it checks again, at most every RECHECK_SECONDS, that the session
still stands and the user is still in the run's team.
"""

from __future__ import annotations

import json
import time
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.contrib.auth import HASH_SESSION_KEY

from webapp.core import sockets
from webapp.runs import streaming
from webapp.runs.publish import run_group

REFUSED = 4403
"""Close code for a refused socket (the browser sees 1006: the handshake never completed)."""

MAX_PING_CHARS = 1024
"""A page's frames are pings (`{"t": "ping"}`); a longer frame is not read."""


class RunConsumer(AsyncJsonWebsocketConsumer):
    cursor: streaming.StreamCursor | None = None
    user_id: int | None = None
    RECHECK_SECONDS = 5.0
    """How stale the socket's authorization may grow before a send checks it again."""
    _checked = 0.0

    async def connect(self) -> None:
        run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        user = self.scope.get("user")
        if not await streaming.run_viewable_async(user=user, run_id=run_id):
            await self.close(code=REFUSED)
            return
        self.user_id = user.pk
        session = self.scope.get("session")
        self.session_key = getattr(session, "session_key", None)
        self.auth_hash = session.get(HASH_SESSION_KEY) if session is not None else None
        self.cursor = streaming.StreamCursor.from_query_string(run_id, self.scope.get("query_string", b""))
        await self.channel_layer.group_add(sockets.user_group(user.pk), self.channel_name)
        await self.channel_layer.group_add(run_group(run_id), self.channel_name)
        self._checked = time.monotonic()
        await self.accept()
        async for message in streaming.stream_open(cursor=self.cursor):
            await self.send_json(message)

    async def still_allowed(self) -> bool:
        """Whether the socket may go on sending: re-checked when the last check is older than
        RECHECK_SECONDS; a socket that may not is closed (GONE)."""
        if self.cursor is None or self.user_id is None:
            return False
        if time.monotonic() - self._checked < self.RECHECK_SECONDS:
            return True
        user = await database_sync_to_async(sockets.socket_allowed)(
            session_key=self.session_key, user_id=self.user_id, auth_hash=self.auth_hash)
        if user is None or not await streaming.run_viewable_async(user=user, run_id=self.cursor.run_id):
            await self.access_changed({"code": sockets.GONE, "reason": "no longer allowed"})
            return False
        self._checked = time.monotonic()
        return True

    async def access_changed(self, message: dict[str, Any]) -> None:
        """Its user was removed, logged out, or had their role or password changed (`webapp.core.sockets`)."""
        if self.cursor is not None:
            await self.channel_layer.group_discard(run_group(self.cursor.run_id), self.channel_name)
        self.cursor = None  # nothing more is sent, whatever is still queued
        await self.close(code=sockets.close_code(message.get("code", sockets.GONE)))

    async def run_event(self, message: dict[str, Any]) -> None:
        """A group message from the worker's sink (`webapp.runs.publish`)."""
        if not await self.still_allowed():
            return
        assert self.cursor is not None
        for out in await streaming.stream_event(cursor=self.cursor, event=message["event"], payload=message["payload"]):
            await self.send_json(out)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        """A frame from the page: it only ever sends a small JSON ping. Anything else — a binary
        frame, an empty one, text that is not JSON, JSON nested past the parser's limits — is
        ignored, not an exception (a traceback in the log for each frame a client sends)."""
        if not text_data or len(text_data) > MAX_PING_CHARS:
            return
        try:
            content = json.loads(text_data)
        except (ValueError, RecursionError):
            return
        await self.receive_json(content, **kwargs)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """The page states its cursor in the URL when it connects; after that it only pings (every
        25 s), to find out whether a quiet connection is still alive."""
        if not (isinstance(content, dict) and content.get("t") == "ping") or not await self.still_allowed():
            return
        assert self.cursor is not None
        # Join the group again (a Redis that restarted empty forgot it; group membership also
        # expires after a day) and catch up from the database, so a quiet socket cannot go stale.
        await self.channel_layer.group_add(run_group(self.cursor.run_id), self.channel_name)
        for out in await streaming.stream_event(cursor=self.cursor, event="heartbeat", payload={}):
            await self.send_json(out)
        await self.send_json({"t": "pong"})

    async def disconnect(self, code: int) -> None:
        if self.cursor is not None:
            await self.channel_layer.group_discard(run_group(self.cursor.run_id), self.channel_name)
        if self.user_id is not None:
            await self.channel_layer.group_discard(sockets.user_group(self.user_id), self.channel_name)

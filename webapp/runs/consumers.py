"""Websocket consumers: thin interfaces over `webapp.runs.streaming`.

`RunConsumer` at `/ws/runs/<id>/` streams one run to its page. It refuses (closes before the
handshake completes, so nothing is sent) an anonymous user or one outside the run's team. It joins
the run's group *before* reading the backlog, so a step committed while the backlog is read
arrives as a group message afterwards and is dropped as a duplicate by the cursor, never lost.
Group messages are handled one at a time, in order, after the backlog has been sent.
"""

from __future__ import annotations

from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from webapp.runs import streaming

REFUSED = 4403


"""Close code for a refused socket (the browser sees 1006: the handshake never completed)."""


class RunConsumer(AsyncJsonWebsocketConsumer):
    cursor: streaming.StreamCursor | None = None

    async def connect(self) -> None:
        run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        if not await streaming.run_viewable_async(user=self.scope.get("user"), run_id=run_id):
            await self.close(code=REFUSED)
            return
        self.cursor = streaming.StreamCursor.from_query_string(run_id, self.scope.get("query_string", b""))
        await self.channel_layer.group_add(streaming.run_group(run_id), self.channel_name)
        await self.accept()
        async for message in streaming.stream_open(cursor=self.cursor):
            await self.send_json(message)

    async def run_event(self, message: dict[str, Any]) -> None:
        """A group message from the worker's sink (`streaming.publish`)."""
        if self.cursor is None:
            return
        for out in await streaming.stream_event(cursor=self.cursor, event=message["event"], payload=message["payload"]):
            await self.send_json(out)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """The page states its cursor in the URL when it connects; after that it only pings (every
        25 s), to find out whether a quiet connection is still alive."""
        if not (isinstance(content, dict) and content.get("t") == "ping") or self.cursor is None:
            return
        # Join the group again (a Redis that restarted empty forgot it; group membership also
        # expires after a day) and catch up from the database, so a quiet socket cannot go stale.
        await self.channel_layer.group_add(streaming.run_group(self.cursor.run_id), self.channel_name)
        for out in await streaming.stream_event(cursor=self.cursor, event="heartbeat", payload={}):
            await self.send_json(out)
        await self.send_json({"t": "pong"})

    async def disconnect(self, code: int) -> None:
        if self.cursor is not None:
            await self.channel_layer.group_discard(streaming.run_group(self.cursor.run_id), self.channel_name)

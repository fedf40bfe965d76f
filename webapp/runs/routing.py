"""Websocket URLs, served by webapp.asgi behind AuthMiddlewareStack. Consumers check that the
connecting user belongs to the object's team before accepting.
"""

from __future__ import annotations

from django.urls import URLPattern, path

from webapp.runs.consumers import RunConsumer

websocket_urlpatterns: list[URLPattern] = [
    path("ws/runs/<int:run_id>/", RunConsumer.as_asgi()),
]

"""Websocket URLs, served by webapp.asgi behind AuthMiddlewareStack.

Empty for now: live run streaming (metrics, rollouts) adds its consumer here, e.g.
`path("ws/runs/<int:run_id>/", RunConsumer.as_asgi())`. Consumers must check that the
connecting user belongs to the run's team before accepting.
"""

from django.urls import URLPattern

websocket_urlpatterns: list[URLPattern] = []

"""Websocket URLs, served by webapp.asgi behind AuthMiddlewareStack. Consumers check that the
connecting user belongs to the object's team before accepting."""

from django.urls import URLPattern, path

from webapp.consumers import RunConsumer

websocket_urlpatterns: list[URLPattern] = [
    path("ws/runs/<int:run_id>/", RunConsumer.as_asgi()),
]

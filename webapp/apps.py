"""The webapp's AppConfig: at process start (web, worker, management commands) it registers the
plugins the operator listed, so no request ever imports user-named code (see `agents.plugins`)."""

from __future__ import annotations

from django.apps import AppConfig


class WebappConfig(AppConfig):
    name = "webapp"

    def ready(self) -> None:
        from agents import plugins

        plugins.register_from_environ()

"""Every module's router mounted on the API (`webapp.api.app.api`) under its path: the one list of
them. `webapp/urls.py` serves `urlpatterns()`, `openapi.py` the document they make."""

from __future__ import annotations

from webapp.api import catalog, experiments, jobs, runs
from webapp.api.app import api, document_paths, urlpatterns

api.add_router("/", runs.router)
api.add_router("/", catalog.router)
api.add_router("/", jobs.router)
api.add_router("/experiments/", experiments.router)

__all__ = ["api", "document_paths", "urlpatterns"]

"""The API's error envelope, shared by its routes (`webapp/api/app.py`) and the site's 404 and 500
handlers: `{"error": "<sentence>", "field": "<first field>" | null, "fields": {field: [messages]}}`
with the status that says why: 400 bad input, 401 no valid token, 404 not found (or another
team's), 405 wrong method, 409 the object is in use, 413 too large, 415 wrong content type.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, JsonResponse


class ApiError(Exception):
    """Raised anywhere below a route: answered as a JSON error with this status."""

    def __init__(self, status: int, message: str, *, fields: Mapping[str, list[str]] | None = None):
        super().__init__(message)
        self.status, self.message, self.fields = status, message, dict(fields or {})


def error(status: int, message: str, *, field: str | None = None, fields: Mapping[str, list[str]] | None = None) -> JsonResponse:
    fields = dict(fields or ({field: [message]} if field else {}))
    response = JsonResponse({"error": message, "field": field or next(iter(fields), None), "fields": fields}, status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="troupe"'
    return response


def invalid(exc: ValidationError) -> JsonResponse:
    """A service's or form's ValidationError as a 400 naming every field (`__all__`: the whole object)."""
    if hasattr(exc, "error_dict"):
        fields = {("__all__" if k in ("__all__", None) else k): list(v) for k, v in exc.message_dict.items()}
    else:
        fields = {"__all__": list(exc.messages)}
    summary = "; ".join(f"{k}: {' '.join(v)}" if k != "__all__" else " ".join(v) for k, v in fields.items())
    return error(400, summary, fields=fields)


def invalid_fields(problems: Mapping[str, list[str]]) -> ApiError:
    return ApiError(400, "; ".join(f"{k}: {' '.join(v)}" for k, v in problems.items()), fields=problems)


def absolute(request: HttpRequest, path: str) -> str:
    return request.build_absolute_uri(path)


def path_template(route: str) -> str:
    """A Django route as the document's path: `api/v1/runs/<int:id>/` is `/api/v1/runs/{id}/`."""
    return "/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route)


PER_PAGE_MAX = 100


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """The site's 404 (`handler404`): JSON under /api/, the 404 page elsewhere."""
    if request.path.startswith("/api/"):
        return error(404, "No such endpoint or object: see /api/v1/openapi.json.")
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)  # type: ignore[arg-type]


def server_error(request: HttpRequest) -> HttpResponse:
    """The site's 500 (`handler500`): JSON under /api/ (a script reads `error`), the error page elsewhere."""
    if request.path.startswith("/api/"):
        return error(500, "Troupe hit an error while answering; it is in the server's log.")
    from django.views.defaults import server_error as page

    return page(request)

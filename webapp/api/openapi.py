"""The OpenAPI 3.1 document of the JSON API, served at /api/v1/openapi.json (no token needed: it
describes the endpoints, it holds no data). django-ninja makes it from the routes' schemas (the
same ones that validate the bodies and serialize the answers); this adds the server it is read from.

`tests/webapp/api/test_openapi.py` runs schemathesis against it: every generated request must get
an answer the document allows, in status, content type and shape, and never a 5xx.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET

from webapp.api import routes


def document_for(server: str) -> dict[str, Any]:
    document = dict(routes.document_paths())
    return {**document, "servers": [{"url": server}], "security": [{"BearerToken": []}]}


@csrf_exempt  # no cookie authenticates the API: a POST here is a 405, not a CSRF refusal
@login_not_required
@require_GET
def document(request: HttpRequest) -> JsonResponse:
    return JsonResponse(document_for(request.build_absolute_uri("/").rstrip("/")), json_dumps_params={"indent": 1})

"""What every endpoint of the JSON API shares: bearer-token authentication, allowed methods, JSON
bodies and query parameters checked by type, and errors as JSON that name what is wrong.

An error is `{"error": "<sentence>", "field": "<first field>" | null, "fields": {field: [messages]}}`
with the status that says why: 400 bad input, 401 no valid token, 404 not found (or another
team's), 405 wrong method, 409 the object is in use, 413 too large, 415 wrong content type.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_not_required
from django.core.exceptions import ObjectDoesNotExist, RequestDataTooBig, SuspiciousOperation, ValidationError
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParserError
from django.views.decorators.csrf import csrf_exempt

from training.config import ConfigError
from webapp.artifacts import files as artifacts
from webapp.core import trust
from webapp.core.values import ID_MAX
from webapp.models import ApiToken, Team
from webapp.teams import services as tokens


class ApiRequest(HttpRequest):
    api_token: ApiToken
    team: Team


class ApiError(Exception):
    """Raised anywhere below an endpoint: answered as a JSON error with this status."""

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


def endpoint(*methods: str) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """Bearer-token authentication, allowed methods, JSON errors (404 for anything not the team's)."""

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            header = request.headers.get("Authorization", "")
            scheme, _, text = header.partition(" ")
            token = tokens.api_token_authenticate(text=text.strip()) if scheme.lower() == "bearer" else None
            if token is None:
                return error(401, "Send a valid API token: `Authorization: Bearer <token>` (create one on the API tokens page).")
            if request.method not in methods:
                response = error(405, f"Use {' or '.join(methods)}.")
                response["Allow"] = ", ".join(methods)
                return response
            request.user, request.team, request.api_token = token.user, token.team, token  # type: ignore[attr-defined]
            if any(isinstance(v, int) and not 0 <= v <= ID_MAX for v in kwargs.values()):
                return error(404, "Not found.")
            unknown = sorted(set(request.GET) - _query_names(request))
            if unknown:
                return error(400, f"Unknown query parameter {unknown[0]!r}; see /api/v1/openapi.json.",
                             fields={name: ["Unknown query parameter."] for name in unknown})
            try:
                return view(request, *args, **kwargs)
            except ApiError as exc:
                return error(exc.status, exc.message, fields=exc.fields)
            except (Http404, ObjectDoesNotExist):
                return error(404, "Not found.")
            except artifacts.ArtifactMissing as exc:
                return error(404, str(exc))
            except ValidationError as exc:
                return invalid(exc)
            except ConfigError as exc:
                return error(400, str(exc), field=exc.field)
            except RequestDataTooBig:
                return error(413, "The request body is too large.")
            except (MultiPartParserError, SuspiciousOperation) as exc:
                return error(400, f"The request could not be read: {exc}")

        view_ = csrf_exempt(login_not_required(wrapper))
        view_.api_methods = methods  # type: ignore[attr-defined]  # the OpenAPI test compares them with the document
        return view_

    return decorate


QUERY_NAMES: dict[tuple[str, str], frozenset[str]] = {}
"""(path template, method) -> the query parameters the OpenAPI document declares for it: the one
list of them, filled in by `webapp/api/openapi.py`, which the URLconf imports."""


def path_template(route: str) -> str:
    """A Django route as the document's path: `<int:pk>` is `{id}`, `<int:job_id>` is `{job}`."""
    names = {"pk": "id", "job_id": "job"}
    return "/" + re.sub(r"<(?:\w+:)?(\w+)>", lambda m: "{" + names.get(m[1], m[1]) + "}", route)


def _query_names(request: HttpRequest) -> frozenset[str]:
    match = request.resolver_match
    return QUERY_NAMES.get((path_template(match.route if match else ""), (request.method or "GET").lower()), frozenset())


def absolute(request: HttpRequest, path: str) -> str:
    return request.build_absolute_uri(path)


def query_int(request: HttpRequest, name: str, default: int | None, *, low: int | None = None, high: int | None = None) -> int | None:
    """An integer query parameter, or `default` when absent; anything else is a 400 naming it."""
    raw = request.GET.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, f"{name}: expected an integer, got {raw[:40]!r}", fields={name: ["Expected an integer."]}) from None
    if low is not None and value < low or high is not None and value > high:
        bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ApiError(400, f"{name}: {bounds}", fields={name: [f"Must be {bounds}."]})
    return value


# -- JSON bodies, checked against the same field list the OpenAPI document is made from --------------


@dataclass(frozen=True)
class Field:
    """One property of a JSON body: its JSON type, and whether a create needs it."""

    type: str | tuple[str, ...]  # string, integer, number, boolean, object, array; a tuple: any of them
    description: str
    required: bool = False
    nullable: bool = False
    max_length: int | None = None
    minimum: float | None = None
    maximum: float | None = None
    enum: tuple[str, ...] | None = None
    items: str | None = None  # the JSON type of an array's items
    item_minimum: int | None = None  # bounds of integer items (ids)
    item_maximum: int | None = None
    strict: bool = False  # bounds checked before anything else reads the value (ids: a database compares none larger)

    def schema(self) -> dict[str, Any]:
        kinds = list(self.type) if isinstance(self.type, tuple) else [self.type]
        kinds += ["null"] if self.nullable else []
        out: dict[str, Any] = {"type": kinds if len(kinds) > 1 else kinds[0], "description": self.description}
        for key, value in (("maxLength", self.max_length), ("minimum", self.minimum), ("maximum", self.maximum)):
            if value is not None:
                out[key] = value
        if self.enum:
            out["enum"] = list(self.enum) + ([None] if self.nullable else [])
        if self.items:
            out["items"] = {"type": self.items}
            for key, value in (("minimum", self.item_minimum), ("maximum", self.item_maximum)):
                if value is not None:
                    out["items"][key] = value
        return out


def _type_ok(value: Any, kind: str | tuple[str, ...]) -> bool:
    if isinstance(kind, tuple):
        return any(_type_ok(value, k) for k in kind)
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return not isinstance(value, bool) and (isinstance(value, int) or isinstance(value, float) and value.is_integer())
    if kind == "number":
        return not isinstance(value, bool) and isinstance(value, (int, float))
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    raise AssertionError(kind)


def json_body(request: HttpRequest, spec: Mapping[str, Field], *, partial: bool = False, bounds: bool = True) -> dict[str, Any]:
    """The request's JSON object, every property checked against `spec` (known, of its type, the
    required ones present unless `partial`, and within its bounds unless `bounds` is False), all
    problems in one 400."""
    body, problems = json_fields(request, spec, partial=partial, bounds=bounds)
    if problems:
        raise invalid_fields(problems)
    return body


def json_fields(request: HttpRequest, spec: Mapping[str, Field], *, partial: bool = False,
                bounds: bool = True) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The request's JSON object checked against `spec` as `json_body` does, but answered rather
    than raised: (the properties that passed, the problems by field). A caller that validates with
    a form gives it what passed and merges the rest (`bounds=False`: the form and `out_of_bounds`
    judge the ranges), so that every problem comes back at once. Not JSON, or not an object, is
    still an error at once: there are no fields to speak of."""
    if (request.content_type or "") != "application/json":
        raise ApiError(415, f"Send JSON (Content-Type: application/json), not {request.content_type or 'nothing'}.")
    body = trust.json_load(request.body, field="body")
    if not isinstance(body, dict):
        raise ApiError(400, "Send a JSON object.", fields={"body": ["Expected a JSON object."]})
    problems: dict[str, list[str]] = {}
    for key, value in body.items():
        field = spec.get(key)
        if field is None:
            problems[key] = [f"Unknown field; the fields are: {', '.join(spec)}."]
        elif value is None and field.nullable:
            continue
        elif not _type_ok(value, field.type):
            kinds = " or ".join(field.type) if isinstance(field.type, tuple) else field.type
            problems[key] = [f"Expected {'an' if kinds[0] in 'aeiou' else 'a'} {kinds}{' or null' if field.nullable else ''}."]
        elif field.type == "array" and field.items and not all(_type_ok(v, field.items) for v in value):
            problems[key] = [f"Expected a list of {field.items}s."]
        elif field.type == "array" and not all(_within(v, field.item_minimum, field.item_maximum) for v in value):
            problems[key] = [f"Every item between {field.item_minimum} and {field.item_maximum}."]
    passed = {k: v for k, v in body.items() if k not in problems}
    problems.update(out_of_bounds(passed if bounds else {k: v for k, v in passed.items() if spec[k].strict}, spec))
    if not partial:
        for key, field in spec.items():
            if field.required and key not in body:
                problems[key] = ["This field is required."]
    return {k: v for k, v in passed.items() if k not in problems}, problems


def _within(value: Any, low: float | None, high: float | None) -> bool:
    return (low is None or value >= low) and (high is None or value <= high)


def id_field(description: str, **extra: Any) -> Field:
    """An object id in a body: 1 to ID_MAX (a larger one names no row)."""
    return Field("integer", description, minimum=1, maximum=ID_MAX, strict=True, **extra)


def out_of_bounds(body: Mapping[str, Any], spec: Mapping[str, Field]) -> dict[str, list[str]]:
    """The properties of a type-checked body that lie outside their field's enum, length or range."""
    problems: dict[str, list[str]] = {}
    for key, value in body.items():
        field = spec[key]
        if value is None:
            continue
        if field.enum and value not in field.enum:
            problems[key] = [f"One of: {', '.join(field.enum)}."]
        elif field.max_length is not None and isinstance(value, str) and len(value) > field.max_length:
            problems[key] = [f"At most {field.max_length} characters."]
        elif field.minimum is not None and isinstance(value, (int, float)) and value < field.minimum:
            problems[key] = [f"At least {field.minimum:g}."]
        elif field.maximum is not None and isinstance(value, (int, float)) and value > field.maximum:
            problems[key] = [f"At most {field.maximum:g}."]
    return problems


def invalid_fields(problems: Mapping[str, list[str]]) -> ApiError:
    return ApiError(400, "; ".join(f"{k}: {' '.join(v)}" for k, v in problems.items()), fields=problems)


PER_PAGE_MAX = 100


def stamp(value: Any) -> str | None:
    return value.isoformat() if value else None


def page_of(request: HttpRequest, rows: QuerySet[Any], serialize: Callable[[Any, Any], dict[str, Any]]) -> JsonResponse:
    """One page of `rows` (`?page=&per_page=`) with links to its neighbours (the other query
    parameters kept); a page past the last is a 404 naming how many there are."""
    per_page = query_int(request, "per_page", 50, low=1, high=PER_PAGE_MAX) or 50
    page = query_int(request, "page", 1, low=1) or 1
    count = rows.count()
    pages = max((count + per_page - 1) // per_page, 1)
    if page > pages:
        raise ApiError(404, f"page: there are {pages} page(s).", fields={"page": [f"At most {pages}."]})

    def link(number: int) -> str:
        query = request.GET.copy()
        query["page"], query["per_page"] = str(number), str(per_page)
        return absolute(request, f"{request.path}?{query.urlencode()}")

    return JsonResponse({
        "count": count, "page": page, "pages": pages,
        "next": link(page + 1) if page < pages else None, "previous": link(page - 1) if page > 1 else None,
        "results": [serialize(request, obj) for obj in rows[(page - 1) * per_page: page * per_page]],
    })


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

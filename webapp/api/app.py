"""The JSON API on django-ninja: one `NinjaAPI` whose routers (one per domain module) declare each
operation once, as a typed function with pydantic schemas that validate the input, serialize the
output and make the OpenAPI 3.1 document. This module is the glue that keeps Troupe's contract:

- bearer tokens scoped to a team (`request.team`, `request.api_token`), checked before anything
  else, also before a wrong method (401, then 405, both in the error envelope);
- the error envelope `{"error", "field", "fields"}` for every refusal: 400 (every problem at once:
  pydantic's, a service's or a form's), 401, 404 (an id past the database's range too), 409, 413, 415;
- an unknown query parameter is a 400 (the document's parameters are the one list of them) and an
  unknown body field is a 400 (`In`: `extra="forbid"`, strict types);
- a JSON body is read through `trust.json_load` (the trust boundary: duplicate keys, NaN, depth)
  and must say `Content-Type: application/json` (else 415).

A new endpoint is a function on its module's router; `webapp/urls.py` mounts `urlpatterns()`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from functools import cache
from typing import Annotated, Any, Generic, TypeVar

from django.contrib.auth.decorators import login_not_required
from django.core.exceptions import ObjectDoesNotExist, RequestDataTooBig, SuspiciousOperation
from django.core.exceptions import ValidationError as FormError
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.http.multipartparser import MultiPartParserError
from django.urls import URLPattern
from django.urls import path as django_path
from ninja import Field, NinjaAPI, Query, Schema
from ninja.errors import AuthenticationError, HttpError
from ninja.errors import ValidationError as SchemaError
from ninja.parser import Parser
from ninja.security import HttpBearer
from pydantic import ConfigDict, TypeAdapter
from pydantic import ValidationError as PydanticError

from training.config import ConfigError
from webapp.api.http import PER_PAGE_MAX, ApiError, absolute, error, invalid, path_template
from webapp.artifacts import files as artifacts
from webapp.core import trust
from webapp.core.values import ID_MAX
from webapp.teams import services as tokens

T = TypeVar("T")


# == shapes every module shares ========================================================================


class Error(Schema):
    error: str = Field(description="What is wrong, in a sentence.")
    field: str | None = Field(description="The first field at fault, if any.")
    fields: dict[str, list[str]] = Field(description="Every field at fault with its messages (`__all__`: the object as a whole).")


class In(Schema):
    """A request body: strict JSON types (a string is not a number) and no field it does not name."""

    model_config = ConfigDict(extra="forbid", strict=True)


Id = Annotated[int, Field(ge=1, le=ID_MAX, description="An object id.")]


def read_body(request: HttpRequest, model: type[In], *, partial: bool = False) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The request's JSON object checked against `model` field by field and answered rather than
    raised: (the values that passed, the problems by field). An endpoint that validates further
    (the pages' forms, a service) gives it what passed and merges the rest, so that every problem
    comes back at once. `partial`: a change, nothing required. Not JSON (415), or not an object, is
    an error at once: there are no fields to speak of."""
    body = api.parser.parse_body(request)
    fields = model.model_fields
    problems: dict[str, list[str]] = {key: [f"Unknown field; the fields are: {', '.join(fields)}."] for key in body if key not in fields}
    passed: dict[str, Any] = {}
    for name, info in fields.items():
        if name not in body:
            if info.is_required() and not partial:
                problems[name] = ["This field is required."]
            continue
        try:
            passed[name] = _adapter(model, name).validate_python(body[name], strict=True)
        except PydanticError as exc:
            problems[name] = [_message(exc.errors()[0], model.model_json_schema()["properties"][name])]
    return passed, problems


BODIES: dict[str, dict[str, Any]] = {}
"""The body schemas of the routes that read theirs with `read_body`: components of the document."""


def body_doc(model: type[In], *, partial: bool = False, **more: Any) -> dict[str, Any]:
    """`openapi_extra` of a route that reads its body with `read_body`: the body's schema (a
    component named for it; `<Name>Change` for a change, where nothing is required), and any more
    content types, in the document."""
    name = model.__name__ + ("Change" if partial else "")
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    BODIES.update(schema.pop("$defs", {}))
    if partial:
        schema.pop("required", None)
    BODIES[name] = {**schema, "title": name}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}},
                                                           **more}}}


@cache
def _adapter(model: type[In], name: str) -> TypeAdapter[Any]:
    info = model.model_fields[name]
    return TypeAdapter(Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation)  # type: ignore[name-defined]


KINDS = {"string": "string", "integer": "integer", "number": "number", "boolean": "boolean", "object": "object", "array": "array"}


def _message(problem: Mapping[str, Any], schema: Mapping[str, Any]) -> str:
    """A field's first problem as a sentence: its JSON type where the value is of another."""
    options = schema.get("anyOf") or [schema]
    kinds = [o["type"] for o in options if o.get("type") in KINDS]
    nullable = any(o.get("type") == "null" for o in options)
    if problem["type"].endswith(("_type", "_parsing")) and kinds:
        if problem["loc"] and isinstance(problem["loc"][0], int):
            items = next((o.get("items", {}).get("type") for o in options if o.get("type") == "array"), None)
            return f"Expected a list of {items}s." if items else "Expected a list."
        text = " or ".join(kinds)
        return f"Expected {'an' if text[0] in 'aeiou' else 'a'} {text}{' or null' if nullable else ''}."
    return MESSAGES.get(problem["type"]) or problem["msg"].rstrip(".") + "."


class Paging(Schema):
    page: int = Field(1, ge=1, description="Page number (1 is the first); past the last page is a 404.")
    per_page: int = Field(50, ge=1, le=PER_PAGE_MAX, description="Results per page.")


class Page(Schema, Generic[T]):
    count: int
    page: int
    pages: int
    next: str | None
    previous: str | None
    results: list[T]


def stamp(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def page_of(request: HttpRequest, rows: QuerySet[Any] | list[Any], paging: Paging) -> dict[str, Any]:
    """One page of `rows` with links to its neighbours (the other query parameters kept); a page
    past the last is a 404 naming how many there are. Its `results` are the objects: the route's
    `Page[...]` schema serializes them."""
    count = rows.count() if isinstance(rows, QuerySet) else len(rows)
    pages = max((count + paging.per_page - 1) // paging.per_page, 1)
    if paging.page > pages:
        raise ApiError(404, f"page: there are {pages} page(s).", fields={"page": [f"At most {pages}."]})

    def link(number: int) -> str:
        query = request.GET.copy()
        query["page"], query["per_page"] = str(number), str(paging.per_page)
        return absolute(request, f"{request.path}?{query.urlencode()}")

    start = (paging.page - 1) * paging.per_page
    return {"count": count, "page": paging.page, "pages": pages,
            "next": link(paging.page + 1) if paging.page < pages else None,
            "previous": link(paging.page - 1) if paging.page > 1 else None,
            "results": list(rows[start: start + paging.per_page])}


ERRORS = {
    400: "Bad input: `fields` names each problem.",
    401: "No valid API token.",
    404: "Not found, or not your team's.",
    409: "In use: the message says by what.",
    413: "The body is too large.",
    415: "The body is not of a type this endpoint reads.",
}


def answers(ok: Mapping[int, Any], *codes: int) -> dict[Any, Any]:
    """A route's `response=`: its success shapes, and the error envelope for 401 and `codes`."""
    return {**ok, frozenset({401, *codes}): Error}


# == the API ===========================================================================================


class JsonParser(Parser):
    """Bodies through the trust boundary: JSON only (415 otherwise), an object, and refused where
    `trust.json_load` refuses (duplicate keys, NaN, too deep, too large, and `trust.check_tree`'s
    NUL and lone surrogates in any string or key)."""

    def parse_body(self, request: HttpRequest) -> dict[str, Any]:
        if (request.content_type or "") != "application/json":
            raise ApiError(415, f"Send JSON (Content-Type: application/json), not {request.content_type or 'nothing'}.")
        body = trust.json_load(request.body, field="body")
        if not isinstance(body, dict):
            raise ApiError(400, "Send a JSON object.", fields={"body": ["Expected a JSON object."]})
        return body


def _token(request: HttpRequest) -> Any:
    scheme, _, text = request.headers.get("Authorization", "").partition(" ")
    return tokens.api_token_authenticate(text=text.strip()) if scheme.lower() == "bearer" else None


class BearerToken(HttpBearer):
    """`Authorization: Bearer <token>`: the token's user and team become the request's. Then the
    checks that come before any parsing: an id past the database's range is a 404, a query
    parameter the document does not declare for this operation is a 400."""

    def __call__(self, request: HttpRequest) -> Any:
        token = _token(request)
        if token is None:
            return None
        request.user, request.team, request.api_token = token.user, token.team, token  # type: ignore[attr-defined]
        match = request.resolver_match
        if match and any(isinstance(v, int) and not 0 <= v <= ID_MAX for v in match.kwargs.values()):
            raise Http404
        unknown = sorted(set(request.GET) - query_names(match.route if match else "", request.method or "GET"))
        if unknown:
            raise ApiError(400, f"Unknown query parameter {unknown[0]!r}; see /api/v1/openapi.json.",
                           fields={name: ["Unknown query parameter."] for name in unknown})
        return token

    def authenticate(self, request: HttpRequest, token: str) -> Any:  # (the check is __call__'s)
        raise NotImplementedError


class TroupeAPI(NinjaAPI):
    def get_openapi_schema(self, **kwargs: Any) -> Any:
        schema = super().get_openapi_schema(**kwargs)
        schema["components"].setdefault("schemas", {}).update(BODIES)
        return schema

    def get_openapi_operation_id(self, operation: Any) -> str:
        """A route's function name (`runs`, `run_launch`, ...): what a generated client calls it."""
        return str(operation.view_func.__name__)


api = TroupeAPI(
    title="Troupe API", version="1", urls_namespace="api", auth=BearerToken(), parser=JsonParser(),
    openapi_url=None, docs_url=None,
    description="Everything a team member can do from a script. Create a token on the API tokens page and send "
                "`Authorization: Bearer <token>`; every object is your token's team's, another team's is a 404.",
)


def _location(loc: Iterable[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


MESSAGES = {"missing": "This field is required.", "extra_forbidden": "Unknown field; see /api/v1/openapi.json."}


@api.exception_handler(SchemaError)
def _schema_error(request: HttpRequest, exc: SchemaError) -> HttpResponse:
    """Pydantic's problems, every one, by field: `name`, `seeds[1]`, a query parameter by its name."""
    fields: dict[str, list[str]] = {}
    for problem in exc.errors:
        source, *rest = problem["loc"]
        if source == "body" and len(rest) > 1:
            rest = rest[1:]  # the route's parameter name
        name = _location(rest) or ("body" if source == "body" else source)
        message = MESSAGES.get(problem["type"]) or problem["msg"].rstrip(".") + "."
        fields.setdefault(name, []).append(message)
    return error(400, "; ".join(f"{k}: {' '.join(v)}" for k, v in fields.items()), fields=fields)


def _handle(*kinds: type[Exception]) -> Callable[[Callable[[HttpRequest, Any], HttpResponse]], Any]:
    def register(handler: Callable[[HttpRequest, Any], HttpResponse]) -> Any:
        for kind in kinds:
            api.add_exception_handler(kind, handler)
        return handler
    return register


@_handle(ApiError)
def _api_error(request: HttpRequest, exc: ApiError) -> HttpResponse:
    return error(exc.status, exc.message, fields=exc.fields)


@_handle(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    """Ninja's own refusals; a body our parser refused keeps the parser's answer (415, the field at fault)."""
    if exc.__cause__ is not None and not isinstance(exc.__cause__, HttpError):
        return api.on_exception(request, exc.__cause__)
    return error(exc.status_code, str(exc))


@_handle(AuthenticationError)
def _unauthenticated(request: HttpRequest, exc: Exception) -> HttpResponse:
    return error(401, "Send a valid API token: `Authorization: Bearer <token>` (create one on the API tokens page).")


@_handle(Http404, ObjectDoesNotExist)
def _not_found(request: HttpRequest, exc: Exception) -> HttpResponse:
    return error(404, "Not found.")


@_handle(artifacts.ArtifactMissing)
def _artifact_missing(request: HttpRequest, exc: Exception) -> HttpResponse:
    return error(404, str(exc))


@_handle(FormError)
def _invalid(request: HttpRequest, exc: FormError) -> HttpResponse:
    return invalid(exc)


@_handle(ConfigError)
def _config_error(request: HttpRequest, exc: ConfigError) -> HttpResponse:
    """A config's problems, every one found in one pass (`ConfigProblems`), the first named in `error`."""
    from webapp.runs.services import MAX_CONFIG_PROBLEMS

    first, *others = exc.problems
    if not others:
        return error(400, str(exc), field=exc.field)
    fields: dict[str, list[str]] = {}
    for problem in [first, *others[:MAX_CONFIG_PROBLEMS]]:
        fields.setdefault(problem.field, []).append(problem.message)
    return error(400, str(first), field=first.field, fields=fields)


@_handle(RequestDataTooBig)
def _too_big(request: HttpRequest, exc: Exception) -> HttpResponse:
    return error(413, "The request body is too large.")


@_handle(MultiPartParserError, SuspiciousOperation)
def _unreadable(request: HttpRequest, exc: Exception) -> HttpResponse:
    return error(400, f"The request could not be read: {exc}")


# == the URLconf and the document ======================================================================


PREFIX = "/api/v1/"


@cache
def _operations() -> dict[tuple[str, str], frozenset[str]]:
    """(path template, method) -> the query parameters the document declares for it."""
    document = api.get_openapi_schema(path_prefix=PREFIX)
    out: dict[tuple[str, str], frozenset[str]] = {}
    for path, item in document["paths"].items():
        for method, operation in item.items():
            out[(path, method)] = frozenset(p["name"] for p in operation.get("parameters", []) if p["in"] == "query")
    return out


def query_names(route: str, method: str) -> frozenset[str]:
    return _operations().get((path_template(route), method.lower()), frozenset())


def urlpatterns() -> list[URLPattern]:
    """One URL pattern per path (ninja makes one per operation), its view answering a method it does
    not allow with the envelope: 401 without a valid token, else 405 naming the methods."""
    patterns: list[URLPattern] = []
    for bound in api._get_bound_routers():  # noqa: SLF001 (ninja's routers as mounted on the API)
        for route, path_view in bound.path_operations.items():
            methods = tuple(m for op in path_view.operations for m in op.methods)
            names = [name for op in path_view.operations if (name := getattr(op, "url_name", None))]
            route = re.sub(r"/+", "/", f"{PREFIX}{bound.prefix}{route}").lstrip("/")
            view = _view(path_view.get_view(), methods)
            for op in path_view.operations:  # a route that takes a file: the body limit's check reads this (bodylimit.upload_view)
                if getattr(op.view_func, "takes_upload", False):
                    view.takes_upload, view.__wrapped__ = True, op.view_func  # type: ignore[attr-defined]
            patterns.append(django_path(re.sub(r"\{(\w+:)?(\w+)\}", r"<\1\2>", route), view, name=names[0] if names else None))
    return patterns


def _view(inner: Callable[..., HttpResponse], methods: tuple[str, ...]) -> Callable[..., HttpResponse]:
    @login_not_required
    def view(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.method not in methods:
            if _token(request) is None:
                return _unauthenticated(request, AuthenticationError())
            response = error(405, f"Use {' or '.join(methods)}.")
            response["Allow"] = ", ".join(methods)
            return response
        return inner(request, *args, **kwargs)

    view.csrf_exempt = True  # type: ignore[attr-defined]  # no cookie authenticates the API
    view.api_methods = methods  # type: ignore[attr-defined]  # the OpenAPI test compares them with the document
    return view


def document_paths() -> dict[str, Any]:
    """The generated document's paths and schemas (`openapi.py` serves them with the rest)."""
    return api.get_openapi_schema(path_prefix=PREFIX)


QueryPaging = Query[Paging]

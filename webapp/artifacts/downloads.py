"""Streamed downloads that stay streamed under Daphne.

Django serves a *synchronous* iterator under ASGI by first collecting it into a list (all of it
in memory). So under ASGI the chunks are pulled one at a time through `sync_to_async` (the ORM and
file reads stay in the sync thread) and handed to Django as an async iterator; under WSGI (and
the test client) the plain iterator is used.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse

from webapp.artifacts import files
from webapp.models import Checkpoint, Job, Run

_DONE = object()


def _next(iterator: Iterator[Any]) -> Any:
    return next(iterator, _DONE)


async def _pull(iterator: Iterator[Any]) -> AsyncIterator[Any]:
    pull = sync_to_async(_next, thread_sensitive=True)
    while (chunk := await pull(iterator)) is not _DONE:
        yield chunk


def streamed(request: HttpRequest, chunks: Iterator[Any], *, filename: str, content_type: str) -> StreamingHttpResponse:
    """A download of `chunks` (bytes or str) named `filename`."""
    content: Any = _pull(iter(chunks)) if isinstance(request, ASGIRequest) else chunks
    response = StreamingHttpResponse(content, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{_safe_name(filename)}"'
    response["X-Content-Type-Options"] = "nosniff"
    response["Cache-Control"] = "private, no-store"
    return response


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:150] or "download"


# == the run's artifacts (pages and API share these) ===================================================

RUN_FILES = ("config.yaml", "metrics.csv", "metrics.jsonl", "rollouts.jsonl")


def run_file_download(request: HttpRequest, *, run: Run, name: str) -> HttpResponse:
    """config.yaml, metrics.csv, metrics.jsonl or rollouts.jsonl of a run."""
    stem = f"run-{run.pk}"
    if name == "config.yaml":
        response = HttpResponse(run.config_yaml, content_type="application/yaml; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="{stem}-config.yaml"'
        return response
    if name == "metrics.csv":
        return streamed(request, files.metrics_csv(run=run), filename=f"{stem}-metrics.csv", content_type="text/csv; charset=utf-8")
    if name == "metrics.jsonl":
        return streamed(request, files.metrics_jsonl(run=run), filename=f"{stem}-metrics.jsonl", content_type="application/x-ndjson")
    if name == "rollouts.jsonl":
        return streamed(request, files.rollouts_jsonl(run=run), filename=f"{stem}-rollouts.jsonl", content_type="application/x-ndjson")
    raise files.ArtifactMissing(f"No file {name!r}; runs offer {', '.join(RUN_FILES)}.")


def checkpoint_download(request: HttpRequest, *, run: Run, checkpoint: Checkpoint | None, name: str) -> HttpResponse:
    """One agent's adapter (or full model, or the shared policy) at a checkpoint, as a zip."""
    if checkpoint is None:
        raise files.ArtifactMissing("No such checkpoint.")
    folder, policy = files.policy_folder(run=run, checkpoint=checkpoint, name=name)
    root = f"run-{run.pk}-step-{checkpoint.step}-{policy.name}-{policy.kind}"
    return streamed(request, files.zip_folder(folder, root=root), filename=f"{root}.zip", content_type="application/zip")


def merged_download(request: HttpRequest, *, job: Job) -> HttpResponse:
    folder = files.merged_folder(job=job)
    root = f"run-{job.run_id}-step-{job.params.get('checkpoint_step')}-{job.params.get('agent')}-merged"
    return streamed(request, files.zip_folder(folder, root=root), filename=f"{root}.zip", content_type="application/zip")

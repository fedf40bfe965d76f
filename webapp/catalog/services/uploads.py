"""A dataset's rows read and described: an upload's format, its rows checked against the
environment's fields (every bad line named), and the schema, preview and notes a dataset shows."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import UploadedFile

from agents.base import Environment, fields_of
from training.data import DataError, DataErrors, read_rows
from webapp.core.values import FORMULA_START
from webapp.models import Dataset

PREVIEW_ROWS = 5
"""Rows a dataset's page previews."""

PREVIEW_CHARS = 300
"""Longer preview cells are cut."""

_PLAIN_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def upload_format(upload: UploadedFile) -> str:
    """JSONL or CSV by extension, else by content (a first `{` means JSONL), as the engine reads it."""
    suffix = Path(upload.name or "").suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return Dataset.Format.JSONL
    if suffix == ".csv":
        return Dataset.Format.CSV
    upload.seek(0)
    head = upload.read(4096).lstrip()
    upload.seek(0)
    return Dataset.Format.JSONL if head.startswith((b"{", b"\xef\xbb\xbf{")) else Dataset.Format.CSV


def dataset_read(path: Path, env: Environment, *, field: str) -> list[dict[str, Any]]:
    """The rows, checked against the environment's declared row fields; a ValidationError on
    `field` naming the line, the field and the limit otherwise."""
    try:
        fields = fields_of(env)
    except ValueError as exc:  # a plugin's malformed declaration
        raise ValidationError({"environment": str(exc)}) from None
    try:
        return read_rows(
            path,
            fields=fields,
            max_rows=settings.TROUPE_UPLOAD_MAX_ROWS,
            max_bytes=settings.TROUPE_UPLOAD_MAX_BYTES,
        )
    except DataError as exc:  # every bad line found, each its own message
        needs = f"{env.name} rows need: {', '.join(env.required_fields)}."
        problems = [str(p) for p in exc.problems]
        if isinstance(exc, DataErrors) and exc.stopped:
            problems.append(f"Stopped looking after {len(exc.problems)} problems; lines after line {exc.problems[-1].line} were not checked.")
        if any("missing" in p.message for p in exc.problems):
            problems.append(needs)
        raise ValidationError({field: problems}) from None


def dataset_describe(dataset: Dataset, rows: list[dict[str, Any]], *, row_count: int) -> None:
    schema: dict[str, None] = {}
    for row in rows:
        schema.update(dict.fromkeys(row))
    dataset.schema = list(schema)
    dataset.preview = [{k: short_cell(v) for k, v in row.items()} for row in rows[:PREVIEW_ROWS]]
    dataset.row_count = row_count
    dataset.status, dataset.status_message = Dataset.Status.VALID, formula_note(rows)


def formula_note(rows: list[dict[str, Any]]) -> str:
    """Flag cells a spreadsheet would run as formulas if the rows were opened as CSV (plain
    signed numbers such as -3 are fine); the dataset stays valid: training reads them as text."""
    count, first = 0, ""
    for i, row in enumerate(rows, start=1):
        for key, value in row.items():
            if isinstance(value, str) and value.startswith(FORMULA_START) and not _PLAIN_NUMBER.match(value.strip()):
                count += 1
                first = first or f"row {i}, field {key}"
    if not count:
        return ""
    return (f"Note: {count} cell{'s' if count > 1 else ''} start{'' if count > 1 else 's'} with =, +, -, @ or a tab "
            f"(first: {first}); a spreadsheet would run such a cell as a formula. Troupe's CSV exports prefix them with '.")


def short_cell(value: Any) -> Any:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"

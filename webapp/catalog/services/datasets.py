"""Datasets: task rows for an environment, an uploaded JSONL/CSV file or the environment's generator."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import UploadedFile
from django.db import transaction

from webapp.catalog.environments import environment_load
from webapp.catalog.selectors import dataset_delete_blocker
from webapp.catalog.services.names import check_name_free
from webapp.catalog.services.uploads import PREVIEW_ROWS, dataset_describe, dataset_read, upload_format
from webapp.core.private import data_dir_tighten, private_file
from webapp.models import Dataset, Team
from webapp.teams.audit import Verb, audit_record


def dataset_upload(*, team: Team, name: str, environment: str, upload: UploadedFile, eval_fraction: float,
                   actor: User | None = None) -> Dataset:
    """Validate an uploaded JSONL/CSV file completely, then store it under a random name.

    Either the file is stored and the row saved, or neither: errors leave nothing behind."""
    dataset = Dataset(
        team=team, name=name, kind=Dataset.Kind.UPLOAD, environment=environment, eval_fraction=eval_fraction,
        original_filename=(upload.name or "upload")[-255:], size_bytes=upload.size or 0,
    )
    check_name_free(dataset)
    dataset.full_clean(exclude=["file", "format"])
    env = environment_load(name=environment)
    upload_size_check(upload)
    dataset.format = upload_format(upload)

    def describe(part: Path) -> None:
        rows = dataset_read(part, env, field="file")
        dataset_describe(dataset, rows, row_count=len(rows))

    return dataset_store_upload(dataset=dataset, upload=upload, actor=actor, describe=describe)


def upload_size_check(upload: UploadedFile) -> None:
    """An uploaded file is neither empty nor over TROUPE_UPLOAD_MAX_BYTES (a ValidationError on `file`)."""
    if not upload.size:
        raise ValidationError({"file": "The file is empty."})
    if upload.size > settings.TROUPE_UPLOAD_MAX_BYTES:
        raise ValidationError({"file": f"The file is {upload.size:,} bytes; the limit is {settings.TROUPE_UPLOAD_MAX_BYTES:,}."})


def dataset_store_upload(*, dataset: Dataset, upload: UploadedFile, actor: User | None,
                         describe: Callable[[Path], None]) -> Dataset:
    """Store an uploaded dataset file and save its row, or neither. The upload is written to a private
    part file in the team's dataset folder (its suffix `dataset.format`), `describe` reads and checks
    that file and fills the row's fields (raising on a bad file), then the file takes its final
    random name and the row is saved with its audit record. Any error removes the file."""
    folder = Path(settings.TROUPE_DATA_DIR) / "datasets" / str(dataset.team_id)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    data_dir_tighten(folder.parent, deep=False)  # datasets/ and this team's folder: the owner's alone
    token = secrets.token_hex(16)
    final = folder / f"{token}.{dataset.format}"
    part = folder / f".{token}.part.{dataset.format}"  # read_rows picks the format by suffix
    try:
        private_file(part)  # 0600 whatever the umask
        with part.open("wb") as out:
            for chunk in upload.chunks():
                out.write(chunk)
        describe(part)
        part.rename(final)
        dataset.file = str(final.relative_to(settings.TROUPE_DATA_DIR))
        with transaction.atomic():
            dataset.save()
            audit_record(team=dataset.team, actor=actor, verb=Verb.CREATE, obj=dataset, kind=dataset.kind,
                         file=dataset.original_filename, rows=dataset.row_count)
    except BaseException:
        part.unlink(missing_ok=True)
        final.unlink(missing_ok=True)
        raise
    return dataset


def dataset_generator_create(
    *, team: Team, name: str, environment: str, env_args: dict[str, Any], size: int, eval_size: int, actor: User | None = None,
) -> Dataset:
    """A dataset made by the environment's procedural generator; a sample is generated now."""
    dataset = Dataset(team=team, kind=Dataset.Kind.GENERATOR)
    with transaction.atomic():
        dataset_generator_update(dataset=dataset, name=name, environment=environment, env_args=env_args, size=size, eval_size=eval_size)
        audit_record(team=team, actor=actor, verb=Verb.CREATE, obj=dataset, kind=dataset.kind, environment=environment)
    return dataset


def dataset_generator_update(
    *, dataset: Dataset, name: str, environment: str, env_args: dict[str, Any], size: int, eval_size: int
) -> Dataset:
    dataset.name, dataset.environment, dataset.env_args = name, environment, env_args or {}
    dataset.size, dataset.eval_size = size, eval_size
    if not size:
        raise ValidationError({"size": "Generate at least one training task."})
    check_name_free(dataset)
    dataset.full_clean()
    env = environment_load(name=environment, env_args=dataset.env_args)
    try:
        sample = env.generate(PREVIEW_ROWS, seed=0)
    except Exception as exc:  # plugin code: any failure means these arguments do not work
        raise ValidationError({"env_args": f"{environment} could not generate tasks with these arguments: {exc}"}) from None
    dataset_describe(dataset, sample, row_count=size + eval_size)
    dataset.save()
    return dataset


def dataset_upload_update(*, dataset: Dataset, name: str, eval_fraction: float) -> Dataset:
    dataset.name, dataset.eval_fraction = name, eval_fraction
    check_name_free(dataset)
    dataset.full_clean()
    dataset.save()
    return dataset


def dataset_revalidate(*, dataset: Dataset) -> Dataset:
    """Check a stored dataset again (the file is still there, the environment still accepts it)."""
    try:
        env = environment_load(name=dataset.environment, env_args=dataset.env_args if dataset.kind == Dataset.Kind.GENERATOR else {})
        if dataset.kind == Dataset.Kind.UPLOAD:
            if dataset.path is None or not dataset.path.is_file():
                raise ValidationError("The stored file is missing.")
            rows = dataset_read(dataset.path, env, field="file")
            dataset_describe(dataset, rows, row_count=len(rows))
        else:
            env.generate(1, seed=0)
            dataset.status, dataset.status_message = Dataset.Status.VALID, ""
    except ValidationError as exc:
        dataset.status, dataset.status_message = Dataset.Status.INVALID, "; ".join(exc.messages)
    except Exception as exc:  # plugin code: any failure makes the dataset invalid
        dataset.status, dataset.status_message = Dataset.Status.INVALID, str(exc)
    dataset.save()
    return dataset


def dataset_delete(*, dataset: Dataset, actor: User | None = None) -> None:
    if blocker := dataset_delete_blocker(dataset=dataset):
        raise ValidationError(blocker)
    path = dataset.path
    with transaction.atomic():
        audit_record(team=dataset.team_id, actor=actor, verb=Verb.DELETE, obj=dataset, kind=dataset.kind)
        dataset.delete()
        if path is not None:
            transaction.on_commit(lambda: path.unlink(missing_ok=True))

"""Conversations datasets: uploaded JSONL of `messages` that SFT runs learn from (`algorithm: sft`).

The file is read by the engine's own reader (`training.conversations.read_conversations`), so a
file that uploads is a file an SFT run can train on. Every bad line is reported at once, each with
its number, and nothing is kept of a file that fails: neither the file nor the row.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import UploadedFile

from training.conversations import Conversation, read_conversations
from training.data import DataError, DataErrors
from webapp.catalog.environments import environment_load
from webapp.catalog.services.datasets import dataset_store_upload, upload_size_check
from webapp.catalog.services.names import check_name_free
from webapp.core import trust
from webapp.core.console import UNPRINTABLE, printable
from webapp.models import Dataset, Team

PREVIEW_CONVERSATIONS = 3
PREVIEW_CHARS = 300
MAX_AGENT_CHARS = 60
"""The longest `agent` a conversation may give: an agent's role is at most 60 characters, its name 40."""
MAX_AGENT_PROBLEMS = 20


def conversations_upload(*, team: Team, name: str, environment: str, upload: UploadedFile, actor: User | None = None) -> Dataset:
    """Validate an uploaded conversations file completely, then store it under a random name; a
    ValidationError on `file` lists every bad line. Either both the file and the row are saved, or
    neither."""
    dataset = Dataset(team=team, name=name, kind=Dataset.Kind.CHATS, environment=environment, eval_fraction=0.0,
                      original_filename=(upload.name or "upload")[-255:], size_bytes=upload.size or 0, format=Dataset.Format.JSONL)
    check_name_free(dataset)
    dataset.full_clean(exclude=["file"])
    environment_load(name=environment)
    upload_size_check(upload)

    def describe(part: Path) -> None:
        conversations = _read(part)
        dataset.row_count = len(conversations)
        dataset.schema = ["messages", "agent"]
        dataset.preview = [preview(c) for c in conversations[:PREVIEW_CONVERSATIONS]]
        dataset.status, dataset.status_message = Dataset.Status.VALID, _agents_note(conversations)

    return dataset_store_upload(dataset=dataset, upload=upload, actor=actor, describe=describe)


def conversations_revalidate(*, dataset: Dataset) -> Dataset:
    """Read a stored conversations file again and save what it holds now: valid with its counts
    and preview, or invalid with why (the file is gone or no longer reads)."""
    try:
        if dataset.path is None or not dataset.path.is_file():
            raise ValidationError("The stored file is missing.")
        conversations = _read(dataset.path)
    except ValidationError as exc:
        dataset.status, dataset.status_message = Dataset.Status.INVALID, "; ".join(exc.messages)
    else:
        dataset.row_count = len(conversations)
        dataset.preview = [preview(c) for c in conversations[:PREVIEW_CONVERSATIONS]]
        dataset.status, dataset.status_message = Dataset.Status.VALID, _agents_note(conversations)
    dataset.save()
    return dataset


def _read(path: Path) -> list[Conversation]:
    try:
        conversations = read_conversations(path, max_rows=settings.TROUPE_UPLOAD_MAX_ROWS, max_bytes=settings.TROUPE_UPLOAD_MAX_BYTES)
    except DataError as exc:
        problems = [str(p) for p in exc.problems]
        if isinstance(exc, DataErrors) and exc.stopped:
            problems.append(f"Stopped looking after {len(exc.problems)} problems; lines after line {exc.problems[-1].line} were not checked.")
        raise ValidationError({"file": problems}) from None
    unstorable = [f"line {c.line}: {where} {problem}" for c in conversations for where, problem in _unstorable(c)]
    if unstorable:
        if len(unstorable) > MAX_AGENT_PROBLEMS:
            unstorable = [*unstorable[:MAX_AGENT_PROBLEMS], f"Stopped looking after {MAX_AGENT_PROBLEMS} problems."]
        raise ValidationError({"file": unstorable})
    bad = [c for c in conversations if c.agent is not None and not agent_label_ok(c.agent)]
    if bad:
        problems = [f"line {c.line}: `agent` must be an agent's name or role (at most {MAX_AGENT_CHARS} characters, no control or "
                    f"invisible characters), not '{printable(c.agent, limit=60)}'" for c in bad[:MAX_AGENT_PROBLEMS]]
        if len(bad) > MAX_AGENT_PROBLEMS:
            problems.append(f"Stopped looking after {MAX_AGENT_PROBLEMS} problems; lines after line {bad[MAX_AGENT_PROBLEMS - 1].line} "
                            "were not checked.")
        raise ValidationError({"file": problems})
    return conversations


def _unstorable(conversation: Conversation) -> list[tuple[str, str]]:
    """(where, what is wrong) for each text of a conversation that no database stores: a NUL
    character or a lone surrogate (a JSON `\\ud800` escape) in a message, its role, the prompt or the
    agent (`trust.storable_problem`; the preview and the run's snapshot keep this text)."""
    def texts(value: Any, where: str) -> Iterator[tuple[str, str]]:
        if isinstance(value, str):
            yield where, value
        elif isinstance(value, dict):
            for key, item in value.items():
                yield from texts(str(key), f"{where} (a key)")
                yield from texts(item, f"{where}.{key}")
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                yield from texts(item, f"{where}[{i}]")

    found = [*texts(list(conversation.messages), "`messages`"), *texts(conversation.prompt, "`prompt`"),
             *texts(conversation.agent, "`agent`")]
    return [(where, problem) for where, text in found if (problem := trust.storable_problem(text))]


def agent_label_ok(agent: str) -> bool:
    """Whether a conversation's `agent` can name an agent or a role: an agent's name (40 characters
    at most) or role (60) is never longer, and holds no character a page or a log would have to
    escape (the dataset's status names the agents it found)."""
    return len(agent) <= MAX_AGENT_CHARS and not any(unicodedata.category(ch) in UNPRINTABLE for ch in agent)


def preview(conversation: Conversation) -> dict[str, str]:
    """One conversation as a preview row: the agent it names, and its messages as `role: text` lines."""
    lines = "\n".join(f"{m['role']}: {m['content']}" for m in conversation.messages)
    if conversation.prompt is not None:  # a prompt-completion line (a run's own episode): the prompt's end, then the completion
        lines = f"prompt: …{conversation.prompt[-120:]}\n{lines}"
    return {"agent": conversation.agent or "", "messages": lines if len(lines) <= PREVIEW_CHARS else lines[: PREVIEW_CHARS - 1] + "…"}


def _agents_note(conversations: list[Conversation]) -> str:
    named = sorted({c.agent for c in conversations if c.agent})
    unnamed = sum(c.agent is None for c in conversations)
    parts = [f"names agents or roles: {', '.join(named)}"] if named else []
    if unnamed:
        parts.append(f"{unnamed} name no agent (they train a topology's only acting agent)")
    return ("Conversations " + "; ".join(parts) + ".") if parts else ""

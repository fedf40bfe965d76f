"""Text no database can store: one check for the engine and the web's trust boundary.

`webapp.core.trust.check_tree` (every API body, YAML config and form JSON field), the web's
conversations upload and the engine's own readers (`training.conversations`) all refuse the same
characters with the same words."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

NOT_STORABLE = re.compile("[\x00\ud800-\udfff]")
"""What no text column holds: a NUL character (PostgreSQL refuses it in text and jsonb) or a lone
surrogate (U+D800-U+DFFF: half of a UTF-16 pair, not a character; UTF-8 cannot encode it, so
SQLite and PostgreSQL both fail on it). JSON's `\\ud800` escapes and YAML's `"\\ud800"` make them."""


def storable_problem(text: str) -> str | None:
    """Why `text` cannot be stored as it is, or None: 'contains a NUL character' or 'contains a
    lone surrogate (U+D800), which is not text'."""
    bad = NOT_STORABLE.search(text)
    if bad is None:
        return None
    if bad.group() == "\x00":
        return "contains a NUL character"
    return f"contains a lone surrogate (U+{ord(bad.group()):04X}), which is not text"


def unstorable_strings(value: Any, where: str = "") -> Iterator[tuple[str, str]]:
    """(where, problem) for every string in a parsed JSON value, keys included, that cannot be
    stored; `where` reads like `messages[2].content`."""
    if isinstance(value, str):
        problem = storable_problem(value)
        if problem is not None:
            yield where or "the value", problem
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and (problem := storable_problem(key)) is not None:
                yield f"a key of {where or 'the line'} ({key!a})", problem
                continue
            yield from unstorable_strings(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from unstorable_strings(item, f"{where}[{i}]")

"""What Troupe writes to the operator's console (`manage.py troupe`, a worker's or Daphne's log):
one line per record, nothing a member typed acting on the terminal.

Run names, usernames, URLs, error messages quoting a config or a dataset and plugin errors reach
the log. Written raw, a newline forges a line ("12:00:00 run #1 succeeded") and an escape sequence
clears, retitles or rewrites the operator's terminal. `printable` writes every such character as
an escape (`\\x1b`, `\\n`, `\\u202e`); `ConsoleFormatter` applies it to each record's message and
indents every line of a traceback, so a log line is only ever what a record says at its start.
"""

from __future__ import annotations

import logging
import unicodedata
from typing import Any

UNPRINTABLE = ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")
"""Unicode categories written as escapes: controls (C0, C1, DEL: newlines, ESC, BEL), format
characters (bidirectional controls, zero-width characters), surrogates, private-use and
unassigned code points, and the line and paragraph separators."""

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: Any, *, limit: int | None = None) -> str:
    """`text` as one line a terminal shows as written: every character of an `UNPRINTABLE`
    category becomes an escape (`\\n`, `\\x1b`, `\\u202e`). `limit` cuts it to that many
    characters of the original, with an ellipsis."""
    text = str(text)
    cut = limit is not None and len(text) > limit
    if cut:
        text = text[:limit]
    out = "".join(_escape(ch) if unicodedata.category(ch) in UNPRINTABLE else ch for ch in text)
    return out + "…" if cut else out


def _escape(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


class ConsoleFormatter(logging.Formatter):
    """The console's formatter (settings.LOGGING): a record's message is one printable line; a
    traceback or stack keeps its lines, each printable and indented, so no line of it can pass for
    a record of its own (every record starts at the first column, with its time)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        return _indented(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _indented(super().formatStack(stack_info))


def _indented(text: str) -> str:
    return "\n".join("    " + printable(line) for line in text.splitlines())

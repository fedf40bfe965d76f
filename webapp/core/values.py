"""Values written out of Troupe: spreadsheet-safe CSV cells and JSON-storable numbers."""

from __future__ import annotations

import logging
import math
import re
from datetime import datetime
from typing import Any

log = logging.getLogger(__name__)


ID_MAX = 2**63 - 1
"""The largest primary key a database holds (a signed 64-bit integer): a larger id names no row, and
SQLite and PostgreSQL refuse to compare with it rather than answer 'no such row'."""

def id_or_none(text: Any) -> int | None:
    """An object id written in a query string or a form value (ASCII digits, at most ID_MAX), or
    None for anything else: `str.isdigit` also accepts digits `int` refuses (`²`), and a number
    past ID_MAX makes the database raise instead of answering "no such row"."""
    text = str(text or "").strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 19:
        return None
    value = int(text)
    return value if value <= ID_MAX else None


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """A CSV cell that a spreadsheet shows as text: a string starting with = + - @ (or a tab/CR)
    gets a leading apostrophe, so it is never evaluated as a formula. Numbers stay numbers."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return value
    text = value.isoformat() if isinstance(value, datetime) else str(value)
    return "'" + text if text.startswith(FORMULA_START) else text


_NOT_STORABLE = re.compile("[\\x00\\ud800-\\udfff]")


def storable(value: Any) -> Any:
    """Model output as JSON every database accepts: no NUL characters (PostgreSQL text and jsonb
    reject them) and no lone surrogates (UTF-8 cannot encode them): each becomes U+FFFD; no
    NaN/infinity (not JSON): those numbers become null."""
    if isinstance(value, str):
        return _NOT_STORABLE.sub("\ufffd", value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {storable(str(k)): storable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [storable(v) for v in value]
    return value

"""Usernames people cannot mistake for one another.

A new username is refused when it mixes writing systems (`alіce`: Latin letters and a Cyrillic
`і`), or when its skeleton — what it looks like, after Unicode compatibility folding (NFKC), case
folding, dropping accents and mapping letters of other scripts and digits to the Latin letters they
look like — equals an existing user's (`аlice` in Cyrillic, `ALICE`, `alice`, `a1ice`).

This follows the approach of Unicode's security mechanisms (UTS #39: skeletons and mixed-script
detection) with the standard library's `unicodedata` and a table of the look-alikes that matter
for names; it is not the full confusables data. `shown` is how a name is displayed where a
look-alike could deceive (the audit trail, the members page).
"""

from __future__ import annotations

import unicodedata

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError

LOOK_ALIKES = str.maketrans({
    # Cyrillic
    "а": "a", "в": "b", "г": "r", "д": "d", "е": "e", "ё": "e", "з": "3", "и": "u", "і": "i", "ї": "i", "ј": "j",
    "к": "k", "л": "n", "м": "m", "н": "h", "о": "o", "п": "n", "р": "p", "с": "c", "т": "t", "у": "y", "х": "x",
    "ѕ": "s", "ԁ": "d", "ԛ": "q", "ԝ": "w", "ӏ": "l", "ь": "b", "ъ": "b", "ы": "bi", "һ": "h", "ɡ": "g", "ү": "y",
    # Greek
    "α": "a", "β": "b", "γ": "y", "δ": "d", "ε": "e", "ζ": "z", "η": "n", "ι": "i", "κ": "k", "ν": "v", "ο": "o",
    "ρ": "p", "σ": "o", "ς": "c", "τ": "t", "υ": "u", "χ": "x", "ω": "w",
    # Latin letters that look like others, and digits
    "ı": "i", "ł": "l", "ø": "o", "ß": "ss", "ɑ": "a", "ʟ": "l",
    "0": "o", "1": "l", "i": "l", "|": "l", "5": "s", "$": "s",
})
"""Characters (after NFKC and case folding) and the plain Latin letter each looks like. `i` and
`1` and `l` share a skeleton: `al1ce`, `aiice` and `alice` are one name to a reader."""

MULTI = (("rn", "m"), ("vv", "w"), ("cl", "d"))
"""Letter pairs that read as one letter in many fonts."""

COMPATIBLE_SCRIPTS = ({"CJK", "HIRAGANA", "KATAKANA"}, {"CJK", "HANGUL"})
"""Scripts that are written together (Japanese, Korean): not mixing."""


def skeleton(name: str) -> str:
    """What `name` looks like: two names with one skeleton are confusable."""
    folded = unicodedata.normalize("NFKC", name).casefold()
    bare = "".join(ch for ch in unicodedata.normalize("NFD", folded) if not unicodedata.combining(ch))
    out = bare.translate(LOOK_ALIKES).translate(LOOK_ALIKES)  # twice: Cyrillic і is i, which is l
    for pair, single in MULTI:
        out = out.replace(pair, single)
    return out


def script(ch: str) -> str | None:
    """The writing system of a letter (LATIN, CYRILLIC, GREEK, CJK...), None for digits,
    punctuation and symbols, which every script shares."""
    if not unicodedata.category(ch).startswith("L"):
        return None
    name = unicodedata.name(ch, "")
    first = name.split(" ", 1)[0]
    return first or None


def scripts(name: str) -> set[str]:
    return {s for s in map(script, unicodedata.normalize("NFKC", name)) if s}


def mixed_scripts(name: str) -> bool:
    found = scripts(name)
    return len(found) > 1 and not any(found <= allowed for allowed in COMPATIBLE_SCRIPTS)


def username_check(name: str, *, exclude_pk: int | None = None) -> None:
    """Raise ValidationError when `name` mixes scripts or looks like an existing username."""
    if mixed_scripts(name):
        raise ValidationError(
            f"This username mixes writing systems ({', '.join(sorted(s.title() for s in scripts(name)))}), "
            "so it could pass for another: use letters of one.", code="mixed_scripts")
    mine = skeleton(name)
    users = get_user_model().objects.exclude(pk=exclude_pk) if exclude_pk else get_user_model().objects.all()
    for other in users.values_list("username", flat=True).iterator():
        if other != name and skeleton(other) == mine:
            raise ValidationError("This username looks too much like an existing one; choose another.", code="confusable")


def shown(name: str) -> str:
    """How a username reads where it could deceive: as it is, followed by its escaped form when it
    mixes scripts or could pass for a plain ASCII name (`alіce` is shown `alіce [al\\u0456ce]`), so a
    look-alike made before these checks, or by the operator, stands out."""
    if not name or name.isascii() or not (mixed_scripts(name) or skeleton(name).isascii()):
        return name
    return f"{name} [{ascii(name)[1:-1]}]"

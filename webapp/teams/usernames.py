"""Usernames people cannot mistake for one another.

A new username is refused when it mixes writing systems (`alіce`: Latin letters and a Cyrillic
`і`), or when its skeleton — what it looks like, after Unicode compatibility folding (NFKC), case
folding, dropping accents and mapping letters of other scripts and digits to the Latin letters they
look like — equals an existing user's (`аlice` in Cyrillic, `ALICE`, `alice`, `a1ice`).

This follows Unicode's security mechanisms (UTS #39: skeletons and mixed-script detection) with
Unicode's own confusables data (the confusable-homoglyphs package), Latin letters that are another
letter drawn differently (small capitals, letters with a hook or a stroke: `bᴏb`, `ƀob`), and a
few additions for names (digits, `i` and `l`). `shown` is how a name is displayed where a
look-alike could deceive (the audit trail, the members page).
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

from confusable_homoglyphs import confusables
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError


def _prototypes() -> dict[str, str]:
    """Each character of Unicode's confusables data (UTS #39 `confusables.txt`, as the
    confusable-homoglyphs package ships it) and the prototype it maps to: `ᴏ` to `o`, `Ƅ` to `b`,
    Cyrillic `а` to `a`, `m` to `rn`. The package keeps the mapping both ways: a character with one
    entry is mapped to it, a prototype lists all its look-alikes; of two characters that name only
    each other, the later is mapped to the earlier."""
    data = confusables.confusables_data
    out: dict[str, str] = {}
    for raw, entries in data.items():
        char = raw.replace("\u200e", "")  # the data wraps right-to-left characters in marks
        if len(char) != 1 or len(entries) != 1:
            continue
        target = entries[0]["c"].replace("\u200e", "")
        back = data.get(entries[0]["c"], [])
        if len(back) == 1 and back[0]["c"] == raw and target < char:
            continue  # each names only the other: keep one direction
        out[char] = target
    return out


PROTOTYPES = _prototypes()

_LATIN_VARIANT = re.compile(r"LATIN (?:(?:SMALL|CAPITAL) )?LETTER (?:SMALL CAPITAL )?([A-Z])(?: WITH .+)?")
"""Latin letters that are a plain letter drawn differently: small capitals (`ᴏ`, `ʙ`), letters with a
hook, stroke or bar (`ɓ`, `ƀ`, `ł`) that Unicode does not decompose into the letter and a mark."""


@lru_cache(maxsize=4096)
def _letter(ch: str) -> str:
    """`ch` as the skeleton writes it: its prototype in Unicode's confusables data, else the plain
    letter a Latin variant is drawn from, else itself."""
    if ch in PROTOTYPES:
        return PROTOTYPES[ch]
    if not ch.isascii():
        variant = _LATIN_VARIANT.fullmatch(unicodedata.name(ch, ""))
        if variant:
            return variant.group(1).lower()
    return ch


LOOK_ALIKES = str.maketrans({"0": "o", "1": "l", "i": "l", "|": "l", "5": "s", "$": "s"})
"""Troupe's own additions to Unicode's data, for names: digits that read as letters, and `i`, which
shares a skeleton with `l` and `1` (`al1ce`, `aiice` and `alice` are one name to a reader)."""

MULTI = (("rn", "m"), ("vv", "w"), ("cl", "d"))
"""Letter pairs that read as one letter in many fonts."""

COMPATIBLE_SCRIPTS = ({"CJK", "HIRAGANA", "KATAKANA"}, {"CJK", "HANGUL"})
"""Scripts that are written together (Japanese, Korean): not mixing."""


def skeleton(name: str) -> str:
    """What `name` looks like: two names with one skeleton are confusable. Unicode compatibility
    folding (NFKC), then each character to its prototype (`_letter`), case folded, accents dropped,
    twice (a character's lower case may have a prototype of its own), then Troupe's additions."""
    out = unicodedata.normalize("NFKC", name)
    for _ in range(2):
        mapped = "".join(_letter(ch) for ch in unicodedata.normalize("NFD", out)).casefold()
        out = "".join(ch for ch in unicodedata.normalize("NFD", mapped) if not unicodedata.combining(ch))
    out = out.translate(LOOK_ALIKES)
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

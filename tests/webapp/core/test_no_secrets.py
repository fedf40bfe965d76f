"""No secret in the repository: the tracked tree holds no private key, no hard-coded Django
SECRET_KEY (only the debug-only fallback, which Django itself flags as insecure), no cloud or
hub tokens, and no .env file."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

PATTERNS = {
    "private key": re.compile(r"-----BEGIN (?:RSA |EC |DSA |OPENSSH |ENCRYPTED |PGP )?PRIVATE KEY( BLOCK)?-----"),
    "hard-coded SECRET_KEY": re.compile(r"""SECRET_KEY\s*[:=]\s*["'](?!django-insecure-)[^"'\s]{8,}["'](?!\s*\+)"""),
    "AWS access key": re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    "GitHub token": re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,}\b"),
    "Hugging Face token": re.compile(r"\bhf_[A-Za-z0-9]{30,}\b"),
    "Slack token": re.compile(r"\bxox[abpr]-[A-Za-z0-9-]{10,}\b"),
    "password in a URL": re.compile(r"\b(?:postgres|postgresql|redis|rediss|amqp)://[^:/\s\"']+:(?![$<{])[^@\s\"']{6,}@"),
}


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [REPO / name for name in out.decode().split("\0") if name]


def test_the_tree_holds_no_secret():
    found = []
    for path in tracked_files():
        if not path.is_file() or path.stat().st_size > 2_000_000:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for what, pattern in PATTERNS.items():
            for match in pattern.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{path.relative_to(REPO)}:{line}: {what}")
    assert not found, "\n".join(found)


def test_no_env_file_is_tracked():
    names = {p.name for p in tracked_files()}
    assert ".env" not in names
    assert not [p for p in tracked_files() if p.suffix in (".pem", ".key", ".p12", ".pfx") or p.name in ("id_rsa", "id_ed25519")]


def test_the_patterns_catch_what_they_should():
    samples = {  # assembled at run time, so this file does not trip its own test
        "private key": "-----BEGIN OPENSSH " + "PRIVATE KEY-----",
        "hard-coded SECRET_KEY": "SECRET_KEY" + ' = "k8s7d6f5g4h3j2k1l0"',
        "AWS access key": "AKIA" + "ABCDEFGHIJKLMNOP",
        "password in a URL": "postgres://troupe:" + "hunter2secret@db:5432/troupe",
    }
    for what, sample in samples.items():
        assert PATTERNS[what].search(sample), what
    assert not PATTERNS["hard-coded SECRET_KEY"].search('SECRET_KEY = "django-insecure-troupe-local-debug-only"')
    assert not PATTERNS["hard-coded SECRET_KEY"].search('SECRET_KEY="load-bench-" + os.urandom(24).hex()')  # random at run time
    assert not PATTERNS["password in a URL"].search("postgres://troupe:${POSTGRES_PASSWORD:?set it}@postgres:5432/troupe")

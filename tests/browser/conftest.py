"""Browser tests: Debian's Chromium (Playwright) against a real stack (Daphne, a Celery worker,
a private Redis) sharing this test database. Skipped when /usr/bin/chromium is missing.

Personas log in through the login form: their passwords are hashed with PBKDF2 (few iterations),
which the server processes can check (the test settings' MD5 hasher is not theirs)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.contrib.auth.models import User

from tests.faults.plugins import GATE_VAR, HOLD_STEP_VAR
from tests.processes import Processes
from webapp.models import Agent, Dataset, Membership, ModelSource, Team, Topology, TopologyAgent

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
PASSWORD = "correct horse battery"
HELD_ENV = "tests.faults.plugins:HeldMathTool"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.browser)
            item.add_marker(pytest.mark.slow)
            if not Path(CHROMIUM).exists():
                item.add_marker(pytest.mark.skip(reason=f"{CHROMIUM} is missing (apt-get install chromium)"))


@dataclass
class Member:
    user: User
    team: Team
    password: str = PASSWORD


@dataclass
class TinyWorld:
    team: Team
    topology: Topology
    dataset: Dataset


@pytest.fixture
def data_dir(settings: Any, tmp_path: Path) -> Path:
    path = tmp_path / "data"
    path.mkdir()
    settings.TROUPE_DATA_DIR = path
    return path


@pytest.fixture
def alice(transactional_db: None) -> Member:
    team = Team.objects.create(name="Alpha")
    user = User.objects.create(username="alice", password=PBKDF2PasswordHasher().encode(PASSWORD, "browsersalt", iterations=1000))
    Membership.objects.create(team=team, user=user, role=Membership.Role.ADMIN)
    return Member(user=user, team=team)


@pytest.fixture
def tiny_world(alice: Member) -> TinyWorld:
    """A two-agent math_tool topology on the tiny random model (seconds per step on a CPU)."""
    return make_tiny_world(alice.team, "math_tool")


@pytest.fixture
def held_world(alice: Member) -> TinyWorld:
    """`tiny_world` whose runs hold at the start of their step 2 until the test opens the gate
    (`held_stack`'s `open_gate`): `tests.faults.plugins:HeldMathTool`, math_tool otherwise."""
    return make_tiny_world(alice.team, HELD_ENV)


def make_tiny_world(team: Team, environment: str) -> TinyWorld:
    model = ModelSource.objects.create(team=team, name="Tiny random Llama", source="tiny-random:llama")
    tool = Agent.objects.create(team=team, name="tool", role="tool", model_source=model, tools=["python"],
                                instructions="Write one ```python block that prints the answer.")
    reasoner = Agent.objects.create(team=team, name="reasoner", role="reasoner", model_source=model,
                                    instructions="Answer with the number only.")
    topology = Topology.objects.create(team=team, name="math duo (tiny)", environment=environment, env_args={"level": 1},
                                       specialization="lora", max_turns=2)
    TopologyAgent.objects.create(topology=topology, agent=tool, position=1)
    TopologyAgent.objects.create(topology=topology, agent=reasoner, position=2)
    dataset = Dataset.objects.create(team=team, name="math L1", kind=Dataset.Kind.GENERATOR, environment=environment,
                                     env_args={"level": 1}, size=32, eval_size=8, row_count=40, schema=["question", "answer"])
    return TinyWorld(team=team, topology=topology, dataset=dataset)


@pytest.fixture
def stack(data_dir: Path, tmp_path: Path, transactional_db: None) -> Iterator[Processes]:
    """Daphne, its Redis and a worker."""
    s = Processes(data_dir=data_dir, log_dir=tmp_path).start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def held_stack(data_dir: Path, tmp_path: Path, transactional_db: None) -> Iterator[Processes]:
    """`stack` whose worker holds a `held_world` run at the start of its step 2 until the test calls
    `held_stack.open_gate()`: the page is then certainly watching a run mid-way, however fast the
    machine (its step 1 written, the rest to come)."""
    gate = tmp_path / "gate"
    s = Processes(data_dir=data_dir, log_dir=tmp_path, env={GATE_VAR: str(gate), HOLD_STEP_VAR: "2"}).start()
    s.open_gate = lambda: Path(f"{gate}-step").touch()  # type: ignore[attr-defined]
    try:
        yield s
    finally:
        s.open_gate()  # type: ignore[attr-defined]  # a run still held ends now, not after GATE_WAIT_S
        s.stop()


@pytest.fixture
def web(data_dir: Path, tmp_path: Path, transactional_db: None) -> Iterator[Processes]:
    """Daphne and its Redis, no worker: the pages read what the database already holds."""
    s = Processes(data_dir=data_dir, log_dir=tmp_path).start(worker=False)
    try:
        yield s
    finally:
        s.stop()


def watch_csp(context: Any) -> list[str]:
    """Every Content-Security-Policy violation Chromium reports in this browser context, on any page
    it loads: the `securitypolicyviolation` events (an init script, which the policy does not govern)
    and the "Refused to ..." console errors."""
    violations: list[str] = []

    def report(source: Any, text: str) -> None:
        violations.append(f"{source['frame'].url}: {text}")

    def console(message: Any) -> None:
        if "Content Security Policy" in message.text:
            violations.append(f"{message.location.get('url', '')}: {message.text}")

    context.expose_binding("troupeCspViolation", report)
    context.add_init_script("""document.addEventListener("securitypolicyviolation", function (e) {
      window.troupeCspViolation(e.effectiveDirective + " refused " + (e.blockedURI || "inline") + " at " +
                                e.sourceFile + ":" + e.lineNumber + " " + e.sample);
    });""")
    context.on("console", console)
    return violations


def assert_no_csp_violation(page: Any, violations: list[str]) -> None:
    page.wait_for_timeout(200)  # reports still on their way from the page
    assert not violations, "Content-Security-Policy violations:\n" + "\n".join(dict.fromkeys(violations))


@pytest.fixture
def browser_page(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A Chromium page; the test fails if any page it visits breaks the Content-Security-Policy."""
    from playwright.sync_api import sync_playwright

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # the ORM next to Playwright's event loop
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1440, "height": 1000})
        violations = watch_csp(context)
        page = context.new_page()
        page.set_default_timeout(90_000)  # a safety net: tests wait on events, a loaded machine is slow
        yield page
        assert_no_csp_violation(page, violations)
        browser.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where screenshots go: $TROUPE_SCREENSHOTS if set (kept), else the test's tmp folder."""
    path = Path(os.environ.get("TROUPE_SCREENSHOTS") or tmp_path / "screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path

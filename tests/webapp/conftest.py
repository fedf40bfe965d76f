"""Personas for the web tests: alice (team Alpha, admin) and bob (team Bravo, member), each with
a logged-in client, and `world` helpers that give a team a model, agents, a topology, a dataset
and a run without going through the engine."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from webapp.models import Agent, Dataset, Membership, ModelSource, Run, Team, Topology, TopologyAgent
from webapp.runs import services as run_services


@dataclass
class FakeResult:
    """Shaped like training.trainer.TrainResult (imported here would pull in torch)."""

    status: str
    step: int
    final_metrics: dict[str, float] = field(default_factory=dict)
    checkpoint: str | None = None
    note: str = ""


@dataclass
class Persona:
    user: User
    team: Team
    client: Client


@dataclass
class World:
    """One team's starter objects."""

    source: ModelSource
    tool: Agent
    reasoner: Agent
    topology: Topology
    dataset: Dataset
    run: Run


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    """Rate-limit counters (password resets) live in the cache: each test starts with none."""
    from django.core.cache import cache

    cache.clear()


@pytest.fixture(autouse=True)
def data_dir(settings: Any, tmp_path: Path) -> Path:
    """Uploaded files and run folders go to a fresh folder per test."""
    settings.TROUPE_DATA_DIR = tmp_path
    return tmp_path


def _persona(username: str, team_name: str, role: str) -> Persona:
    team = Team.objects.create(name=team_name)
    user = User.objects.create_user(username, password="password")
    Membership.objects.create(team=team, user=user, role=role)
    client = Client()
    client.force_login(user)
    return Persona(user=user, team=team, client=client)


@pytest.fixture
def alice(db: None) -> Persona:
    return _persona("alice", "Alpha", Membership.Role.ADMIN)


@pytest.fixture
def bob(db: None) -> Persona:
    return _persona("bob", "Bravo", Membership.Role.MEMBER)


def make_world(team: Team, *, source: str = "tiny-random:llama") -> World:
    """Rows straight through the ORM (fast, no environment calls), shaped like the services make them."""
    model = ModelSource.objects.create(team=team, name="Tiny", source=source)
    tool = Agent.objects.create(team=team, name="tool", role="tool", instructions="Write Python.", model_source=model, tools=["python"])
    reasoner = Agent.objects.create(team=team, name="reasoner", role="reasoner", instructions="Answer.", model_source=model)
    topology = Topology.objects.create(team=team, name="duo", environment="math_tool", env_args={"level": 1}, specialization="lora")
    TopologyAgent.objects.create(topology=topology, agent=tool, position=1)
    TopologyAgent.objects.create(topology=topology, agent=reasoner, position=2)
    dataset = Dataset.objects.create(
        team=team, name="gen L1", kind=Dataset.Kind.GENERATOR, environment="math_tool", env_args={"level": 1},
        size=32, eval_size=8, row_count=40, schema=["question", "answer"], preview=[{"question": "1+1?", "answer": "2"}],
    )
    config = run_services.run_config_build(topology=topology, dataset=dataset, name="first", overrides={"optim.steps": 3})
    run = Run.objects.create(team=team, name="first", topology=topology, dataset=dataset, config_yaml=config.to_yaml(), total_steps=3)
    return World(source=model, tool=tool, reasoner=reasoner, topology=topology, dataset=dataset, run=run)


@pytest.fixture
def alice_world(alice: Persona) -> World:
    world = make_world(alice.team)
    Run.objects.filter(pk=world.run.pk).update(owner=alice.user)
    return world


@pytest.fixture
def bob_world(bob: Persona) -> World:
    return make_world(bob.team)


@pytest.fixture
def math_tool() -> Any:
    from agents.envs import load_environment

    return load_environment("math_tool", level=1)


@pytest.fixture
def good_rows(math_tool: Any) -> list[dict[str, Any]]:
    return math_tool.generate(6, seed=0)


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@pytest.fixture
def enqueued(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Run ids sent to the queue (the Celery call is replaced; nothing leaves the process)."""
    sent: list[int] = []
    from webapp.core import enqueue

    monkeypatch.setattr(enqueue.current_app, "send_task",
                        lambda name, args, **kw: sent.append(args[0]) if name == enqueue.RUN_EXECUTE else None)
    return sent


@pytest.fixture
def jobs_sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """(task name, job id) of the jobs sent to the queue (webapp/jobs/services.py; nothing leaves the process)."""
    sent: list[tuple[str, int]] = []
    from webapp.core import enqueue

    monkeypatch.setattr(enqueue.current_app, "send_task",
                        lambda name, args, **kw: sent.append((name.rsplit(".", 1)[1], args[0])) if name != enqueue.RUN_EXECUTE else None)
    return sent

"""Every URL in the URL map, and every websocket route, requires login and enforces team
isolation. The test walks `get_resolver().url_patterns` (new URLs are covered without editing it):

- anonymous: pages redirect to the login page, the admin to its login, the bearer-token API
  answers 401, websockets are closed; only login, /healthz, /favicon.ico and static files are open;
- alice (team Alpha) with bob's (team Bravo) object ids in every path parameter: 404 (or 405 for
  a method the view never accepts), on the API with alice's own token too; bob himself is served
  (so the 404 is isolation, not a bad test URL); websockets are closed for alice, open for bob.

Bob's objects all have the primary key 4242 (and his checkpoint the step 4242), so one value fills
every path parameter whatever object it names."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.contrib.contenttypes.models import ContentType
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.urls.resolvers import RoutePattern

from webapp.models import (
    Agent,
    Checkpoint,
    Dataset,
    Evaluation,
    LogLine,
    Membership,
    MetricPoint,
    ModelSource,
    Rollout,
    Run,
    Topology,
    TopologyAgent,
)
from webapp.runs.routing import websocket_urlpatterns

PK = 4242
OPEN = {"login", "healthz", "favicon", "password_reset", "password_reset_done", "password_reset_confirm", "password_reset_complete",
        "invitation_accept", "api_openapi"}
"""URL names anyone may fetch (static files are served by WhiteNoise, outside the URL map; the API's
OpenAPI document describes the endpoints and holds no data)."""
NOT_TEAM_OBJECTS = {"password_reset_confirm", "invitation_accept"}
"""URLs whose parameters name no team's object (a reset link's user id and token, an invitation's token)."""
TEXT_VALUES = {"name": "tool", "direction": "up", "app_label": "webapp", "url": "nothing/here/", "object_id": str(PK)}


@dataclass(frozen=True)
class Url:
    name: str
    path: str
    params: tuple[str, ...]
    admin: bool
    api: bool


def _walk(patterns: list[Any], prefix: str = "", namespace: str = "") -> Iterator[tuple[str, str, Any]]:
    for p in patterns:
        if isinstance(p, URLResolver):
            ns = f"{namespace}{p.namespace}:" if p.namespace else namespace
            yield from _walk(p.url_patterns, prefix + _source(p.pattern), ns)
        elif isinstance(p, URLPattern):
            yield f"{namespace}{p.name or '(unnamed)'}", prefix + _source(p.pattern), p.pattern


def _source(pattern: Any) -> str:
    if isinstance(pattern, RoutePattern):
        return str(pattern)
    return str(pattern.regex.pattern).lstrip("^").rstrip("$").replace("\\Z", "")


def _fill(source: str, content_type_id: int) -> tuple[str, tuple[str, ...]]:
    """A concrete path: route converters and regex groups replaced by bob's values."""
    params: list[str] = []

    def value(name: str, kind: str = "") -> str:
        params.append(name)
        if name == "content_type_id":
            return str(content_type_id)
        if name in TEXT_VALUES and not (kind == "int" and name != "object_id"):
            return TEXT_VALUES[name]
        return str(PK)

    path = re.sub(r"\(\?P<(\w+)>[^()]*(?:\([^()]*\)[^()]*)*\)", lambda m: value(m.group(1)), source)
    path = re.sub(r"<(?:(\w+):)?(\w+)>", lambda m: value(m.group(2), m.group(1) or ""), path)
    path = path.replace("\\.", ".").replace("\\/", "/")
    return "/" + path, tuple(params)


def all_urls() -> list[Url]:
    ct = ContentType.objects.get_for_model(Run).pk
    urls = []
    for name, source, _ in _walk(get_resolver().url_patterns):
        path, params = _fill(source, ct)
        urls.append(Url(name=name, path=path, params=params, admin=name.startswith("admin:"), api=path.startswith("/api/")))
    return urls


def bravo_objects(team, user, data_dir) -> None:
    """Bob's world, every object with the primary key 4242."""
    source = ModelSource.objects.create(pk=PK, team=team, name="Tiny", source="tiny-random:llama")
    tool = Agent.objects.create(pk=PK, team=team, name="tool", role="tool", model_source=source)
    reasoner = Agent.objects.create(team=team, name="reasoner", role="reasoner", model_source=source)
    topology = Topology.objects.create(pk=PK, team=team, name="duo", environment="math_tool", env_args={"level": 1})
    TopologyAgent.objects.create(topology=topology, agent=tool, position=1)
    TopologyAgent.objects.create(topology=topology, agent=reasoner, position=2)
    dataset = Dataset.objects.create(pk=PK, team=team, name="gen", kind=Dataset.Kind.GENERATOR, environment="math_tool",
                                     env_args={"level": 1}, size=8, eval_size=2, row_count=10)
    from webapp.runs import services as run_services

    config = run_services.run_config_build(topology=topology, dataset=dataset, name="secret", overrides={"optim.steps": 2})
    run = Run.objects.create(pk=PK, team=team, owner=user, name="bravo secret", topology=topology, dataset=dataset,
                             config_yaml=config.to_yaml(), status=Run.Status.QUEUED, total_steps=2)
    from training.experiment import ExperimentSpec
    from webapp.models import Experiment

    experiment = Experiment.objects.create(pk=PK, team=team, owner=user, name="bravo secret", topology=topology, dataset=dataset,
                                           spec_yaml=ExperimentSpec(name="bravo", base=config).to_yaml(), trial_count=1)
    Run.objects.filter(pk=PK).update(experiment=experiment, trial_index=0)
    folder = data_dir / "runs" / str(PK) / "checkpoints" / f"step-{PK:06d}"
    (folder / "tool").mkdir(parents=True)
    (folder / "tool" / "adapter_config.json").write_text("{}")
    Checkpoint.objects.create(pk=PK, run=run, step=PK, path=str(folder))
    MetricPoint.objects.create(run=run, step=1, values={"loss": 1.0}, time=run.created)
    Rollout.objects.create(pk=PK, run=run, step=1, episode=0, data={"turns": []})
    Evaluation.objects.create(pk=PK, run=run, step=1, team_success=0.5)
    LogLine.objects.create(pk=PK, run=run, message="bravo log")
    from webapp.models import Grader, Task

    Grader.objects.create(pk=PK, team=team, name="secret-grader", kind="exact")
    Task.objects.create(pk=PK, team=team, name="secret-task", roles=[{"name": "a", "prompt": "x", "grader": "secret-grader"}])
    # a second member of Bravo, whose membership has the shared id (the member pages' object)
    Membership.objects.create(pk=PK, team=team, user=User.objects.create_user("bravo-2", password="password"))
    try:
        from webapp.models import Job
    except ImportError:
        return
    Job.objects.create(pk=PK, team=team, owner=user, kind="playground", status="succeeded", params={"row": {"question": "1+1?"}})
    Job.objects.create(pk=PK + 1, team=team, owner=user, kind="merge", status="succeeded", run=run)
    try:
        from webapp.teams.services import api_token_create
    except ImportError:
        return
    token, _ = api_token_create(user=user, team=team, name="bob's")
    type(token).objects.filter(pk=token.pk).update(id=PK)


@pytest.fixture
def bravo(bob, data_dir):
    bravo_objects(bob.team, bob.user, data_dir)
    return bob


def alice_token(alice) -> str | None:
    try:
        from webapp.teams.services import api_token_create
    except ImportError:
        return None
    return api_token_create(user=alice.user, team=alice.team, name="alice's")[1]


def test_the_walk_finds_the_url_map(db):
    names = {u.name for u in all_urls()}
    assert {"dashboard", "run_detail", "run_cancel", "worker_list", "healthz", "admin:index"} <= names
    detail = next(u for u in all_urls() if u.name == "run_detail")
    assert detail.path == f"/runs/{PK}/"


def test_anonymous_visitors_are_sent_to_login_everywhere(bravo):
    anonymous = Client()
    for url in all_urls():
        for method in ("get", "post"):
            response = getattr(anonymous, method)(url.path)
            where = f"{method.upper()} {url.path} ({url.name})"
            if url.name in OPEN or url.name == "logout":
                continue  # logging in, health checks and logging out need no login
            if url.api:
                assert response.status_code == 401, where
            elif url.admin:
                if url.name in ("admin:login", "admin:logout"):
                    continue
                assert response.status_code in (302, 404), where
                if response.status_code == 302:
                    assert response["Location"].startswith(("/login/?next=", "/admin/login/")), where
            else:
                assert response.status_code == 302, f"{where}: {response.status_code}"
                assert response["Location"].startswith("/login/?next="), where


def test_another_teams_object_ids_are_404_everywhere(alice, alice_world, bravo):
    token = alice_token(alice)
    checked = 0
    for url in all_urls():
        if not url.params or url.admin or url.name in NOT_TEAM_OBJECTS:
            continue
        where = f"{url.path} ({url.name})"
        if url.api:
            if token is None:
                continue
            statuses = [alice.client.generic(m, url.path, headers={"Authorization": f"Bearer {token}"}).status_code
                        for m in ("GET", "POST", "PATCH", "DELETE")]  # some routes take only PATCH or DELETE
        else:
            statuses = [alice.client.get(url.path).status_code, alice.client.post(url.path, {"name": "x"}).status_code]
        assert set(statuses) <= {404, 405} and 404 in statuses, f"{where}: alice got {statuses}"
        checked += 1
    assert checked >= 20
    run = Run.objects.get(pk=PK)
    assert run.status == Run.Status.QUEUED and not run.cancel_requested  # nothing alice posted changed bob's run
    assert Agent.objects.filter(pk=PK, name="tool").exists() and Topology.objects.filter(pk=PK, name="duo").exists()


def test_bob_is_served_the_same_urls(bravo):
    """So the 404s above are isolation, not URLs that point at nothing."""
    served = 0
    for url in all_urls():
        if not url.params or url.admin or url.api or set(url.params) - {"pk"}:
            continue
        status = bravo.client.get(url.path).status_code
        # 403: a URL for the team's admins (bob is a member): it exists, and refuses him
        assert status in (200, 302, 403, 405), f"{url.path} ({url.name}): bob got {status}"
        served += 1
    assert served >= 10


def test_non_staff_users_never_reach_the_admin(alice, bravo):
    for url in all_urls():
        if url.admin and url.name not in ("admin:login", "admin:logout"):
            response = alice.client.get(url.path)
            assert response.status_code in (302, 404), url.path
            if response.status_code == 302:
                assert response["Location"].startswith(("/login/?next=", "/admin/login/")), url.path


def _connect(user, path: str) -> bool:
    async def go() -> bool:
        communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
        if user is not None:
            communicator.scope["user"] = user
        connected, _ = await communicator.connect(timeout=30)  # the consumer's checks read the database: a hang's bound, not 1 s
        if connected:
            await communicator.disconnect(timeout=30)
        return connected

    return async_to_sync(go)()


@pytest.mark.django_db(transaction=True)
def test_every_websocket_refuses_anonymous_and_other_teams(alice, bob, tmp_path):
    from django.contrib.auth.models import AnonymousUser

    bravo_objects(bob.team, bob.user, tmp_path)
    routes = list(_walk(websocket_urlpatterns))
    assert routes
    for _name, source, _ in routes:
        path, _ = _fill(source, 0)
        assert not _connect(AnonymousUser(), path), path
        assert not _connect(None, path), path
        assert not _connect(alice.user, path), path
        assert _connect(bob.user, path), path

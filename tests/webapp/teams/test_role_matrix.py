"""Who may do what, for each role: every members, invitations, audit and account URL, and the
actions kept for team admins (deleting checkpoints and exports, moving queued runs), tried by

- anonymous: a visitor who is not logged in;
- outsider: bob, a member of another team (Bravo), aiming at team Alpha's objects;
- member: carl, a plain member of Alpha;
- admin: alice, an admin of Alpha;
- superuser: root, a site superuser who is a plain member of Alpha (site staff act as admins of
  the teams they are in; a superuser in no team sees no team's pages, below).

Each case starts from the same world and checks both the answer and whether the action took
effect: a refused action changes nothing. `test_the_matrix_covers_every_team_url` fails when a
URL of the members, audit or account pages is added without a row here."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import get_resolver, reverse

from tests.webapp.conftest import make_world
from webapp.models import ApiToken, AuditEvent, Checkpoint, Invitation, Job, Membership, Run, Team
from webapp.teams import services as teams

ROLES = ("anonymous", "outsider", "member", "admin", "superuser")
ADMINS = {"admin", "superuser"}
EVERYONE_LOGGED_IN = {"outsider", "member", "admin", "superuser"}
ALPHA = {"member", "admin", "superuser"}


@dataclass
class World:
    alpha: Team
    bravo: Team
    clients: dict[str, Client]
    users: dict[str, User]
    dora: Membership
    run: Run
    queued: list[Run]
    checkpoint: Checkpoint
    export: Job
    invitation: Invitation
    invitation_token: str
    token: ApiToken


def _client(user: User | None) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


@pytest.fixture
def world(db, data_dir: Path) -> World:
    alpha, bravo = Team.objects.create(name="Alpha"), Team.objects.create(name="Bravo")
    users = {
        "outsider": User.objects.create_user("bob", password="password"),
        "member": User.objects.create_user("carl", password="password"),
        "admin": User.objects.create_user("alice", password="password"),
        "superuser": User.objects.create_superuser("root", password="password"),
    }
    Membership.objects.create(team=bravo, user=users["outsider"], role="admin")  # an admin, but of another team
    Membership.objects.create(team=alpha, user=users["member"], role="member")
    Membership.objects.create(team=alpha, user=users["admin"], role="admin")
    Membership.objects.create(team=alpha, user=users["superuser"], role="member")
    dora = Membership.objects.create(team=alpha, user=User.objects.create_user("dora", password="password"), role="member")

    objects = make_world(alpha)
    run = objects.run
    out = data_dir / "runs" / str(run.pk)
    Run.objects.filter(pk=run.pk).update(status="succeeded", out_dir=str(out))
    checkpoints = []
    for step in (2, 4):
        folder = out / "checkpoints" / f"step-{step:06d}"
        (folder / "tool").mkdir(parents=True)
        (folder / "tool" / "adapter_config.json").write_text("{}")
        checkpoints.append(Checkpoint.objects.create(run=run, step=step, path=str(folder)))
    export_dir = data_dir / "exports" / str(alpha.pk) / "merge-1"
    export_dir.mkdir(parents=True)
    export = Job.objects.create(team=alpha, kind="merge", status="succeeded", run=run, checkpoint=checkpoints[1],
                                params={"agent": "tool", "checkpoint_step": 4}, output=str(export_dir))
    queued = [Run.objects.create(team=alpha, name=f"queued {i}", config_yaml=run.config_yaml, status="queued", queue_order=i)
              for i in (1, 2)]
    invitation, link = teams.invitation_create(team=alpha, by=users["admin"], role="member", link_for=lambda t: t)
    token, _ = teams.api_token_create(user=users["admin"], team=alpha, name="alice's laptop")
    clients = {"anonymous": _client(None), **{role: _client(user) for role, user in users.items()}}
    return World(alpha=alpha, bravo=bravo, clients=clients, users=users, dora=dora, run=run, queued=queued,
                 checkpoint=checkpoints[0], export=export, invitation=invitation, invitation_token=link, token=token)


@dataclass(frozen=True)
class Action:
    """One request, who may make it, and how to tell that it took effect."""

    url: str
    do: Callable[[Client, World], Any]
    allowed: frozenset[str]
    took_effect: Callable[[World], bool] | None = None
    refused: dict[str, int] | None = None
    """The answer to each role not allowed, where it is not the usual one (anonymous: to the login
    page; outsider: 404, the object is not in their team; member: 403)."""
    ok: tuple[int, ...] = (200, 302)


def _alpha_page_shows_alpha(response: Any) -> bool:
    return "Members of Alpha" in response.content.decode() or "Audit trail of Alpha" in response.content.decode()


ACTIONS: dict[str, Action] = {
    # -- the members page and its actions -------------------------------------------------------
    "see the members": Action(
        "team_members", lambda c, w: c.get(reverse("team_members")), frozenset(ALPHA),
        refused={"outsider": 200},  # bob sees his own team's members, never Alpha's (checked below)
    ),
    "invite someone": Action(
        "team_invite", lambda c, w: c.post(reverse("team_invite"), {"email": "", "role": "member"}), frozenset(ADMINS),
        took_effect=lambda w: Invitation.objects.filter(team=w.alpha).count() == 2,
        refused={"outsider": 302},  # bob is an admin of Bravo: his invitation is to Bravo (checked below)
    ),
    "revoke an invitation": Action(
        "team_invitation_revoke", lambda c, w: c.post(reverse("team_invitation_revoke", args=[w.invitation.pk])), frozenset(ADMINS),
        took_effect=lambda w: Invitation.objects.get(pk=w.invitation.pk).revoked is not None,
    ),
    "change a role": Action(
        "team_member_role", lambda c, w: c.post(reverse("team_member_role", args=[w.dora.pk]), {"role": "admin"}), frozenset(ADMINS),
        took_effect=lambda w: Membership.objects.get(pk=w.dora.pk).role == "admin",
    ),
    "see what removing a member means": Action(
        "team_member_remove", lambda c, w: c.get(reverse("team_member_remove", args=[w.dora.pk])), frozenset(ADMINS),
    ),
    "remove a member": Action(
        "team_member_remove", lambda c, w: c.post(reverse("team_member_remove", args=[w.dora.pk])), frozenset(ADMINS),
        took_effect=lambda w: not Membership.objects.filter(pk=w.dora.pk).exists(),
    ),
    "leave the team": Action(  # each tries to remove themselves: members may leave; bob is not in Alpha
        "team_member_remove", lambda c, w: c.post(reverse("team_member_remove", args=[_own_membership(c, w)])),
        frozenset({"member", "superuser"}), took_effect=lambda w: Membership.objects.filter(team=w.alpha).count() < 4,
        refused={"admin": 200},  # Alpha's only admin: the page says to make someone else an admin first
    ),
    "switch to the team": Action(
        "team_switch", lambda c, w: c.post(reverse("team_switch"), {"team": w.alpha.pk}), frozenset(ALPHA),
    ),
    # -- the audit trail ------------------------------------------------------------------------
    "read the audit trail": Action(
        "team_audit", lambda c, w: c.get(reverse("team_audit")), frozenset(ADMINS), refused={"outsider": 200},
        # bob is an admin of Bravo: he reads Bravo's trail, never Alpha's (checked below)
    ),
    # -- invitations, as the invited person -----------------------------------------------------
    "open an invitation link": Action(
        "invitation_accept", lambda c, w: c.get(reverse("invitation_accept", args=[w.invitation_token])),
        frozenset({"anonymous", *EVERYONE_LOGGED_IN}), ok=(200,),
    ),
    "join through an invitation": Action(
        "invitation_accept",
        lambda c, w: c.post(reverse("invitation_accept", args=[w.invitation_token]),
                            {"username": "erin", "password1": "a long pass phrase", "password2": "a long pass phrase"}),
        frozenset({"anonymous", "outsider"}),  # a newcomer makes an account; bob joins with his; Alpha's own are in already
        took_effect=lambda w: Invitation.objects.get(pk=w.invitation.pk).accepted is not None,
        refused={"member": 200, "admin": 200, "superuser": 200},  # "You are already in Alpha."
    ),
    # -- a member's own account -----------------------------------------------------------------
    "change their password": Action(
        "password_change", lambda c, w: c.get(reverse("password_change")), frozenset(EVERYONE_LOGGED_IN), ok=(200,),
    ),
    "ask for a password reset": Action(
        "password_reset", lambda c, w: c.post(reverse("password_reset"), {"email": "nobody@example.org"}),
        frozenset({"anonymous", *EVERYONE_LOGGED_IN}), ok=(302,),
    ),
    "list their API tokens": Action(
        "api_tokens", lambda c, w: c.get(reverse("api_tokens")), frozenset(EVERYONE_LOGGED_IN), ok=(200,),
    ),
    "revoke alice's API token": Action(
        "api_token_revoke", lambda c, w: c.post(reverse("api_token_revoke", args=[w.token.pk])), frozenset({"admin"}),
        took_effect=lambda w: ApiToken.objects.get(pk=w.token.pk).revoked is not None,
        refused={"member": 404, "superuser": 404},  # a token is its owner's alone, whatever the role
    ),
    # -- actions kept for team admins -----------------------------------------------------------
    "delete an older checkpoint": Action(
        "run_checkpoint_delete", lambda c, w: c.post(reverse("run_checkpoint_delete", args=[w.run.pk, w.checkpoint.step])),
        frozenset(ADMINS), took_effect=lambda w: Checkpoint.objects.get(pk=w.checkpoint.pk).deleted is not None,
    ),
    "delete a merged export": Action(
        "run_export_delete", lambda c, w: c.post(reverse("run_export_delete", args=[w.run.pk, w.export.pk])),
        frozenset(ADMINS), took_effect=lambda w: Job.objects.get(pk=w.export.pk).output == "",
    ),
    "move a queued run up": Action(
        "run_queue_move", lambda c, w: c.post(reverse("run_queue_move", args=[w.queued[1].pk, "up"])),
        frozenset(ADMINS), took_effect=lambda w: list(Run.objects.filter(status="queued").order_by(*Run.QUEUE_ORDER)) == w.queued[::-1],
    ),
    # -- the site's settings: the admin -----------------------------------------------------------
    "open the admin": Action(
        "admin:index", lambda c, w: c.get(reverse("admin:index")), frozenset({"superuser"}), ok=(200,),
        refused={"outsider": 302, "member": 302, "admin": 302},  # to the admin's login
    ),
    "create a team": Action(
        "admin:webapp_team_add",
        lambda c, w: c.post(reverse("admin:webapp_team_add"), {
            "name": "Charlie", "created_0": "2026-01-01", "created_1": "00:00:00",
            **{f"memberships-{k}": v for k, v in {"TOTAL_FORMS": 0, "INITIAL_FORMS": 0, "MIN_NUM_FORMS": 0, "MAX_NUM_FORMS": 1000}.items()}}),
        frozenset({"superuser"}), took_effect=lambda w: Team.objects.filter(name="Charlie").exists(),
        refused={"outsider": 302, "member": 302, "admin": 302}, ok=(302,),
    ),
}


def _own_membership(client: Client, world: World) -> int:
    user = next((u for u in world.users.values() if str(u.pk) == client.session.get("_auth_user_id")), None)
    membership = Membership.objects.filter(team=world.alpha, user=user).first()
    return membership.pk if membership else world.dora.pk  # bob has none in Alpha: he tries dora's


def _expected_refusal(action: Action, role: str) -> int:
    if action.refused and role in action.refused:
        return action.refused[role]
    return {"anonymous": 302, "outsider": 404, "member": 403}[role]


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("name", list(ACTIONS))
def test_each_role_may_do_only_what_it_is_allowed(world: World, name: str, role: str):
    action = ACTIONS[name]
    response = action.do(world.clients[role], world)
    allowed = role in action.allowed
    where = f"{role} tried to {name}"
    if allowed:
        assert response.status_code in action.ok, f"{where}: {response.status_code}"
    else:
        assert response.status_code == _expected_refusal(action, role), f"{where}: {response.status_code}"
        if role == "anonymous":
            assert re.match(r"^/(admin/)?login/", response["Location"]), where
    if action.took_effect is not None:
        assert action.took_effect(world) is allowed, f"{where}: effect {'missing' if allowed else 'happened'}"
    if not allowed and role == "outsider" and response.status_code == 200:
        assert not _alpha_page_shows_alpha(response), where  # bob's own team's page, never Alpha's


def test_an_outsider_admin_invites_to_their_own_team_only(world: World):
    world.clients["outsider"].post(reverse("team_invite"), {"email": "", "role": "member"})
    assert Invitation.objects.filter(team=world.bravo).count() == 1 and Invitation.objects.filter(team=world.alpha).count() == 1


def test_refused_actions_leave_no_audit_event(world: World):
    before = AuditEvent.objects.count()
    for name in ("invite someone", "revoke an invitation", "change a role", "remove a member",
                 "delete an older checkpoint", "delete a merged export"):
        ACTIONS[name].do(world.clients["member"], world)
    assert AuditEvent.objects.count() == before
    ACTIONS["change a role"].do(world.clients["admin"], world)
    assert AuditEvent.objects.count() == before + 1


def test_a_superuser_in_no_team_sees_no_teams_pages_but_runs_the_site(world: World):
    Membership.objects.filter(user=world.users["superuser"]).delete()
    root = world.clients["superuser"]
    for url in (reverse("team_members"), reverse("team_audit"), reverse("run_detail", args=[world.run.pk])):
        response = root.get(url)
        assert response.status_code == 403 and "not in a team" in response.content.decode().lower(), url
    assert root.get(reverse("admin:webapp_team_changelist")).status_code == 200


def test_the_matrix_covers_every_team_url(db):
    """Every URL of webapp/teams/views.py and Django's account views is in the matrix (or named
    here as tested elsewhere, with why)."""
    elsewhere = {
        "login": "test_login_throttle.py, test_login_required.py",
        "logout": "logging out needs no permission",
        "password_change_done": "a static page after the change",
        "password_reset_done": "a static page after the request",
        "password_reset_confirm": "test_password_change_and_reset.py (the emailed link)",
        "password_reset_complete": "a static page after the reset",
    }
    names = {p.name for p in get_resolver().url_patterns if getattr(p, "name", None)
             and (p.callback.__module__ == "webapp.teams.views" or p.callback.__module__.startswith("django.contrib.auth"))}
    covered = {a.url for a in ACTIONS.values()}
    assert names - covered - set(elsewhere) == set()

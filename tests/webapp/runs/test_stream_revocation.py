"""Authorization holds for an open run socket's whole life, not only at connect (issue 31, class 4):
a member removed from the team who then logged out still received 44 messages over 24 s.

Removal, logout, a role change and a password change close the user's sockets at once (removal,
role and password with "reconnect", after which the page is authorized afresh); what no service
sees (a session deleted or expired, a membership deleted in the admin) is caught by the socket's
own re-check before it sends."""

from __future__ import annotations

import pytest
from channels.layers import get_channel_layer
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.test import Client
from django.urls import reverse

from tests.webapp.streams import TRANSACTIONAL, orm, receive_backlog, receive_until, run, socket
from webapp.core import sockets
from webapp.models import Membership
from webapp.runs.consumers import RunConsumer
from webapp.runs.publish import run_group
from webapp.teams import services as teams

pytestmark = TRANSACTIONAL
PASSWORD = "carols long passphrase 1"


@pytest.fixture
def carol(alice):
    user = User.objects.create_user("carol", password=PASSWORD)
    membership = Membership.objects.create(team=alice.team, user=user, role=Membership.Role.MEMBER)
    client = Client()
    client.force_login(user)
    return user, membership, client


async def _open(run_id: int, client: Client):
    ws = socket(run_id, client)
    connected, _ = await ws.connect()
    assert connected
    await receive_backlog(ws)  # the backlog
    return ws


async def _closed_with(ws) -> int:
    """The close code, once the socket closes (what the backlog still had in flight may come first)."""
    while True:
        message = await ws.receive_output(timeout=10)
        if message["type"] == "websocket.close":
            return message["code"]
        assert message["type"] == "websocket.send", message


async def _event(run_id: int) -> None:
    await get_channel_layer().group_send(run_group(run_id), {"type": "run.event", "event": "heartbeat", "payload": {}})


def test_removal_from_the_team_closes_the_socket_and_a_reconnect_is_refused(alice_world, carol):
    user, membership, client = carol

    async def scenario():
        ws = await _open(alice_world.run.pk, client)
        await orm(lambda: teams.membership_remove(membership=membership, actor=None))
        assert await _closed_with(ws) == sockets.RECONNECT
        again = socket(alice_world.run.pk, client)
        connected, code = await again.connect()
        assert not connected and code == 4403

    run(scenario)


def test_logout_closes_the_socket_for_good(alice_world, carol):
    _, _, client = carol

    async def scenario():
        ws = await _open(alice_world.run.pk, client)
        cookie = client.cookies["sessionid"].value
        response = await orm(lambda: client.post(reverse("logout")))
        assert response.status_code == 302
        assert await _closed_with(ws) == sockets.GONE
        client.cookies["sessionid"] = cookie  # the old cookie no longer opens anything
        connected, _ = await socket(alice_world.run.pk, client).connect()
        assert not connected

    run(scenario)


def test_a_role_change_makes_the_socket_reconnect_and_it_is_let_back_in(alice, alice_world, carol):
    _, membership, client = carol

    async def scenario():
        ws = await _open(alice_world.run.pk, client)
        await orm(lambda: teams.membership_set_role(membership=membership, role=Membership.Role.ADMIN, actor=alice.user))
        assert await _closed_with(ws) == sockets.RECONNECT
        ws = await _open(alice_world.run.pk, client)  # still a member: authorized afresh
        await ws.disconnect()

    run(scenario)


def test_a_password_change_ends_the_other_sessions_sockets(alice_world, carol):
    user, _, client = carol
    other = Client()
    other.force_login(user)

    async def scenario():
        ws = await _open(alice_world.run.pk, other)
        response = await orm(lambda: client.post(reverse("password_change"), {
            "old_password": PASSWORD, "new_password1": "a new long passphrase 9", "new_password2": "a new long passphrase 9"}))
        assert response.status_code == 302
        assert await _closed_with(ws) == sockets.RECONNECT
        connected, _ = await socket(alice_world.run.pk, other).connect()
        assert not connected  # that session ended with the old password
        mine = await _open(alice_world.run.pk, client)  # the session that changed it carries on
        await mine.disconnect()

    run(scenario)


@pytest.mark.parametrize("change", ["session deleted", "membership deleted", "password set elsewhere", "deactivated"])
def test_the_socket_checks_again_before_it_sends(alice_world, carol, monkeypatch, change):
    """Changes no service announces (the admin, `changepassword`, an expired session)."""
    user, membership, client = carol
    monkeypatch.setattr(RunConsumer, "RECHECK_SECONDS", 0.0)

    def revoke() -> None:
        if change == "session deleted":
            Session.objects.all().delete()
        elif change == "membership deleted":
            Membership.objects.filter(pk=membership.pk).delete()
        elif change == "password set elsewhere":
            user.set_password("set by the operator 1234")
            user.save()
        else:
            User.objects.filter(pk=user.pk).update(is_active=False)

    async def scenario():
        ws = await _open(alice_world.run.pk, client)
        await orm(revoke)
        await _event(alice_world.run.pk)
        assert await _closed_with(ws) == sockets.GONE

    run(scenario)


def test_a_socket_still_allowed_keeps_receiving(alice_world, carol, monkeypatch):
    _, _, client = carol
    monkeypatch.setattr(RunConsumer, "RECHECK_SECONDS", 0.0)

    async def scenario():
        ws = await _open(alice_world.run.pk, client)
        await ws.send_json_to({"t": "ping"})
        assert (await receive_until(ws, "pong"))[-1] == {"t": "pong"}
        await ws.disconnect()

    run(scenario)

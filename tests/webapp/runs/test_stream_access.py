"""The run socket is for the run's team only: anonymous and other-team sockets are closed before
any data is sent (the handshake never completes)."""

from __future__ import annotations

from django.test import Client

from tests.webapp.streams import TRANSACTIONAL, receive_backlog, run, socket

pytestmark = TRANSACTIONAL


def test_it_closes_an_anonymous_socket_before_sending_anything(alice_world):
    async def scenario():
        ws = socket(alice_world.run.pk, None)
        connected, code = await ws.connect()
        assert not connected and code == 4403
        assert await ws.receive_nothing()
        await ws.wait()

    run(scenario)


def test_it_closes_a_socket_from_another_team_before_sending_anything(alice_world, bob):
    async def scenario():
        ws = socket(alice_world.run.pk, bob.client)
        connected, code = await ws.connect()
        assert not connected and code == 4403
        assert await ws.receive_nothing()
        await ws.wait()

    run(scenario)


def test_it_closes_a_socket_for_a_run_that_does_not_exist(alice):
    async def scenario():
        connected, _ = await socket(99999, alice.client).connect()
        assert not connected

    run(scenario)


def test_it_refuses_a_logged_out_session(alice, alice_world):
    stale = Client()
    stale.force_login(alice.user)
    stale.logout()
    stale.cookies["sessionid"] = "not-a-session"

    async def scenario():
        connected, _ = await socket(alice_world.run.pk, stale).connect()
        assert not connected

    run(scenario)


def test_it_accepts_a_member_of_the_runs_team(alice, alice_world):
    async def scenario():
        ws = socket(alice_world.run.pk, alice.client)
        connected, _ = await ws.connect()
        assert connected
        messages = await receive_backlog(ws)
        assert messages[0]["t"] == "status" and messages[0]["status"] == "queued"
        await ws.disconnect()

    run(scenario)

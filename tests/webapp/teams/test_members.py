"""The team's members page: everyone sees who is in the team; only its admins change roles and
remove members, never leaving the team without an admin. Checked for every role."""

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.test import Client
from django.urls import reverse

from webapp.models import ApiToken, AuditEvent, Membership
from webapp.teams import services


@pytest.fixture
def crew(alice):
    """alice (admin) and two members of Alpha: carl and dora; staff sam belongs to no team."""
    out = {"alice": alice.client}
    for name in ("carl", "dora"):
        user = User.objects.create_user(name, password="password")
        Membership.objects.create(team=alice.team, user=user, role=Membership.Role.MEMBER)
        out[name] = Client()
        out[name].force_login(user)
    sam = User.objects.create_user("sam", password="password", is_staff=True)
    Membership.objects.create(team=alice.team, user=sam, role=Membership.Role.MEMBER)
    out["sam"] = Client()
    out["sam"].force_login(sam)
    return out


def _membership(team, username):
    return Membership.objects.get(team=team, user__username=username)


def test_every_member_sees_who_is_in_the_team(alice, crew):
    page = crew["carl"].get(reverse("team_members")).content.decode()
    assert all(name in page for name in ("alice", "carl", "dora")) and "team_member_role" not in page
    assert reverse("team_member_role", args=[_membership(alice.team, "dora").pk]) not in page  # no controls for a member
    admin_page = crew["alice"].get(reverse("team_members")).content.decode()
    assert reverse("team_member_role", args=[_membership(alice.team, "dora").pk]) in admin_page


@pytest.mark.parametrize(("who", "allowed"), [("alice", True), ("sam", True), ("carl", False)])
def test_only_admins_and_staff_change_roles_and_remove_members(alice, crew, who, allowed):
    dora = _membership(alice.team, "dora")
    role = crew[who].post(reverse("team_member_role", args=[dora.pk]), {"role": "admin"})
    confirm = crew[who].get(reverse("team_member_remove", args=[dora.pk]))
    assert (role.status_code, confirm.status_code) == ((302, 200) if allowed else (403, 403))
    dora.refresh_from_db()
    assert (dora.role == "admin") is allowed
    removed = crew[who].post(reverse("team_member_remove", args=[dora.pk]))
    assert removed.status_code == (302 if allowed else 403)
    assert Membership.objects.filter(pk=dora.pk).exists() is not allowed


def test_another_teams_members_are_out_of_reach(alice, bob, crew):
    bobs = _membership(bob.team, "bob")
    for url in (reverse("team_member_role", args=[bobs.pk]), reverse("team_member_remove", args=[bobs.pk])):
        assert crew["alice"].post(url, {"role": "member"}).status_code == 404
    assert "bob" not in crew["alice"].get(reverse("team_members")).content.decode()
    bobs.refresh_from_db()
    assert bobs.role == "member"


def test_anonymous_visitors_are_sent_to_log_in(alice, crew):
    dora = _membership(alice.team, "dora")
    for url in (reverse("team_members"), reverse("team_member_remove", args=[dora.pk])):
        response = Client().get(url)
        assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_the_page_says_the_role_a_member_now_has(alice, crew):
    dora = _membership(alice.team, "dora")
    page = crew["alice"].post(reverse("team_member_role", args=[dora.pk]), {"role": "admin"}, follow=True).content.decode()
    assert "dora is now a team admin." in page
    page = crew["alice"].post(reverse("team_member_role", args=[dora.pk]), {"role": "member"}, follow=True).content.decode()
    assert "dora is now a team member." in page


def test_the_team_always_keeps_an_admin(alice, crew):
    mine = _membership(alice.team, "alice")
    refused = crew["alice"].post(reverse("team_member_role", args=[mine.pk]), {"role": "member"}, follow=True)
    assert "only admin" in refused.content.decode()
    assert crew["alice"].get(reverse("team_member_remove", args=[mine.pk])).context["error"]
    crew["alice"].post(reverse("team_member_remove", args=[mine.pk]))
    mine.refresh_from_db()
    assert mine.role == "admin"
    # with a second admin, alice may step down and then leave
    services.membership_set_role(membership=_membership(alice.team, "dora"), role="admin")
    assert crew["alice"].post(reverse("team_member_role", args=[mine.pk]), {"role": "member"}).status_code == 302
    left = crew["alice"].post(reverse("team_member_remove", args=[mine.pk]))
    assert left.status_code == 302 and left["Location"] == reverse("dashboard")
    assert not Membership.objects.filter(pk=mine.pk).exists()


def test_a_removed_members_api_tokens_stop_working(alice, crew):
    carl = User.objects.get(username="carl")
    _, secret = services.api_token_create(user=carl, team=alice.team, name="nb")
    assert services.api_token_authenticate(text=secret) is not None
    crew["alice"].post(reverse("team_member_remove", args=[_membership(alice.team, "carl").pk]))
    assert services.api_token_authenticate(text=secret) is None
    token = ApiToken.objects.get(user=carl)  # kept for the record, revoked
    assert token.revoked is not None
    event = AuditEvent.objects.get(team=alice.team, verb="remove", object_label__contains="carl")
    assert event.details["tokens_revoked"] == 1

    # invited back, carl is a member again, but the old token stays dead: whoever removed him
    # may have done so because of it; he makes a new one
    _, link = services.invitation_create(team=alice.team, by=alice.user, role="member", link_for=lambda t: t)
    services.invitation_accept(token=link, user=carl)
    assert services.api_token_authenticate(text=secret) is None
    _, fresh = services.api_token_create(user=carl, team=alice.team, name="nb2")
    assert services.api_token_authenticate(text=fresh) is not None


def test_tokens_of_the_users_other_teams_survive_a_removal(alice, bob, crew):
    carl = User.objects.get(username="carl")
    Membership.objects.create(team=bob.team, user=carl, role=Membership.Role.MEMBER)
    _, elsewhere = services.api_token_create(user=carl, team=bob.team, name="bravo")
    services.membership_remove(membership=_membership(alice.team, "carl"), actor=alice.user)
    assert services.api_token_authenticate(text=elsewhere) is not None


def test_a_stale_view_of_a_membership_cannot_leave_a_team_without_an_admin(alice, crew):
    """The checks read the roles as stored (under the team's lock), not as the caller last saw
    them: alice's membership is read while she is a plain member; she is then made the only admin;
    removing or demoting her through the old copy is refused."""
    services.membership_set_role(membership=_membership(alice.team, "dora"), role="admin")
    services.membership_set_role(membership=_membership(alice.team, "alice"), role="member")
    stale = _membership(alice.team, "alice")  # says "member"
    services.membership_set_role(membership=_membership(alice.team, "alice"), role="admin")
    services.membership_set_role(membership=_membership(alice.team, "dora"), role="member")
    with pytest.raises(ValidationError, match="only admin"):
        services.membership_remove(membership=stale)
    assert Membership.objects.get(pk=stale.pk).role == "admin"
    stale.role = "admin"  # a copy read while dora was still an admin, the other way round
    doras = _membership(alice.team, "dora")
    doras.role = "admin"
    services.membership_set_role(membership=doras, role="member")  # no-op: dora is a member already
    assert Membership.objects.filter(team=alice.team, role="admin").count() == 1


def test_an_unknown_role_is_refused_with_its_name(alice, crew):
    dora = _membership(alice.team, "dora")
    page = crew["alice"].post(reverse("team_member_role", args=[dora.pk]), {"role": "owner"}, follow=True).content.decode()
    assert "Unknown role" in page and "owner" in page
    dora.refresh_from_db()
    assert dora.role == "member"


def test_a_member_may_leave_the_team_but_not_remove_others(alice, crew):
    carl, dora = _membership(alice.team, "carl"), _membership(alice.team, "dora")
    assert "Leave the team" in crew["carl"].get(reverse("team_members")).content.decode()
    assert crew["carl"].post(reverse("team_member_remove", args=[dora.pk])).status_code == 403
    assert crew["carl"].post(reverse("team_member_role", args=[carl.pk]), {"role": "admin"}).status_code == 403
    left = crew["carl"].post(reverse("team_member_remove", args=[carl.pk]))
    assert left.status_code == 302 and not Membership.objects.filter(pk=carl.pk).exists()
    assert Membership.objects.filter(pk=dora.pk).exists()

"""A team runs itself, in Chromium under the Content-Security-Policy: alice (an admin) invites
someone from the Members page (a bad address is shown next to its field), the newcomer opens the
link in another browser, makes an account (every problem at once, next to its field) and lands in
the team; alice makes her an admin, then reads all of it on the Audit page and filters it; the
newcomer, now an admin, sees the Audit link too and changes her password.

Screenshots go to $TROUPE_SCREENSHOTS (or the test's tmp folder): team-*.png."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import Member, assert_no_csp_violation, watch_csp
from tests.processes import Processes
from webapp.models import AuditEvent, Membership

pytestmark = pytest.mark.django_db(transaction=True)
ERIN_PASSWORD = "erins long pass phrase"


@pytest.fixture
def web(data_dir: Path, tmp_path: Path, transactional_db: None) -> Iterator[Processes]:
    """Daphne and its Redis, no worker; emails go to files in the data dir (the laptop default)."""
    s = Processes(data_dir=data_dir, log_dir=tmp_path, env={"EMAIL_BACKEND": "file", "EMAIL_HOST": ""}).start(worker=False)
    try:
        yield s
    finally:
        s.stop()


def shot(page: Any, shots: Path, name: str) -> None:
    page.screenshot(path=str(shots / f"team-{name}.png"), full_page=True)


def log_in(page: Any, url: str, username: str, password: str) -> None:
    page.goto(url + "/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button.primary")
    page.wait_for_url(re.compile(r".*/$"))


def test_an_admin_invites_promotes_and_audits_from_the_browser(web: Processes, alice: Member, data_dir: Path,
                                                               browser_page: Any, shots: Path):
    page = browser_page
    log_in(page, web.url, alice.user.username, alice.password)

    # Members, from the nav; a bad address is refused next to its field, then the link is shown once.
    page.click("nav.mainnav >> text=Members")
    page.wait_for_url(re.compile(r".*/team/members/$"))
    page.fill("#id_email", "not an address")
    page.locator("#id_email").evaluate("e => e.type = 'text'")  # past the browser's own check, to the server's
    page.click("text=Make an invitation link")
    assert "Enter a valid email address" in page.locator("#errors-email").inner_text()
    shot(page, shots, "invite-error")
    page.fill("#id_email", "erin@example.org")
    page.click("text=Make an invitation link")
    link = page.locator("#invitation-link").inner_text()
    assert "/invite/" in link
    shot(page, shots, "members-with-link")
    emails = list((data_dir / "emails").glob("*.log"))
    assert len(emails) == 1 and link in emails[0].read_text()  # the file backend, as on a laptop
    page.reload()
    assert page.locator("#invitation-link").count() == 0  # shown once
    assert "erin@example.org" in page.locator("text=Open invitations >> xpath=..").inner_text()

    # The newcomer, in a browser of her own: every problem at once, then an account and the team.
    context = page.context.browser.new_context(viewport={"width": 1440, "height": 1000})
    violations = watch_csp(context)
    erin = context.new_page()
    erin.goto(link)
    assert "Join Alpha" in erin.content()
    erin.fill("#id_username", "erin")
    erin.fill("#id_password1", "short")
    erin.fill("#id_password2", "different")
    erin.click("button.primary")
    errors = erin.locator(".field-errors p.error, .errors p")
    assert errors.count() >= 1 and "didn’t match" in erin.content()
    shot(erin, shots, "invitation-errors")
    erin.fill("#id_password1", ERIN_PASSWORD)
    erin.fill("#id_password2", ERIN_PASSWORD)
    erin.click("button.primary")
    erin.wait_for_url(re.compile(r".*/$"))
    assert "Welcome to Alpha" in erin.content()
    assert erin.locator("nav.mainnav >> text=Audit").count() == 0  # a member: no audit trail

    # alice makes her an admin.
    page.goto(web.url + "/team/members/")
    page.select_option("select[aria-label='Role of erin']", "admin")
    page.locator("tr:has-text('erin') >> text=Change").click()
    page.wait_for_selector("text=erin is now a team admin")
    assert Membership.objects.get(user__username="erin").role == "admin"
    shot(page, shots, "members")

    # The Audit page, from the nav: all three events; the action filter submits on change.
    page.click("nav.mainnav >> text=Audit")
    page.wait_for_url(re.compile(r".*/team/audit/$"))
    table = page.locator("table.audit tbody").inner_text()
    assert "invited" in table and "joined" in table and "changed the role of" in table
    shot(page, shots, "audit")
    with page.expect_navigation():
        page.select_option("#id_verb", "role")
    assert page.locator("table.audit tbody tr").count() == 1 and "before member" in page.locator("table.audit tbody").inner_text()
    shot(page, shots, "audit-filtered")
    assert AuditEvent.objects.filter(team=alice.team).count() == 3

    # erin, an admin now, sees the Audit link; she changes her password from the header.
    erin.goto(web.url + "/")
    assert erin.locator("nav.mainnav >> text=Audit").count() == 1
    erin.click("header .user")
    erin.fill("#id_old_password", ERIN_PASSWORD)
    erin.fill("#id_new_password1", "a newer pass phrase 7")
    erin.fill("#id_new_password2", "a newer pass phrase 7")
    erin.click("button.primary")
    erin.wait_for_url(re.compile(r".*/account/password/done/$"))
    assert_no_csp_violation(erin, violations)
    context.close()

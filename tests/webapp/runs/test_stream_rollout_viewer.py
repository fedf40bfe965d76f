"""The rollout viewer's endpoint: newest episodes first, filtered by agent, success and step,
"load older" by id, the live page's "newer than" by id, only within the team."""

from __future__ import annotations

import re

from django.urls import reverse

from tests.webapp.streams import episode
from webapp.models import Rollout


def _episodes(run, specs):
    rows = []
    for step, success, agents in specs:
        ep = episode(step, success=success, agents=agents)
        rows.append(Rollout.objects.create(run=run, step=step, episode=0, success=success, agent_names=list(agents), data=ep))
    return rows


def _ids(html):
    return [int(i) for i in re.findall(r'<article class="episode[^"]*" id="ep-(\d+)"', html)]


def test_it_lists_newest_first_with_every_candidate(alice, alice_world):
    rows = _episodes(alice_world.run, [(1, False, ("tool", "reasoner")), (2, True, ("tool", "reasoner"))])
    html = alice.client.get(reverse("run_rollouts", args=[alice_world.run.pk])).content.decode()
    assert _ids(html) == [rows[1].pk, rows[0].pk]
    assert "<html" not in html and "load-more" not in html
    assert html.count('class="candidate chosen"') == 4 and "reasoner candidate 0" in html and "&lt;prompt for tool&gt;" in html
    assert "stdout: 42" in html  # the tool's sandbox output


def test_it_filters_by_agent_success_and_step(alice, alice_world):
    solo, duo_ok, duo_miss = _episodes(alice_world.run, [
        (1, True, ("tool",)), (2, True, ("tool", "reasoner")), (2, False, ("tool", "reasoner")),
    ])
    url = reverse("run_rollouts", args=[alice_world.run.pk])
    assert _ids(alice.client.get(url, {"agent": "reasoner"}).content.decode()) == [duo_miss.pk, duo_ok.pk]
    assert _ids(alice.client.get(url, {"success": "yes"}).content.decode()) == [duo_ok.pk, solo.pk]
    assert _ids(alice.client.get(url, {"step": "1"}).content.decode()) == [solo.pk]
    assert _ids(alice.client.get(url, {"agent": "tool", "success": "no", "step": "2"}).content.decode()) == [duo_miss.pk]
    assert "No episodes match this filter" in alice.client.get(url, {"step": "9"}).content.decode()
    assert len(_ids(alice.client.get(url, {"agent": "bad\"name", "step": "x"}).content.decode())) == 3  # junk ignored


def test_it_loads_older_episodes_a_page_at_a_time(alice, alice_world):
    rows = _episodes(alice_world.run, [(s, False, ("tool",)) for s in range(1, 46)])
    url = reverse("run_rollouts", args=[alice_world.run.pk])
    first = alice.client.get(url).content.decode()
    assert _ids(first) == [r.pk for r in rows[::-1][:20]] and 'class="load-more"' in first
    second = alice.client.get(url, {"before": _ids(first)[-1]}).content.decode()
    assert _ids(second) == [r.pk for r in rows[::-1][20:40]]
    third = alice.client.get(url, {"before": _ids(second)[-1]}).content.decode()
    assert _ids(third) == [r.pk for r in rows[::-1][40:]] and "load-more" not in third


def test_it_serves_the_live_page_what_is_newer_than_it_has(alice, alice_world):
    rows = _episodes(alice_world.run, [(s, s % 2 == 0, ("tool", "reasoner")) for s in range(1, 6)])
    url = reverse("run_rollouts", args=[alice_world.run.pk])
    assert _ids(alice.client.get(url, {"after": rows[2].pk}).content.decode()) == [rows[4].pk, rows[3].pk]
    assert _ids(alice.client.get(url, {"after": rows[2].pk, "success": "yes"}).content.decode()) == [rows[3].pk]
    assert _ids(alice.client.get(url, {"after": rows[4].pk}).content.decode()) == []


def test_it_marks_a_gap_larger_than_a_page(alice, alice_world):
    """More new episodes than one page: the newest page and a "load older" button, and the page
    starts its list over with them."""
    rows = _episodes(alice_world.run, [(s, False, ("tool",)) for s in range(1, 31)])
    html = alice.client.get(reverse("run_rollouts", args=[alice_world.run.pk]), {"after": rows[2].pk}).content.decode()
    assert _ids(html) == [r.pk for r in rows[::-1][:20]] and 'class="load-more"' in html


def test_it_is_a_404_for_another_team(alice_world, bob):
    assert bob.client.get(reverse("run_rollouts", args=[alice_world.run.pk])).status_code == 404

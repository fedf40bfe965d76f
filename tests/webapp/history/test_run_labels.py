"""Tags and notes are edited in place on the run page (htmx: the form swaps in, the saved value
swaps back); tags are shared by the team and filter the list; finished runs can be archived.
Another team's run is a 404 for all of it."""

from __future__ import annotations

from django.urls import reverse

from webapp.models import Run, Tag

HX = {"HX-Request": "true"}


def test_it_edits_tags_inline(alice, alice_world):
    url = reverse("run_tags", args=[alice_world.run.pk])
    form = alice.client.get(url, {"edit": "1"}, headers=HX).content.decode()
    assert form.lstrip().startswith('<div id="run-tags"') and 'name="tags"' in form
    saved = alice.client.post(url, {"tags": "baseline, LR-sweep, baseline,  "}, headers=HX).content.decode()
    assert 'name="tags"' not in saved and "baseline" in saved and "LR-sweep" in saved
    assert sorted(alice_world.run.tags.values_list("name", flat=True)) == ["LR-sweep", "baseline"]
    alice.client.post(url, {"tags": "baseline"}, headers=HX)
    assert list(Tag.objects.filter(team=alice.team).values_list("name", flat=True)) == ["baseline"]  # unused tags go


def test_it_reuses_a_team_tag_whatever_its_case(alice, alice_world):
    Tag.objects.create(team=alice.team, name="Baseline")
    alice.client.post(reverse("run_tags", args=[alice_world.run.pk]), {"tags": "baseline"}, headers=HX)
    assert list(alice_world.run.tags.values_list("name", flat=True)) == ["Baseline"]


def test_it_keeps_the_form_open_with_the_error_for_a_bad_tag(alice, alice_world):
    html = alice.client.post(reverse("run_tags", args=[alice_world.run.pk]), {"tags": "two words"}, headers=HX).content.decode()
    assert 'name="tags"' in html and "no spaces" in html and not alice_world.run.tags.exists()


def test_it_edits_notes_inline(alice, alice_world):
    url = reverse("run_notes", args=[alice_world.run.pk])
    assert "<textarea" in alice.client.get(url, {"edit": "1"}, headers=HX).content.decode()
    html = alice.client.post(url, {"notes": "Tool agent learned to print.\n<b>bold?</b>"}, headers=HX).content.decode()
    assert "Tool agent learned to print.<br>" in html and "&lt;b&gt;bold?&lt;/b&gt;" in html
    alice_world.run.refresh_from_db()
    assert alice_world.run.notes.startswith("Tool agent learned")
    page = alice.client.get(alice_world.run.get_absolute_url()).content.decode()
    assert 'id="run-notes"' in page and "Tool agent learned to print." in page


def test_it_archives_and_unarchives_finished_runs(alice, alice_world):
    run = alice_world.run
    url = reverse("run_archive", args=[run.pk])
    alice.client.post(url, {"archived": "1"})
    run.refresh_from_db()
    assert run.archived is False  # queued: still active
    Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED)
    alice.client.post(url, {"archived": "1"})
    run.refresh_from_db()
    assert run.archived is True
    assert "Unarchive" in alice.client.get(run.get_absolute_url()).content.decode()
    alice.client.post(url, {"archived": "0"})
    run.refresh_from_db()
    assert run.archived is False


def test_it_hides_another_teams_run(bob, alice_world):
    run = alice_world.run
    assert bob.client.get(reverse("run_tags", args=[run.pk]), {"edit": "1"}, headers=HX).status_code == 404
    assert bob.client.post(reverse("run_tags", args=[run.pk]), {"tags": "mine"}, headers=HX).status_code == 404
    assert bob.client.post(reverse("run_notes", args=[run.pk]), {"notes": "x"}, headers=HX).status_code == 404
    assert bob.client.post(reverse("run_archive", args=[run.pk]), {"archived": "1"}).status_code == 404
    run.refresh_from_db()
    assert not run.tags.exists() and run.notes == "" and not run.archived

"""Times read as a person says them: never "0 minutes ago" or "(0 minutes)"."""

from __future__ import annotations

from datetime import timedelta

from django.urls import reverse
from django.utils import timezone

from webapp.models import Run
from webapp.templatetags.troupe import ago, took


def test_ago_and_took_say_seconds_and_minutes():
    now = timezone.now()
    assert ago(now) == "just now"
    assert ago(now - timedelta(seconds=42)) == "42 s ago"
    assert ago(now - timedelta(minutes=3, seconds=5)) == "3 min ago"
    assert ago(now - timedelta(days=2, hours=4)).replace("\xa0", " ") == "2 days, 4 hours ago"
    assert took(now - timedelta(seconds=48), now) == "48 s"
    assert took(now - timedelta(minutes=3, seconds=41), now) == "3 min 41 s"
    assert took(now - timedelta(hours=2, minutes=10), now) == "2 h 10 min"


def test_pages_use_them(alice, alice_world):
    now = timezone.now()
    Run.objects.filter(pk=alice_world.run.pk).update(status="running", heartbeat=now, started=now - timedelta(seconds=30))
    page = alice.client.get(reverse("run_detail", args=[alice_world.run.pk])).content.decode()
    assert "<dd>just now</dd>" in page and "0 minutes" not in page
    Run.objects.filter(pk=alice_world.run.pk).update(status="succeeded", finished=now)
    page = alice.client.get(reverse("run_detail", args=[alice_world.run.pk])).content.decode()
    assert "(took 30 s)" in page and "0 minutes" not in page
    assert "0 minutes" not in alice.client.get(reverse("dashboard")).content.decode()

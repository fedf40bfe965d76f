"""A tracker is named in the engine (`training.config.TRACKERS`, the names `report_to.trackers`
accepts, and `training.trackers.TRACKERS`, the class behind each) and at the trust boundary
(`webapp.core.trust.TRACKER_DESTINATIONS`, the `report_to` fields that send a run's data elsewhere
with the worker's credentials). These fail when the lists part: a tracker without a class, a
destination field of no tracker, or a new `report_to` field nobody classed as a destination or not,
which a team could otherwise point anywhere."""

from __future__ import annotations

from dataclasses import fields
from types import SimpleNamespace

import pytest
from django.conf import settings

from training import trackers
from training.config import TRACKERS, ConfigError, ReportToConfig
from webapp.core.trust import REPORT_TO_KEPT, TRACKER_DESTINATIONS, check_report_to


def test_every_tracker_name_has_its_class():
    assert tuple(trackers.TRACKERS) == TRACKERS


def test_every_report_to_field_is_a_destination_or_kept_with_the_run():
    names = [f.name for f in fields(ReportToConfig)]
    assert sorted(names) == sorted([*TRACKER_DESTINATIONS, *REPORT_TO_KEPT])
    assert not set(TRACKER_DESTINATIONS) & set(REPORT_TO_KEPT)


def test_every_destination_belongs_to_a_tracker():
    assert set(TRACKER_DESTINATIONS.values()) <= set(TRACKERS)
    for field, tracker in TRACKER_DESTINATIONS.items():
        assert field.startswith(f"{tracker}_"), (field, tracker)


@pytest.mark.parametrize(("field", "tracker"), list(TRACKER_DESTINATIONS.items()))
def test_each_destination_is_the_operators_choice(field, tracker, monkeypatch):
    config = SimpleNamespace(report_to=ReportToConfig(trackers=(tracker,), **{field: "somewhere"}))  # what the check reads
    monkeypatch.setattr(settings, "TROUPE_TRACKER_DESTINATIONS", [])
    with pytest.raises(ConfigError) as refused:
        check_report_to(config)  # type: ignore[arg-type]
    assert f"report_to.{field}" in str(refused.value)
    monkeypatch.setattr(settings, "TROUPE_TRACKER_DESTINATIONS", [f"{tracker}:somewhere"])
    check_report_to(config)  # type: ignore[arg-type]

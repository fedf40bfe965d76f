"""A tracker is named in the engine (`training.config.TRACKERS`, the names `report_to.trackers`
accepts, and `training.trackers.TRACKERS`, the class behind each) and at the trust boundary
(`webapp.core.trust.TRACKER_DESTINATIONS`, the `report_to` fields that send a run's data elsewhere
with the worker's credentials, read from each field's `destination` metadata). These fail when the
lists part: a tracker without a class, a destination field of no tracker, or a new `report_to` field
that does not say whether it is a destination, which a team could otherwise point anywhere."""

from __future__ import annotations

from dataclasses import fields
from types import SimpleNamespace

import pytest
from django.conf import settings

from training import trackers
from training.config import TRACKERS, ConfigError, ReportToConfig
from webapp.core.trust import TRACKER_DESTINATIONS, check_report_to


def test_every_tracker_name_has_its_class():
    assert tuple(trackers.TRACKERS) == TRACKERS


def test_every_report_to_field_says_whether_it_is_a_destination():
    for f in fields(ReportToConfig):
        assert "destination" in f.metadata, f"report_to.{f.name} must say whether it sends the run's data somewhere"
    assert TRACKER_DESTINATIONS == {"mlflow_tracking_uri": "mlflow", "trackio_space_id": "trackio", "wandb_entity": "wandb"}


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

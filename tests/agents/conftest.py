"""Fixtures of the agents tests."""

from __future__ import annotations

import pytest

import agents.sandbox


@pytest.fixture
def spawned(monkeypatch):
    """The process of every sandbox started while the test runs."""
    procs = []
    spawn = agents.sandbox._spawn

    def counting(*args, **kwargs):
        procs.append(spawn(*args, **kwargs))
        return procs[-1]

    monkeypatch.setattr(agents.sandbox, "_spawn", counting)
    return procs

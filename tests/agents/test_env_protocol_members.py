"""The environment protocol's members are written once, in `agents.base.Environment`: the list the
plugin loader and the trust boundary check (`ENVIRONMENT_MEMBERS`) is read from that class, and is
exactly what `isinstance(x, Environment)` asks of an object."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from agents.base import ENVIRONMENT_MEMBERS, Environment, missing_members
from agents.envs import load_environment
from agents.plugins import PluginError
from training.config import ConfigError
from webapp.core.trust import check_environment


def complete() -> SimpleNamespace:
    return SimpleNamespace(**{name: (lambda *a, **k: None) for name in ENVIRONMENT_MEMBERS})


def test_an_object_with_every_listed_member_is_an_environment():
    assert ENVIRONMENT_MEMBERS[:3] == ("name", "roles", "required_fields") and "step" in ENVIRONMENT_MEMBERS
    assert isinstance(complete(), Environment)  # nothing the protocol asks is missing from the list
    assert missing_members(complete()) == []


@pytest.mark.parametrize("member", ENVIRONMENT_MEMBERS)
def test_an_object_without_one_of_them_is_not(member):
    env = complete()
    delattr(env, member)
    assert not isinstance(env, Environment)  # nothing in the list that the protocol does not ask
    assert missing_members(env) == [member]


def test_the_loader_and_the_trust_boundary_check_the_same_members(monkeypatch):
    partial = type("Partial", (), {name: None for name in ENVIRONMENT_MEMBERS if name != "observe"})
    monkeypatch.setattr("agents.envs.lookup", lambda path, kind: partial)
    monkeypatch.setattr("webapp.core.trust.lookup", lambda path, kind: partial)
    with pytest.raises(PluginError, match=r"lacks observe \(see agents.base.Environment\)"):
        load_environment("plugins.partial:Partial")
    with pytest.raises(ConfigError, match="is not an environment class"):
        check_environment("plugins.partial:Partial", field="topology.environment")

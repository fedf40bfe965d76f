"""Property-based: generated configs, trees and YAML text thrown at the trust boundary and at the
API and run-form preview. Whatever comes in: no exception escapes `trust` but a ConfigError, no
response is a 5xx, and a refused launch leaves no run behind. Derandomized, so it never flakes."""

from __future__ import annotations

import json
import string

import pytest
import yaml
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.webapp.api.test_api import TINY_CONFIG, Api
from tests.webapp.core.test_trust_code import _form
from training.config import ConfigError
from webapp.core import trust
from webapp.models import Run
from webapp.teams import services as tokens

PROPERTY = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

YAML_ALPHABET = string.ascii_letters + string.digits + " \t\n:-,&*!|>[]{}#%@'\"?.\\/<=~\x00\x85\u2028é"

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=40)
trees = st.recursive(scalars, lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
                     max_leaves=40)
hostile_strings = st.sampled_from([
    "unittest.__main__:main", "os:system", "local:/etc", "local:../../x", "hf:../../etc", "hf:a/b/c", "../" * 20, "\x00",
    "a" * 30_000, "tests.agents.unregistered_plugin:Env", "bundled:../../x", "tiny-random:../x", "",
]) | st.text(max_size=60)

@pytest.fixture
def api(alice) -> Api:
    return Api(tokens.api_token_create(user=alice.user, team=alice.team, name="prop")[1])


FIELDS = ["model.source", "topology.environment", "topology.env_args", "topology.agents", "data.reward_fn", "data.path",
          "checkpoint.resume_from", "grpo", "grpo.k", "optim.lr", "name", "seed", "topology.agents[0].model"]


def _with(tree: dict, dotted: str, value: object) -> dict:
    tree = json.loads(json.dumps(tree))
    node = tree
    parts = dotted.replace("[0]", ".0").split(".")
    for part in parts[:-1]:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        if not isinstance(node, (dict, list)):
            return tree
    last = parts[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return tree


@PROPERTY
@given(text=st.text(alphabet=YAML_ALPHABET, max_size=300))
def test_yaml_text_either_parses_bounded_or_is_a_config_error(text):
    try:
        tree = trust.yaml_load(text, field="yaml")
    except ConfigError as exc:
        assert exc.field.startswith("yaml") and exc.message
    else:
        trust.check_tree(tree, field="yaml")  # what came out is within the bounds


@PROPERTY
@given(tree=trees)
def test_any_tree_is_checked_without_escaping(tree):
    try:
        trust.check_tree(tree, field="config")
        trust.check_env_args(tree, field="topology.env_args")
    except ConfigError as exc:
        assert exc.field and exc.message


@PROPERTY
@given(field=st.sampled_from(FIELDS), value=trees | hostile_strings, as_json=st.booleans())
def test_the_api_never_answers_5xx_and_keeps_nothing_it_refuses(api, field, value, as_json, enqueued):
    tree = _with(yaml.safe_load(TINY_CONFIG), field, value)
    before = Run.objects.count()
    if as_json:
        response = api.post(reverse("api_runs"), json.dumps({"config": tree}), content_type="application/json")
    else:
        response = api.post(reverse("api_runs"), yaml.safe_dump(tree, allow_unicode=True))
    assert response.status_code in (201, 400), (response.status_code, response.content[:300])
    if response.status_code == 400:
        assert Run.objects.count() == before and response.json()["error"]
    else:
        assert Run.objects.count() == before + 1


@PROPERTY
@given(text=st.text(alphabet=YAML_ALPHABET, max_size=200) | trees.map(lambda t: yaml.safe_dump(t, allow_unicode=True)))
def test_the_run_preview_never_answers_5xx(alice, alice_world, text):
    response = alice.client.post(reverse("run_preview"), _form(alice_world, text), headers={"HX-Request": "true"})
    assert response.status_code == 200

"""The trust boundary, code class: a config names only built-in or registered plugins, whichever
way it comes in (API YAML and JSON, the run form's advanced YAML, its live preview, the topology
and dataset forms, a run row written behind the web's back), and naming a module never imports
it. Plugin code that exits or is interrupted fails its request or run, never the process."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import pytest
from django.urls import reverse

from tests.webapp.api.test_api import TINY_CONFIG, Api
from tests.webapp.conftest import make_world
from webapp.models import Dataset, Run, Topology
from webapp.runs import services as run_services
from webapp.teams import services as tokens

NEVER_IMPORTED = ("tests.agents.unregistered_plugin", "tests.agents.exits_on_import", "unittest.__main__", "this", "antigravity")
"""Modules that run code when imported (print, exit, open a browser); none is imported before the tests."""

PATHS = [
    "tests.agents.unregistered_plugin:Env",  # importable, a real environment, but nobody registered it
    "tests.agents.exits_on_import:Env",  # sys.exit() at import
    "unittest.__main__:main",  # exits at import
    "this:s",  # prints at import
    "antigravity:webbrowser",  # opens a browser at import
    "os:system",
    "subprocess:Popen",
    "webapp.settings:SECRET_KEY",
    "tests.faults.plugins:exploding_reward",  # registered, but as a reward function, not an environment
]


@pytest.fixture
def no_new_imports() -> Callable[[], None]:
    for name in NEVER_IMPORTED:
        assert name not in sys.modules, f"{name} was imported before the test"

    def check() -> None:
        imported = [name for name in NEVER_IMPORTED if name in sys.modules]
        assert not imported, f"naming a plugin imported {imported}"

    return check


@pytest.fixture
def api(alice) -> Api:
    return Api(tokens.api_token_create(user=alice.user, team=alice.team, name="notebook")[1])


def _form(world, advanced_yaml: str) -> dict[str, str]:
    return {"topology": world.topology.pk, "dataset": world.dataset.pk, "name": "", "specialization": "", "steps": "2",
            "k": "3", "tasks_per_step": "1", "lr": "1e-4", "lora_r": "4", "max_new_tokens": "8", "temperature": "1.0",
            "beta": "0", "eval_every": "0", "advanced_yaml": advanced_yaml}


@pytest.mark.parametrize("path", PATHS)
def test_it_refuses_an_unregistered_environment_from_the_api(alice, api, path, no_new_imports):
    response = api.post(reverse("api_runs"), TINY_CONFIG + f"topology: {{environment: '{path}', agents: [{{name: a, role: tool}}]}}\n")
    assert response.status_code == 400, response.content
    assert response.json()["field"] == "topology.environment" and "not a registered plugin" in response.json()["error"]
    no_new_imports()
    assert not Run.objects.exists()


@pytest.mark.parametrize("path", PATHS[:5] + ["tests.faults.plugins:BrokenEnv"])
def test_it_refuses_an_unregistered_reward_function_from_json(alice, api, path, no_new_imports):
    body = json.dumps({"config": {**_tiny_tree(), "data": {"reward_fn": path}}})
    response = api.post(reverse("api_runs"), body, content_type="application/json")
    assert response.status_code == 400, response.content
    assert response.json()["field"] == "data.reward_fn" and "not a registered plugin" in response.json()["error"]
    no_new_imports()


@pytest.mark.parametrize("path", PATHS[:5])
def test_it_refuses_an_unregistered_plugin_in_the_run_form_and_its_preview(alice, alice_world, path, no_new_imports):
    for yaml_text, field in ((f"topology: {{environment: '{path}'}}", "topology.environment"),
                             (f"data: {{reward_fn: '{path}'}}", "data.reward_fn")):
        response = alice.client.post(reverse("run_new"), _form(alice_world, yaml_text))
        assert response.status_code == 200 and field in " ".join(response.context["form"].errors["advanced_yaml"])
        preview = alice.client.post(reverse("run_preview"), _form(alice_world, yaml_text), headers={"HX-Request": "true"})
        assert preview.status_code == 200 and "not a registered plugin" in preview.content.decode()
    no_new_imports()
    assert Run.objects.count() == 1  # the world's own run only


@pytest.mark.parametrize("path", PATHS[:5])
def test_it_refuses_an_unregistered_plugin_in_the_topology_and_dataset_forms(alice, alice_world, path, no_new_imports):
    w = alice_world
    response = alice.client.post(reverse("topology_create"), {"name": "evil", "environment": path, "env_args": "{}",
                                                              "specialization": "lora", "max_turns": "2", "agents": [w.tool.pk]})
    assert response.status_code == 200 and "environment" in response.context["form"].errors
    response = alice.client.post(reverse("dataset_generate"), {"name": "evil", "environment": path, "env_args": "{}",
                                                               "size": "8", "eval_size": "2"})
    assert response.status_code == 200 and "environment" in response.context["form"].errors
    no_new_imports()
    assert not Topology.objects.filter(name="evil").exists() and not Dataset.objects.filter(name="evil").exists()


def test_the_worker_refuses_a_run_row_that_names_an_unregistered_plugin(alice, no_new_imports):
    """A row written behind the web's back (an old release, a database edit): the worker checks again."""
    world = make_world(alice.team)
    tree = world.run.to_config().to_dict()
    tree["topology"]["environment"] = "tests.agents.unregistered_plugin:Env"
    from training.config import RunConfig

    Run.objects.filter(pk=world.run.pk).update(config_yaml=RunConfig.from_dict(tree).to_yaml())

    def train(*args, **kwargs):
        raise AssertionError("the engine must not start")

    run = run_services.run_execute(run_id=world.run.pk, worker="w", train=train)
    assert run is not None and run.status == Run.Status.FAILED
    assert "topology.environment" in run.error_message and "not a registered plugin" in run.error_message
    no_new_imports()


@pytest.mark.parametrize("way", ["topology", "dataset"])
def test_a_plugin_that_exits_while_built_is_a_form_error(alice, alice_world, way):
    """`ExitOnInit` raises SystemExit in its constructor: the request answers, the process lives on."""
    path = "tests.faults.plugins:ExitOnInit"
    if way == "topology":
        response = alice.client.post(reverse("topology_create"), {"name": "exits", "environment": path, "env_args": "{}",
                                                                   "specialization": "single", "max_turns": "1", "agents": [alice_world.tool.pk]})
    else:
        response = alice.client.post(reverse("dataset_generate"), {"name": "exits", "environment": path, "env_args": "{}",
                                                                   "size": "8", "eval_size": "2"})
    assert response.status_code == 200
    text = " ".join(" ".join(errors) for errors in response.context["form"].errors.values())
    assert "SystemExit" in text, text
    assert not Topology.objects.filter(name="exits").exists() and not Dataset.objects.filter(name="exits").exists()


def test_registering_a_module_that_exits_at_import_is_an_error_not_an_exit(plugin_registry):
    with pytest.raises(plugin_registry.PluginError, match="SystemExit: plugin module exited at import"):
        plugin_registry.register("tests.agents.exits_on_import:Env", kind=plugin_registry.ENVIRONMENT)
    sys.modules.pop("tests.agents.exits_on_import", None)


def test_lookup_never_imports(plugin_registry, no_new_imports):
    for path in NEVER_IMPORTED:
        with pytest.raises(plugin_registry.PluginError, match="not a registered plugin"):
            plugin_registry.lookup(f"{path}:x", kind=plugin_registry.ENVIRONMENT)
    no_new_imports()


def _tiny_tree() -> dict:
    import yaml

    return yaml.safe_load(TINY_CONFIG)

"""Every form field, fed a bad value: the error appears next to that field, and nothing is saved
(no new row; an edited object keeps its values). The run form has its own file
(test_bad_input_configs.py), the dataset file its own (test_bad_input_uploads.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.forms.models import model_to_dict
from django.urls import reverse

from tests.webapp.bad_inputs import GOOD_JSONL
from webapp.models import Agent, Dataset, ModelSource, Topology


@dataclass(frozen=True)
class Case:
    form: str
    field: str
    value: Any
    says: str


MODEL = {"name": "Small", "source": "tiny-random:llama", "notes": ""}
AGENT = {"name": "solver", "role": "reasoner", "instructions": "", "model_source": "{source}", "temperature": "",
         "max_new_tokens": "", "tools": "", "trainable": "on"}
TOPOLOGY = {"name": "trio", "environment": "math_tool", "env_args": '{"level": 1}', "specialization": "lora", "max_turns": "2",
            "agents": ["{tool}", "{reasoner}"]}
GENERATE = {"name": "gen", "environment": "math_tool", "env_args": '{"level": 1}', "size": "16", "eval_size": "4"}
UPLOAD = {"name": "up", "environment": "math_tool", "eval_fraction": "0.1", "file": "{file}"}

CASES = [
    Case("model", "name", "", "required"),
    Case("model", "name", "n" * 101, "at most 100"),
    Case("model", "name", "Tiny", "already has"),
    Case("model", "source", "", "required"),
    Case("model", "source", "bundled:gpt-17", "unknown bundled model"),
    Case("model", "source", "tiny-random:transformer9000", "unknown tiny-random"),
    Case("model", "source", "local:/nowhere/at/all", "outside the folders your team may use"),
    Case("model", "source", "hf:org/../../etc", "is not a hub id"),
    Case("agent", "name", "", "required"),
    Case("agent", "name", "9lives", "Start with a letter"),
    Case("agent", "name", "has space", "Start with a letter"),
    Case("agent", "name", "tool", "already has"),
    Case("agent", "role", "", "required"),
    Case("agent", "model_source", "999999", "valid choice"),
    Case("agent", "model_source", "{bob_source}", "valid choice"),
    Case("agent", "temperature", "-1", "greater than or equal to 0"),
    Case("agent", "temperature", "99", "less than or equal to 5"),
    Case("agent", "temperature", "hot", "number"),
    Case("agent", "max_new_tokens", "0", "greater than or equal to 1"),
    Case("agent", "max_new_tokens", "100000", "less than or equal to 4096"),
    Case("agent", "max_new_tokens", "lots", "whole number"),
    Case("topology", "name", "", "required"),
    Case("topology", "name", "duo", "already has"),
    Case("topology", "environment", "chess", "valid choice"),
    Case("topology", "env_args", "{level: 1", "valid JSON"),
    Case("topology", "env_args", "[1, 2]", "JSON object"),
    Case("topology", "env_args", '{"level": 99}', "rejected these arguments"),
    Case("topology", "env_args", '{"colour": "red"}', "rejected these arguments"),
    Case("topology", "specialization", "telepathy", "valid choice"),
    Case("topology", "max_turns", "0", "greater than or equal to 1"),
    Case("topology", "max_turns", "1000", "less than or equal to 64"),
    Case("topology", "agents", [], "at least one agent"),
    Case("topology", "agents", ["{bob_tool}"], "Pick agents from the list"),
    Case("topology", "agents", ["{tool}", "{tool}"], "only once"),
    Case("dataset_generate", "name", "", "required"),
    Case("dataset_generate", "environment", "", "required"),
    Case("dataset_generate", "env_args", "{oops", "valid JSON"),
    Case("dataset_generate", "env_args", '{"level": 42}', "rejected these arguments"),
    Case("dataset_generate", "size", "0", "at least one"),
    Case("dataset_generate", "size", "-5", "greater than or equal to 0"),
    Case("dataset_generate", "size", "20000000", "less than or equal to 10000000"),
    Case("dataset_generate", "size", "many", "whole number"),
    Case("dataset_generate", "eval_size", "-1", "greater than or equal to 0"),
    Case("dataset_generate", "eval_size", "5000000", "less than or equal to 1000000"),
    Case("dataset_upload", "name", "", "required"),
    Case("dataset_upload", "name", "gen L1", "already has"),
    Case("dataset_upload", "environment", "chess", "valid choice"),
    Case("dataset_upload", "file", None, "required"),
    Case("dataset_upload", "eval_fraction", "-0.1", "greater than or equal to 0"),
    Case("dataset_upload", "eval_fraction", "0.95", "less than or equal to 0.9"),
    Case("dataset_upload", "eval_fraction", "half", "number"),
]


@dataclass
class Form:
    url: str
    data: dict[str, Any]
    model: type
    count: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def _fill(value: Any, ids: dict[str, Any]) -> Any:
    if isinstance(value, list):
        return [_fill(v, ids) for v in value]
    if isinstance(value, str) and value.startswith("{") and value.endswith("}") and value[1:-1] in ids:
        return ids[value[1:-1]]
    return value


def _form(case: Case, world, bob_world) -> Form:
    ids = {"source": world.source.pk, "tool": world.tool.pk, "reasoner": world.reasoner.pk,
           "bob_source": bob_world.source.pk, "bob_tool": bob_world.tool.pk,
           "file": SimpleUploadedFile("ok.jsonl", GOOD_JSONL)}
    base, url, model = {
        "model": (MODEL, reverse("model_source_create"), ModelSource),
        "agent": (AGENT, reverse("agent_create"), Agent),
        "topology": (TOPOLOGY, reverse("topology_create"), Topology),
        "dataset_generate": (GENERATE, reverse("dataset_generate"), Dataset),
        "dataset_upload": (UPLOAD, reverse("dataset_upload"), Dataset),
    }[case.form]
    data = {k: _fill(v, ids) for k, v in base.items()}
    if case.value is None:
        data.pop(case.field)
    else:
        data[case.field] = _fill(case.value, ids)
    data = {k: v for k, v in data.items() if not (k == "trainable" and v == "")}
    return Form(url=url, data=data, model=model, count=model.objects.count())


def _error_block(html: str, name: str) -> str:
    block = html[html.index(f'id="field-{name}"'):]
    return block[: block.index("</div>")]


@pytest.mark.parametrize("case", CASES, ids=[f"{c.form}.{c.field}={str(c.value)[:14]}" for c in CASES])
def test_it_shows_the_error_at_the_field_and_saves_nothing(alice, alice_world, bob_world, data_dir, case: Case):
    form = _form(case, alice_world, bob_world)
    response = alice.client.post(form.url, form.data)
    assert response.status_code == 200, f"saved? {response.get('Location')}"
    errors = response.context["form"].errors
    assert case.field in errors, errors
    assert case.says in " ".join(errors[case.field]), errors[case.field]
    html = response.content.decode().replace("&#x27;", "'").replace("&quot;", '"')
    assert case.says in _error_block(html, case.field)
    assert form.model.objects.count() == form.count
    if case.form == "dataset_upload":
        stored = [p for p in (data_dir / "datasets").rglob("*") if p.is_file()] if (data_dir / "datasets").exists() else []
        assert stored == []


@pytest.mark.parametrize(("obj", "field", "value", "says"), [
    ("agent", "temperature", "-3", "greater than or equal to 0"),
    ("agent", "name", "", "required"),
    ("topology", "max_turns", "0", "greater than or equal to 1"),
    ("dataset", "size", "0", "at least one"),
    ("model", "source", "bundled:nope", "unknown bundled model"),
])
def test_editing_with_a_bad_value_keeps_the_saved_object(alice, alice_world, obj, field, value, says):
    target, url, data = {
        "agent": (alice_world.tool, reverse("agent_edit", args=[alice_world.tool.pk]),
                  {**model_to_dict(alice_world.tool), "tools": "python", "trainable": "on", "temperature": "",
                   "max_new_tokens": ""}),
        "topology": (alice_world.topology, reverse("topology_edit", args=[alice_world.topology.pk]),
                     {"name": "duo", "environment": "math_tool", "env_args": '{"level": 1}', "specialization": "lora",
                      "max_turns": "2", "agents": [alice_world.tool.pk, alice_world.reasoner.pk]}),
        "dataset": (alice_world.dataset, reverse("dataset_detail", args=[alice_world.dataset.pk]),
                    {"name": "gen L1", "environment": "math_tool", "env_args": '{"level": 1}', "size": "32", "eval_size": "8"}),
        "model": (alice_world.source, reverse("model_source_edit", args=[alice_world.source.pk]),
                  {"name": "Tiny", "source": "tiny-random:llama", "notes": ""}),
    }[obj]
    data = {k: v for k, v in data.items() if v is not None}
    before = model_to_dict(type(target).objects.get(pk=target.pk))
    data[field] = value
    response = alice.client.post(url, data)
    assert response.status_code == 200
    assert says in " ".join(response.context["form"].errors[field])
    after = model_to_dict(type(target).objects.get(pk=target.pk))
    assert after == before

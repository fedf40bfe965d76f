"""Member text never reaches the operator's console raw: what a member writes is checked at launch
(the keys of a warm start's agent mapping are this run's policies, config keys hold no control
characters, a conversations file's `agent` is a name or a role), and whatever is logged anyway (a
run's error, a request's path) is printed escaped, one line per record, with no terminal escape
sequence and no forged line."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from training.config import ConfigError
from webapp.core.console import ConsoleFormatter, printable
from webapp.models import Checkpoint, Dataset, Run
from webapp.runs import services as run_services
from webapp.teams import services as tokens

ESCAPES = "\x1b]0;pwned\x07\x1b[2J"
FORGED = "\n12:00:00 run #1 succeeded at step 3 of 3"


def _clean(text: str) -> bool:
    return not any(ch in text for ch in "\x1b\x07\n\r\u202e")


@pytest.fixture
def console():
    """The console handler settings.LOGGING installs, writing to a buffer for the test."""
    handlers = [h for h in logging.getLogger().handlers if isinstance(h.formatter, ConsoleFormatter)]
    assert handlers, "settings.LOGGING's console handler formats with ConsoleFormatter"
    buffer = io.StringIO()
    old = handlers[0].setStream(buffer)
    level = logging.getLogger().level
    logging.getLogger().setLevel(logging.INFO)
    yield buffer
    logging.getLogger().setLevel(level)
    handlers[0].setStream(old)


@pytest.fixture
def finished_with_checkpoint(alice_world, data_dir):
    run = alice_world.run
    Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED)
    folder = Path(data_dir) / "runs" / str(run.pk) / "checkpoints" / "step-000002"
    for policy in ("tool", "reasoner"):
        (folder / policy).mkdir(parents=True)
    return Checkpoint.objects.create(run=run, step=2, path=str(folder))


def test_a_warm_start_maps_only_the_run_s_own_policies(alice, alice_world, finished_with_checkpoint):
    api = tokens.api_token_create(user=alice.user, team=alice.team, name="n")[1]
    runs = Run.objects.count()
    for key in (ESCAPES + "tool", "ghost", "tool" + FORGED):
        body = {"topology": alice_world.topology.pk, "dataset": alice_world.dataset.pk, "config": {"optim": {"steps": 2}},
                "start_from": {"run": alice_world.run.pk, "agents": {key: "tool"}}}
        response = alice.client.post(reverse("api_runs"), json.dumps(body), content_type="application/json",
                                     headers={"Authorization": f"Bearer {api}"})
        assert response.status_code == 400, (key, response.content)
        answer = response.json()
        assert _clean(answer["error"]) and _clean(answer["field"]), answer
        if key == "ghost":  # (the others do not pass the body's check: no control character in a key)
            assert answer["field"] == "model.init_from.agents" and "its policies: tool, reasoner" in answer["error"]
    with pytest.raises(ConfigError) as err:  # the advanced YAML too
        run_services.run_config_build(topology=alice_world.topology, dataset=alice_world.dataset, advanced_yaml=(
            f"model: {{init_from: {{run: '{finished_with_checkpoint.path}', agents: {{ghost: tool}}}}}}"))
    assert err.value.field == "model.init_from.agents"
    assert Run.objects.count() == runs


def test_a_mapping_to_a_folder_the_checkpoint_lacks_is_refused_at_launch(alice_world, finished_with_checkpoint):
    with pytest.raises(ConfigError) as err:
        run_services.run_config_build(topology=alice_world.topology, dataset=alice_world.dataset, advanced_yaml=(
            f"model: {{init_from: {{run: '{finished_with_checkpoint.path}', agents: {{tool: writer}}}}}}"))
    assert err.value.field == "model.init_from.agents" and "has no folder 'writer'" in err.value.message
    config = run_services.run_config_build(topology=alice_world.topology, dataset=alice_world.dataset, advanced_yaml=(
        f"model: {{init_from: {{run: '{finished_with_checkpoint.path}', agents: {{tool: reasoner}}}}}}"))
    assert config.model.init_from.agents == {"tool": "reasoner"}


def test_config_keys_with_control_characters_are_refused_and_not_echoed(alice, alice_world):
    api = tokens.api_token_create(user=alice.user, team=alice.team, name="n")[1]
    for key in ("st" + ESCAPES + "eps", "steps" + FORGED, "st\u202eeps"):
        body = {"topology": alice_world.topology.pk, "dataset": alice_world.dataset.pk, "config": {"optim": {key: 2}}}
        response = alice.client.post(reverse("api_runs"), json.dumps(body), content_type="application/json",
                                     headers={"Authorization": f"Bearer {api}"})
        assert response.status_code == 400
        answer = response.json()
        assert "control or invisible character" in answer["error"] and _clean(answer["error"]) and _clean(answer["field"]), answer


def test_a_conversations_file_s_agent_is_a_name_or_a_role(alice, data_dir):
    good = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}], "agent": "reasoner"}
    lines = [good] + [{**good, "agent": agent} for agent in ("x" + ESCAPES, "reasoner" + FORGED, "a" * 61, "\u202etool")]
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    response = alice.client.post(reverse("dataset_upload_conversations"), {
        "name": "demos", "environment": "math_tool", "file": SimpleUploadedFile("demos.jsonl", content)})
    assert response.status_code == 200
    errors = response.context["form"].errors["file"]
    assert [e.split(":")[0] for e in errors] == ["line 2", "line 3", "line 4", "line 5"]
    assert all(_clean(e) for e in errors) and "\\x1b]0;pwned\\x07" in errors[0]
    assert not Dataset.objects.filter(team=alice.team).exists()


def test_a_run_s_error_reaches_the_console_as_one_escaped_line(alice_world, console):
    def train(config, *, out_dir, sink):
        raise ConfigError("model.init_from.agents." + ESCAPES + FORGED, "this run has no policy" + FORGED)

    run = run_services.run_execute(run_id=alice_world.run.pk, worker="w", train=train)
    assert run.status == Run.Status.FAILED
    lines = console.getvalue().splitlines()
    assert lines and all(_clean(line) and "\x1b" not in line for line in lines)
    failed = [line for line in lines if f"run #{run.pk} failed" in line]
    assert len(failed) == 1 and "\\x1b]0;pwned\\x07" in failed[0] and "\\n12:00:00 run #1 succeeded" in failed[0]
    assert not any(line.startswith("12:00:00 run #1") for line in lines)


def test_a_traceback_s_lines_cannot_pass_for_records(console):
    try:
        raise ValueError("bad" + FORGED + ESCAPES)
    except ValueError:
        logging.getLogger("webapp.test").exception("job #1 failed")
    lines = console.getvalue().splitlines()
    assert lines[0].endswith("job #1 failed") and all(line.startswith("    ") for line in lines[1:])
    assert "\x1b" not in console.getvalue() and any("12:00:00 run #1 succeeded" in line for line in lines[1:])


def test_printable_escapes_what_a_terminal_acts_on():
    assert printable("a\nb\x1b[2J\x07\u202ec\u2028d\x7f\x9b") == "a\\nb\\x1b[2J\\x07\\u202ec\\u2028d\\x7f\\x9b"
    assert printable("héllo wörld 日本 \\n") == "héllo wörld 日本 \\n"  # text, and a written backslash, stay as they are
    assert printable("x" * 100, limit=10) == "x" * 10 + "…"

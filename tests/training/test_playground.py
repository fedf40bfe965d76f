"""`training.playground.play` and `python -m training playground`: a typed task played turn by
turn in each lane (a checkpoint's agents, the base models), the transcript handed over after
every turn, and every lane done at the end."""

from __future__ import annotations

import json

import pytest

from tests.training.conftest import TINY_LORA
from training.__main__ import main
from training.playground import lane, play

TASK = {"question": "Compute 12 + 30.", "answer": "42"}


def test_it_plays_each_lane_turn_by_turn(lora_checkpoint):
    config, checkpoint = lora_checkpoint
    lanes = [lane("trained", trained=True), lane("base", trained=False)]
    seen: list[list[int]] = []
    play(config, TASK, lanes=lanes, checkpoint=checkpoint, max_new_tokens=6,
         on_turn=lambda lanes: seen.append([len(each["turns"]) for each in lanes]))
    assert seen == [[1, 0], [1, 1], [2, 1], [2, 2]]  # each turn handed over as soon as it is played
    trained, base = lanes
    assert [t["agent"] for t in trained["turns"]] == ["tool", "reasoner"] and [t["role"] for t in base["turns"]] == ["tool", "reasoner"]
    first = trained["turns"][0]
    assert "Compute 12 + 30." in first["prompt"] and first["tokens"] <= 6 and first["tool_output"]
    assert trained["done"] and base["done"] and trained["success"] is False
    assert [t["text"] for t in trained["turns"]] != [t["text"] for t in base["turns"]]  # the checkpoint's weights were loaded


def test_it_needs_every_field_the_environment_requires(lora_checkpoint):
    config, _ = lora_checkpoint
    with pytest.raises(ValueError, match="need the field"):
        play(config, {"answer": "1"}, lanes=[lane("base", trained=False)])


def test_the_cli_prints_each_turn_then_each_lane(lora_checkpoint, capsys):
    _, checkpoint = lora_checkpoint
    code = main(["playground", str(TINY_LORA), "--task", json.dumps(TASK), "--checkpoint", str(checkpoint), "--with-base",
                 "--max-new-tokens", "4"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0
    turns, ends = lines[:4], lines[4:]
    assert [(t["lane"], t["agent"]) for t in turns] == [(f"checkpoint {checkpoint}", "tool"), ("base models", "tool"),
                                                       (f"checkpoint {checkpoint}", "reasoner"), ("base models", "reasoner")]
    assert [(e["lane"], e["done"], e["turns"]) for e in ends] == [(f"checkpoint {checkpoint}", True, 2), ("base models", True, 2)]


@pytest.mark.parametrize(("args", "words"), [
    (["--task", "[1, 2"], "not JSON"),
    (["--task", "[1, 2]"], "JSON object"),
    (["--task", '{"answer": "1"}'], "need the field(s) question"),
    (["--task", json.dumps(TASK), "--with-base"], "give --checkpoint too"),
])
def test_the_cli_explains_a_bad_task(args, words, capsys):
    assert main(["playground", str(TINY_LORA), *args]) == 2
    assert words in capsys.readouterr().err

"""Prompt-completion lines (a run's own episodes as SFT examples): the file check, the masks (only
the agent's own text and its end of turn are learned), and a tiny SFT run on them."""

import json

import pytest
import torch

from agents.tools import load_tool
from training.config import RunConfig
from training.conversations import read_conversations
from training.data import DataErrors
from training.events import NullSink
from training.models import load_model
from training.runner import train
from training.sft import encode_completion

PROMPT = "<|im_start|>user\nWrite a.<|im_end|>\n<|im_start|>assistant\n"


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def test_it_reads_prompt_completion_lines_and_names_every_bad_one(tmp_path):
    good = [{"prompt": PROMPT, "completion": "aaaa", "agent": "writer"},
            {"prompt": PROMPT, "agent": "writer", "completion": [
                {"role": "assistant", "content": "<tool_call>x</tool_call>"}, {"role": "tool", "name": "calculator", "content": "4"},
                {"role": "assistant", "content": "4"}]}]
    convs = read_conversations(_write(tmp_path / "ok.jsonl", good))
    assert convs[0].prompt == PROMPT and convs[0].messages == ({"role": "assistant", "content": "aaaa"},)
    assert [m["role"] for m in convs[1].messages] == ["assistant", "tool", "assistant"]

    bad = [{"prompt": PROMPT, "completion": ""}, {"prompt": 3, "completion": "a"},
           {"prompt": PROMPT, "completion": [{"role": "system", "content": "x"}]},
           {"prompt": PROMPT, "completion": "a", "messages": [{"role": "assistant", "content": "a"}]}]
    with pytest.raises(DataErrors) as err:
        read_conversations(_write(tmp_path / "bad.jsonl", bad))
    text = [str(p) for p in err.value.problems]
    assert "line 1" in text[0] and "`completion` is empty" in text[0]
    assert "line 2" in text[1] and "`prompt` must be text" in text[1]
    assert "line 3" in text[2] and "completion[0].role is 'system'; allowed: assistant, tool" in text[2]
    assert "line 4" in text[3] and "not both" in text[3]


def test_only_the_completion_and_its_end_of_turn_are_learned_not_the_prompt_or_tool_results():
    _, tok = load_model("tiny-random:llama", device=torch.device("cpu"))
    ids, mask = encode_completion(tok, PROMPT, [{"role": "assistant", "content": "aaaa"}])
    assert tok.decode([i for i, m in zip(ids, mask) if m]) == "aaaa<|im_end|>"
    assert tok.decode([i for i, m in zip(ids, mask) if not m]) == PROMPT
    assert ids[: len(mask) - mask.count(1)] == tok(PROMPT, add_special_tokens=False)["input_ids"]  # the rollout's prompt tokens

    turn = [{"role": "assistant", "content": "<tool_call>x</tool_call>"}, {"role": "tool", "name": "calculator", "content": "RESULT"},
            {"role": "assistant", "content": "bb"}]
    ids, mask = encode_completion(tok, PROMPT, turn, tools=[load_tool("calculator")])
    learned = tok.decode([i for i, m in zip(ids, mask) if m])
    context = tok.decode([i for i, m in zip(ids, mask) if not m])
    assert learned == "<tool_call>x</tool_call><|im_end|>bb<|im_end|>"  # the end of turn after the call is the model's, as in GRPO
    assert "RESULT" in context and context.endswith("<|im_start|>assistant\n") and "<|im_end|>\n<|im_start|>tool" not in context


def test_an_sft_run_learns_from_prompt_completion_lines(make_config, tmp_path):
    rows = [{"prompt": PROMPT, "completion": "aaaa", "agent": "writer"}, {"prompt": PROMPT, "completion": "aa", "agent": "echo"}]
    data = make_config("lora").to_dict()
    data["algorithm"] = "sft"
    data["sft"] = {"path": str(_write(tmp_path / "episodes.jsonl", rows)), "batch_size": 2}
    data["optim"]["steps"] = 1
    seen = []

    class Sink(NullSink):
        def metrics(self, m):
            seen.append(m)

    result = train(RunConfig.from_dict(data), out_dir=tmp_path / "out", sink=Sink())
    assert result.status == "succeeded"
    assert set(seen[-1].agents) == {"writer", "echo"}
    assert seen[-1].agents["writer"]["tokens"] > 0 and seen[-1].agents["writer"]["loss"] > 0


def test_a_missing_or_empty_field_is_said_as_it_is(tmp_path):
    """Issue 46, class 6: a line without `completion` is told text or a list is allowed; empty is not missing."""
    from training.conversations import check_conversation
    from training.data import DataError

    def said(row):
        with pytest.raises(DataError) as info:
            check_conversation(row, 1)
        return info.value.message

    assert said({"prompt": PROMPT}) == "`completion` is missing: the agent's answer, as text or as a list of {role, content} messages"
    assert said({"prompt": "", "completion": "a"}) == "`prompt` is empty: give the text the agent was given"
    assert said({"completion": "a"}).startswith("`prompt` is missing")
    assert said({"prompt": PROMPT, "completion": 3}) == "`completion` must be text or a non-empty list of {role, content} messages"
    assert said({"messages": []}) == "`messages` is empty: nothing to learn from"
    assert said({"agent": "writer"}).startswith("`messages` is missing")

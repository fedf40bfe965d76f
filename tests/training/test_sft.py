"""Supervised fine-tuning (`algorithm: sft`): the config, the conversations file, the masks, and a
tiny run whose trained weights move (and whose frozen ones do not)."""

import json

import pytest
import torch

from training.config import ConfigError, RunConfig
from training.conversations import Conversation, by_agent, read_conversations
from training.data import DataError
from training.events import NullSink
from training.models import load_model
from training.runner import train
from training.sft import encode, train_sft

CONVERSATIONS = [
    {"messages": [{"role": "system", "content": "Write a."}, {"role": "user", "content": "Go"},
                  {"role": "assistant", "content": "aaaa"}], "agent": "writer"},
    {"messages": [{"role": "user", "content": "Repeat aa"}, {"role": "assistant", "content": "calc"},
                  {"role": "tool", "content": "RESULT"}, {"role": "assistant", "content": "aa"}], "agent": "echo"},
]


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def sft_config(make_config, tmp_path, specialization="lora", **overrides):
    data = make_config(specialization).to_dict()
    data["algorithm"] = "sft"
    data["sft"] = {"path": str(_write(tmp_path / "conv.jsonl", CONVERSATIONS if specialization != "single" else
                                      [{"messages": CONVERSATIONS[0]["messages"]}])), "batch_size": 2}
    config = RunConfig.from_dict(data)
    return config.replace(**overrides) if overrides else config


# -- the config -----------------------------------------------------------------------------------


def test_it_names_every_grpo_setting_an_sft_run_would_ignore(make_config, tmp_path):
    data = sft_config(make_config, tmp_path).to_dict()
    data["grpo"].update(k=8, beta=0.1)
    data["data"]["reward_fn"] = "mypkg.rewards:fn"
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict(data)
    fields = {p.field for p in err.value.problems}
    assert {"grpo.k", "grpo.beta", "data.reward_fn"} <= fields


def test_an_sft_run_needs_a_conversations_file_and_a_grpo_run_refuses_the_sft_section(make_config, tmp_path):
    data = make_config().to_dict()
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict({**data, "algorithm": "sft"})
    assert err.value.field == "sft.path"
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict({**data, "sft": {"path": "x.jsonl"}})
    assert err.value.field == "sft"
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict({**data, "algorithm": "dpo"})
    assert err.value.field == "algorithm" and "grpo, sft" in str(err.value)


# -- the conversations file ------------------------------------------------------------------------


def test_it_reports_every_bad_conversation_with_its_line(tmp_path):
    path = _write(tmp_path / "bad.jsonl", [
        CONVERSATIONS[0],
        {"messages": [{"role": "robot", "content": "x"}]},
        "not json",
        {"messages": [{"role": "user", "content": "hi"}]},
        {"message": []},
    ])
    with pytest.raises(DataError) as err:
        read_conversations(path)
    by_line = {p.line: p.message for p in err.value.problems}
    assert sorted(by_line) == [2, 3, 4, 5]
    assert "'robot'" in by_line[2] and "invalid JSON" in by_line[3] and "no assistant message" in by_line[4]
    assert "unknown field 'message'" in by_line[5]


def test_it_gives_each_conversation_to_the_agent_it_names_by_name_or_role(make_config):
    config = make_config()
    convs = [Conversation(1, (), "writer"), Conversation(2, (), "echo"), Conversation(3, (), "nobody"), Conversation(4, ())]
    with pytest.raises(DataError) as err:
        by_agent(convs, config)
    assert [p.line for p in err.value.problems] == [3, 4]
    assert {a: [c.line for c in cs] for a, cs in by_agent(convs[:2], config).items()} == {"writer": [1], "echo": [2]}
    single = make_config("single")
    assert [c.line for c in by_agent([Conversation(7, ())], single)["writer"]] == [7]


# -- masks -----------------------------------------------------------------------------------------


def test_only_the_assistant_tokens_are_learned_not_prompts_or_tool_results():
    _, tok = load_model("tiny-random:llama", device=torch.device("cpu"))
    ids, mask = encode(tok, CONVERSATIONS[1]["messages"])
    learned = tok.decode([i for i, m in zip(ids, mask) if m])
    context = tok.decode([i for i, m in zip(ids, mask) if not m])
    assert learned == "calc<|im_end|>aa<|im_end|>"  # each message's content and its end of turn, not the newline after it
    assert "RESULT" in context and "Repeat aa" in context and "<|im_start|>assistant\n" in context
    assert encode(tok, CONVERSATIONS[1]["messages"], max_length=5) == (ids[:5], mask[:5])


def test_it_refuses_a_template_that_renders_a_conversation_s_start_differently():
    _, tok = load_model("tiny-random:llama", device=torch.device("cpu"))
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% if loop.last %}!{% endif %}{% endfor %}"
    with pytest.raises(ValueError, match="differently"):
        encode(tok, CONVERSATIONS[1]["messages"])


# -- a run -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("specialization", ["lora", "full", "prompt", "single"])
def test_it_trains_each_agent_on_its_own_turns(make_config, tmp_path, specialization):
    config = sft_config(make_config, tmp_path, specialization, **{"optim.steps": 2})
    seen = []

    class Sink(NullSink):
        def metrics(self, m):
            seen.append(m)

    from training.policies import build_policies

    before = {n: p.detach().clone() for n, p in build_policies(config, device=torch.device("cpu")).policies[
        "writer" if specialization in ("lora", "full") else "shared"].model.named_parameters()}
    result = train(config, out_dir=tmp_path / "out", sink=Sink())

    assert result.status == "succeeded" and result.step == 2
    agents = {"single": {"writer"}}.get(specialization, {"writer", "echo"})
    assert set(seen[-1].agents) == agents
    for values in seen[-1].agents.values():
        assert values["loss"] > 0 and 0 <= values["token_accuracy"] <= 1 and values["tokens"] > 0
    from safetensors.torch import load_file

    folder = tmp_path / "out" / "checkpoints" / "step-000002" / ("writer" if specialization in ("lora", "full") else "shared")
    if specialization == "lora":
        saved = load_file(str(folder / "adapter_model.safetensors"))
        moved = [k for k, v in saved.items() if "lora_B" in k and v.abs().sum() > 0]  # B starts at zero
        assert moved
    else:
        saved = load_file(str(folder / "model.safetensors"))
        assert any(not torch.equal(saved[k], before[k]) for k in saved if k in before)


def test_a_frozen_agent_is_not_trained(make_config, tmp_path):
    data = sft_config(make_config, tmp_path).to_dict()
    data["topology"]["agents"][1]["trainable"] = False
    seen = []

    class Sink(NullSink):
        def metrics(self, m):
            seen.append(m)

    train_sft(RunConfig.from_dict(data), out_dir=tmp_path / "out", sink=Sink())
    assert set(seen[-1].agents) == {"writer"}


def test_the_cli_runs_an_sft_config(make_config, tmp_path, capsys):
    from training.__main__ import main

    config = sft_config(make_config, tmp_path, "single", **{"optim.steps": 1, "eval.every": 1})
    (tmp_path / "cfg.yaml").write_text(config.to_yaml(), encoding="utf-8")
    assert main(["run", str(tmp_path / "cfg.yaml"), "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr()
    assert "succeeded: 1 steps" in out.out and "held-out team success: step 0" in out.out
    line = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"loss", "token_accuracy"} <= line["agents"]["writer"].keys()


def test_its_micro_batches_bound_rows_and_padded_tokens_and_the_step_is_the_same(make_config, tmp_path, monkeypatch):
    """`optim.micro_batch_tokens` bounds an SFT micro-batch as it bounds a GRPO one (rows x the
    longest row; a row longer than the budget alone), and the accumulated step is the one-pass step."""
    from training import sft
    from training.policies import build_policies
    from training.sft import Example, examples_for, micro_batches, update_policy

    passes = []
    forward = sft.token_nll
    monkeypatch.setattr(sft, "token_nll", lambda model, b: passes.append(b["input_ids"].shape) or forward(model, b))

    rows = [Example("a", tuple(range(n)), (1,) * n, i) for i, n in enumerate([10, 30, 20, 40, 5])]
    assert [[e.line for e in m] for m in micro_batches(rows, size=3, budget=60)] == [[0, 1], [2], [3], [4]]
    assert [[e.line for e in m] for m in micro_batches(rows, size=2, budget=1000)] == [[0, 1], [2, 3], [4]]
    assert [len(m) for m in micro_batches(rows, size=8, budget=25)] == [1, 1, 1, 1, 1]

    config = sft_config(make_config, tmp_path)
    conversations = by_agent(read_conversations(config.sft.path), config)
    after = {}
    for budget in (64, 100_000):  # one row a pass, all rows in one pass
        torch.manual_seed(0)
        policies = build_policies(config.replace(**{"optim.micro_batch_tokens": budget}), device=torch.device("cpu"))
        policy = policies.policies["writer"]
        batch = examples_for(config, conversations, policy) * 3
        passes.clear()
        stats = update_policy(policy, batch, config.replace(**{"optim.micro_batch_tokens": budget}), step=1)
        assert len(passes) == (len(batch) if budget == 64 else 1) and all(rows * width <= budget or rows == 1 for rows, width in passes)
        after[budget] = (stats["writer"]["loss"], {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad})
    (loss_small, small), (loss_one, one) = after[64], after[100_000]
    assert loss_small == pytest.approx(loss_one, rel=1e-5) and small.keys() == one.keys()
    for name in small:
        torch.testing.assert_close(small[name], one[name], rtol=1e-4, atol=1e-6, msg=name)

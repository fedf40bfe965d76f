"""Length rules mean the same thing for a turn with tool segments as for one without:
`max_new_tokens` caps each generation (a segment), so a candidate is truncated or overlong only
when one of its segments ran into the cap, whatever the turn's total; Dr. GRPO's constant is the
most tokens a turn can hold; `completion_len` counts the model's tokens, `segment_len` what the
cap judges."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch

from agents.base import State
from agents.tools import ToolCall
from training import collect, metrics, shaping, trainer, update
from training.config import RunConfig
from training.events import NullSink
from training.generation import Generation
from training.rollout import Candidate, Episode, Turn
from training.tool_turns import _Exchange

RESULT = (900, 901, 902, 903, 904)  # a tool result's tokens, spliced between the segments


def segment(n: int, *, truncated: bool = False, start: int = 1) -> Generation:
    return Generation(tuple(range(start, start + n)), f"{n} tokens", truncated=truncated)


def tool_generation(*lengths: int, truncated_last: bool = False) -> Generation:
    """A turn of len(lengths) segments with a tool result after each but the last."""
    segs = [segment(n, truncated=truncated_last and i == len(lengths) - 1, start=10 * i) for i, n in enumerate(lengths)]
    calls = [ToolCall("calculator", {"expression": "1"}, result="1") for _ in lengths[:-1]]
    return _Exchange(segments=segs, results=[RESULT] * (len(lengths) - 1), calls=calls).generation()


def candidate(g: Generation, reward: float = 0.0) -> Candidate:
    return Candidate(g, team=0.0, local=reward, reward=reward)


def episodes_of(*groups: list[Candidate], agent: str = "writer") -> list[Episode]:
    return [Episode(f"t{i}", {}, [Turn(0, agent, agent, "p", (1,), cands, 0, (f"t{i}", 0, agent))], State(task_id=f"t{i}", row={}))
            for i, cands in enumerate(groups)]


def test_a_tool_turn_records_each_segments_length_and_is_truncated_only_when_a_segment_was():
    g = tool_generation(84, 53)
    assert g.segment_tokens == (84, 53) and g.model_tokens == 137 and g.longest_segment == 84
    assert g.truncated is False  # 137 tokens under a cap of 100, but no generation was cut
    assert tool_generation(84, 100, truncated_last=True).truncated is True
    plain = segment(60)
    assert plain.segment_tokens == () and plain.longest_segment == 60


def test_the_overlong_penalty_judges_each_segment_against_the_cap(make_config):
    config = make_config("single", **{"generation.max_new_tokens": 100, "grpo.overlong_cache": 10})
    tools = candidate(tool_generation(84, 53), 1.0)  # the case: 84 + 53 under a cap of 100
    near = candidate(tool_generation(20, 95), 1.0)  # one segment within the cache: 95 -> -0.5
    cut = candidate(tool_generation(30, 100, truncated_last=True), 1.0)  # one segment hit the cap -> -1
    plain = candidate(segment(95), 1.0)  # the same rule without tools
    shaping.shape_overlong(episodes_of([tools, near, cut, plain]), config)
    assert [c.reward for c in (tools, near, cut, plain)] == pytest.approx([1.0, 0.5, 0.0, 0.5])


def test_under_independent_sampling_a_trajectorys_penalties_add_up_and_every_turn_shares_them(make_config):
    config = make_config("single", **{"generation.max_new_tokens": 100, "grpo.overlong_cache": 10, "grpo.sampling": "independent"})
    first, second = candidate(segment(95), 2.0), candidate(tool_generation(40, 97), 2.0)  # -0.5 and -0.7
    ep = Episode("t", {}, [Turn(0, "writer", "writer", "p", (1,), [first], 0, ("t", "writer")),
                           Turn(1, "writer", "writer", "p", (1,), [second], 0, ("t", "writer"))], State(task_id="t", row={}))
    shaping.shape_overlong([ep], config)
    assert first.reward == second.reward == pytest.approx(2.0 - 0.5 - 0.7)


def test_mask_truncated_masks_a_candidate_whose_segment_hit_the_cap_not_one_whose_turn_is_long(make_config, monkeypatch):
    config = make_config("single", **{"generation.max_new_tokens": 100, "grpo.mask_truncated": True})
    cands = [candidate(tool_generation(84, 53), 1.0), candidate(tool_generation(30, 100, truncated_last=True), 0.0), candidate(segment(10), 0.5)]
    seen: list[list[update.Sample]] = []
    monkeypatch.setattr(trainer, "update_policy", lambda policy, samples, *a, **kw: seen.append(samples) or {})
    monkeypatch.setattr(collect, "_rollout", lambda sampler, batch: episodes_of(cands))
    policy = type("P", (), {"agents": ("writer",)})()
    sampler = type("S", (), {
        "config": config, "dist": trainer.Dist(), "engine": None, "stats": type("G", (), {"tokens": 0, "seconds": 0.0})(),
        "policies": type("PS", (), {"trainable": lambda self: [policy], "policies": {}})(), "train_temperature": lambda self, a: 1.0,
        "placement": None,
    })()
    trainer.train_step(sampler, [("t", {})], 1, NullSink())
    assert [s.masked for s in seen[0]] == [False, True, False]


def tool_config(make_config, **overrides) -> RunConfig:
    data = make_config("lora").to_dict()
    data["topology"]["agents"][0]["tools"] = ["calculator"]
    data["generation"].update(max_new_tokens=50, max_tool_calls=2)
    return RunConfig.from_dict(data).replace(**overrides) if overrides else RunConfig.from_dict(data)


def test_dr_grpos_constant_is_the_most_tokens_a_turn_can_hold(make_config):
    config = tool_config(make_config)
    assert update.completion_budget(config, "writer") == 150  # 3 segments of at most 50 (2 calls)
    assert update.completion_budget(config, "echo") == 50
    assert update.completion_budget(config.replace(**{"generation.max_tool_calls": 0}), "writer") == 50


def test_the_dr_grpo_update_of_a_tool_agent_divides_by_its_turn_budget(make_config, monkeypatch):
    from training.policies import build_policies

    config = tool_config(make_config, **{"grpo.loss_type": "dr_grpo"})
    lengths: list[int] = []
    real = update.policy_loss
    monkeypatch.setattr(update, "policy_loss", lambda *a, **kw: lengths.append(kw["max_completion_length"]) or real(*a, **kw))
    policy = build_policies(config, device=torch.device("cpu")).for_agent("writer")
    samples = [update.Sample("writer", (1, 2, 3), (5, 6, 7, 8), 1.0, mask=(1, 0, 0, 1)), update.Sample("writer", (1, 2, 3), (9, 10), -1.0)]
    update.update_policy(policy, samples, config, step=1)
    assert lengths and set(lengths) == {150}


def test_the_length_metrics_count_the_models_tokens_and_the_longest_segment(make_config):
    cands = [candidate(tool_generation(84, 53), 1.0), candidate(segment(40), 0.0)]
    eps = episodes_of(cands)
    pairs = [(t, c) for ep in eps for t in ep.turns for c in t.candidates]
    values = metrics.rollout_metrics(eps, pairs, torch.tensor([1.0, 0.0]), [t.group for t, _ in pairs], defaultdict(dict))
    assert values["completion_len"] == pytest.approx((137 + 40) / 2)  # tool results left out
    assert values["segment_len"] == pytest.approx((84 + 40) / 2)
    assert values["truncated"] == 0.0 and values["ended"] == 1.0

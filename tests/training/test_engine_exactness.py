"""Corners where the engine must match GRPO's definition exactly (issue: "exact in every corner")."""

import pytest
import torch

from training import shaping, update
from training.collect import step_tasks
from training.config import ConfigError, RunConfig
from training.data import batch_indices
from training.policies import build_policies
from training.update import Sample, update_policy


def test_it_gives_every_episode_of_a_step_its_own_group_key(make_config):
    """10 rows, 4 tasks a step: steps that cross an epoch boundary draw a task twice. Each of
    its episodes must still be its own GRPO group (the id is the key's first part)."""
    config = make_config().replace(**{"optim.tasks_per_step": 4, "seed": 3})
    tasks = [(str(i), {"q": i}) for i in range(10)]
    crossing = [s for s in range(1, 201) if len(set(batch_indices(10, 4, s, 3))) < 4]
    assert crossing, "the data order never repeats a task within a step: the test proves nothing"
    for step in range(1, 201):
        ids = [tid for tid, _ in step_tasks(tasks, config, step)]
        assert len(set(ids)) == len(ids), (step, ids)
        assert [tid.split("@")[0] for tid in ids] == [str(i) for i in batch_indices(10, 4, step, 3)]


def test_dr_grpo_divides_by_the_configured_completion_cap_not_the_longest_completion(make_config, monkeypatch):
    config = make_config("lora").replace(**{"grpo.loss_type": "dr_grpo", "generation.max_new_tokens": 8})
    config = RunConfig.from_dict({**config.to_dict()} | {"topology": {**config.to_dict()["topology"],
                                  "agents": [{"name": "writer", "role": "writer", "max_new_tokens": 24}, {"name": "echo", "role": "echo"}]}})
    policy = build_policies(config, device=torch.device("cpu")).for_agent("writer")
    seen = []
    real = update.policy_loss
    monkeypatch.setattr(update, "policy_loss", lambda *a, **kw: seen.append(kw["max_completion_length"]) or real(*a, **kw))
    tok = policy.tokenizer
    prompt = tuple(tok("hello there", add_special_tokens=False)["input_ids"])
    samples = [Sample("writer", prompt, (5, 6, 7), advantage=1.0), Sample("writer", prompt, (5,), advantage=-1.0)]

    update_policy(policy, samples, config, step=1)

    assert seen and set(seen) == {24}  # the writer's own cap; the longest completion here is 3 tokens


def test_it_refuses_greedy_sampling_for_a_group_of_candidates(make_config):
    data = make_config().to_dict()
    data["generation"]["temperature"] = 0.0
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict(data)
    assert err.value.field == "generation.temperature" and "grpo.k=4" in str(err.value)


def test_it_names_the_agent_whose_own_temperature_is_zero(make_config):
    data = make_config().to_dict()
    data["topology"]["agents"][1]["temperature"] = 0.0
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict(data)
    assert err.value.field == "topology.agents[1].temperature" and "'echo'" in str(err.value)


def test_greedy_sampling_is_fine_for_a_frozen_agent(make_config):
    data = make_config().to_dict()
    data["topology"]["agents"][1].update(temperature=0.0, trainable=False)
    RunConfig.from_dict(data)


@pytest.mark.parametrize(("disable", "first_ratio_is_one"), [(True, True), (False, False)])
def test_with_dropout_disabled_the_first_pass_ratio_is_exactly_one(make_config, monkeypatch, disable, first_ratio_is_one):
    """num_iterations=2 with LoRA dropout: the old log-probs and the first pass's log-probs agree
    only when the update runs without dropout (TRL's disable_dropout)."""
    config = make_config("lora").replace(**{"grpo.num_iterations": 2, "lora.dropout": 0.5, "grpo.disable_dropout": disable})
    torch.manual_seed(0)
    policy = build_policies(config, device=torch.device("cpu")).for_agent("writer")
    with torch.no_grad():  # a trained adapter: LoRA's B starts at zero, and dropout before a zero matrix changes nothing
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    ratios = []
    real = update.policy_loss

    def spy(logp, old_logp, *a, **kw):
        ratios.append(torch.exp(logp.detach() - old_logp.detach()))
        return real(logp, old_logp, *a, **kw)

    monkeypatch.setattr(update, "policy_loss", spy)
    tok = policy.tokenizer
    prompt = tuple(tok("hello there, how are you", add_special_tokens=False)["input_ids"])
    samples = [Sample("writer", prompt, (5, 6, 7, 8), advantage=1.0), Sample("writer", prompt, (9, 10, 11), advantage=-1.0)]

    update_policy(policy, samples, config, step=1)

    first = ratios[0]
    assert torch.allclose(first, torch.ones_like(first), atol=1e-6) is first_ratio_is_one


def test_equal_reward_groups_keep_their_kl_term_when_beta_is_positive():
    from types import SimpleNamespace as NS

    cands = [(NS(group=("t@1", 0, "a")), NS(reward=r)) for r in (1.0, 1.0)] + [(NS(group=("u@1", 0, "a")), NS(reward=r)) for r in (0.0, 1.0)]
    assert shaping.groups_to_update(cands, beta=0.0) == {("u@1", 0, "a")}
    assert shaping.groups_to_update(cands, beta=0.04) == {("t@1", 0, "a"), ("u@1", 0, "a")}

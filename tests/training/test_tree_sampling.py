"""AT-GRPO tree sampling: K candidates per (task, turn, agent) from the identical prompt."""

import torch

from agents.envs import load_environment
from training.policies import build_policies
from training.rollout import Sampler, rollout_independent, rollout_tree


def _sampler(config):
    env = load_environment(config.topology.environment, **config.topology.env_args)
    policies = build_policies(config, device=torch.device("cpu"))
    return Sampler(env, policies, config, torch.Generator().manual_seed(0)), env


def test_it_samples_k_candidates_from_the_identical_prompt(make_config, monkeypatch):
    config = make_config("lora", **{"grpo.k": 3})
    sampler, env = _sampler(config)
    seen = []
    original = sampler.sample

    def spy(agent, prompt_ids, n, temperature):
        groups = original(agent, prompt_ids, n, temperature)
        seen.extend((agent, p, len(g)) for p, g in zip(prompt_ids, groups))
        return groups

    monkeypatch.setattr(sampler, "sample", spy)
    tasks = [(f"t{i}", row) for i, row in enumerate(env.generate(2, seed=1))]
    episodes = rollout_tree(sampler, tasks)

    assert all(n == 3 for _, _, n in seen)
    for ep in episodes:
        assert [t.agent for t in ep.turns] == ["writer", "echo"]
        for turn in ep.turns:
            assert len(turn.candidates) == 3
            assert turn.group == (ep.task_id, turn.index, turn.agent)
            assert (turn.agent, turn.prompt_ids, 3) in seen  # one prompt served the whole group
            best = max(c.reward for c in turn.candidates)
            assert turn.candidates[turn.chosen].reward == best
    # the episode continued from the chosen candidate: the echo agent saw the writer's chosen text
    first = episodes[0]
    chosen_text = first.turns[0].candidates[first.turns[0].chosen].generation.text
    assert chosen_text in first.turns[1].prompt


def test_it_runs_k_independent_trajectories_per_task_for_plain_grpo(make_config):
    config = make_config("lora", **{"grpo.sampling": "independent", "grpo.k": 3})
    sampler, env = _sampler(config)
    tasks = [(f"t{i}", row) for i, row in enumerate(env.generate(2, seed=1))]
    episodes = rollout_independent(sampler, tasks, k=3)
    assert len(episodes) == 6
    assert len({id(ep) for ep in episodes}) == 6
    for ep in episodes:
        assert all(len(t.candidates) == 1 and t.group == (ep.task_id, t.agent) for t in ep.turns)

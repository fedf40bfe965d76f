"""Each turn records what generated its candidates, read from the model at generation time: the
adapter PEFT had active (so a candidate served by the wrong adapter shows), or the shared model."""

from __future__ import annotations

import contextlib

import torch

from agents.envs import load_environment
from training.policies import Policy, build_policies
from training.rollout import Sampler, rollout_tree


def _episode(config):
    env = load_environment(config.topology.environment, **config.topology.env_args)
    sampler = Sampler(env, build_policies(config, device=torch.device("cpu")), config, torch.Generator().manual_seed(0))
    try:
        (episode,) = rollout_tree(sampler, [("t0", env.generate(1, seed=1)[0])])
    finally:
        sampler.pool.shutdown()
    return episode


def test_each_turn_names_the_adapter_that_served_it(make_config):
    episode = _episode(make_config("lora", **{"grpo.k": 2}))
    assert [(t.agent, t.policy) for t in episode.turns] == [
        ("writer", "adapter writer on tiny-random:llama"), ("echo", "adapter echo on tiny-random:llama")]
    assert episode.to_dict(1)["turns"][1]["policy"] == "adapter echo on tiny-random:llama"


def test_a_shared_policy_says_so(make_config):
    episode = _episode(make_config("prompt", **{"grpo.k": 2}))
    assert {t.policy for t in episode.turns} == {"shared model tiny-random:llama"}


def test_an_adapter_left_active_by_mistake_shows(make_config, monkeypatch):
    """A bug that forgot to switch adapters would serve the echo agent with the writer's adapter:
    the turn says what really ran, not what was meant."""
    original = Policy.active

    @contextlib.contextmanager
    def sticky(self):
        if self.adapter == "echo":  # the bug: no set_adapter for echo
            yield self.model
            return
        with original(self) as model:
            yield model

    monkeypatch.setattr(Policy, "active", sticky)
    episode = _episode(make_config("lora", **{"grpo.k": 2}))
    assert [t.policy for t in episode.turns] == ["adapter writer on tiny-random:llama", "adapter writer on tiny-random:llama"]

from pathlib import Path

import pytest

from training.config import RunConfig

TOY = "tests.training.toy_env:LetterEnv"
DENSE_REWARD = "tests.training.toy_env:completion_length"
"""A reward by completion length (`toy_env.completion_length`), registered by the `dense_reward` fixture."""


def toy_config(specialization: str = "lora", **overrides) -> RunConfig:
    agents = [{"name": "writer", "role": "writer"}, {"name": "echo", "role": "echo"}]
    if specialization == "single":
        agents = agents[:1]
    data = {
        "name": "toy",
        "seed": 0,
        "model": {"source": "tiny-random:llama"},
        "topology": {"environment": TOY, "specialization": specialization, "agents": agents, "max_turns": len(agents)},
        "data": {"train_size": 16, "eval_size": 4},
        "grpo": {"k": 4},
        "optim": {"steps": 2, "tasks_per_step": 2, "lr": 1e-2},
        "lora": {"r": 4, "alpha": 8},
        "generation": {"max_new_tokens": 8},
        "eval": {"every": 0, "size": 4},
        "checkpoint": {"every": 0},
    }
    config = RunConfig.from_dict(data)
    return config.replace(**overrides) if overrides else config


@pytest.fixture
def make_config():
    return toy_config


TINY_LORA = Path(__file__).resolve().parents[2] / "configs" / "tiny-lora.yaml"


@pytest.fixture(scope="module")
def lora_checkpoint(tmp_path_factory):
    """(config, checkpoint folder) of configs/tiny-lora.yaml: each agent's LoRA adapter as
    `save_policies` writes it, moved off its zero init so the trained agents differ from the base."""
    import torch

    from training.policies import build_policies, save_policies

    config = RunConfig.load(TINY_LORA)
    policies = build_policies(config, device=torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for policy in policies.policies.values():
            for p in policy.params:
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    folder = tmp_path_factory.mktemp("checkpoint") / "step-000001"
    save_policies(policies, folder)
    return config, folder


@pytest.fixture
def dense_reward():
    """`DENSE_REWARD` registered as a reward plugin for the test: a run's `data.reward_fn` may name it."""
    from agents import plugins

    plugins.register(DENSE_REWARD, kind=plugins.REWARD_FUNCTION)
    yield DENSE_REWARD
    plugins.unregister(DENSE_REWARD, kind=plugins.REWARD_FUNCTION)

import pytest

from training.config import RunConfig

TOY = "tests.training.toy_env:LetterEnv"


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

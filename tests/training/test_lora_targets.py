"""`lora.target_modules` reaches every module it names: an embedding's adapter (peft keeps its
weights as `lora_embedding_A.<adapter>`, no `.weight`) is trained, saved and loaded like a
projection's, and each agent trains only its own."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.training.conftest import DENSE_REWARD
from training.events import NullSink
from training.policies import build_policies, load_policy_weights
from training.trainer import train

TARGETS = ("q_proj", "embed_tokens")

pytestmark = pytest.mark.usefixtures("dense_reward")


def embedding_params(policy):
    return {n: p for n, p in policy.model.named_parameters() if "lora_embedding" in n and n.endswith(f".{policy.adapter}")}


def test_an_embedding_adapter_is_each_agents_own_and_is_trained_saved_and_loaded(make_config, tmp_path):
    config = make_config("lora", **{"lora.target_modules": list(TARGETS), "data.reward_fn": DENSE_REWARD})
    policies = build_policies(config, device=torch.device("cpu"))
    for name in ("writer", "echo"):
        pol = policies.for_agent(name)
        mine = embedding_params(pol)
        assert len(mine) == 2, f"{name}: its embedding adapter's A and B"
        assert {id(p) for p in mine.values()} <= {id(p) for p in pol.params}, f"{name}: the embedding adapter is not trained"
        other = policies.for_agent("echo" if name == "writer" else "writer")
        assert not {id(p) for p in embedding_params(other).values()} & {id(p) for p in pol.params}
    start = {n: p.detach().clone() for pol in policies.trainable() for n, p in embedding_params(pol).items()}

    result = train(config, out_dir=tmp_path, sink=NullSink())
    after = build_policies(config, device=torch.device("cpu"))
    load_policy_weights(after, result.checkpoint)
    moved = {n: p.detach() for pol in after.trainable() for n, p in embedding_params(pol).items()}
    assert moved.keys() == start.keys()
    assert all(not torch.equal(moved[n], start[n]) for n in moved if "lora_embedding_A" in n), "an embedding adapter did not train"
    # Saved, each adapter holds its LoRA weights and not a copy of the base's whole embedding.
    from safetensors import safe_open

    for pol in after.trainable():
        with safe_open(str(Path(result.checkpoint) / pol.name / "adapter_model.safetensors"), "pt") as f:
            keys = list(f.keys())
        assert any("lora_embedding_A" in k for k in keys) and not any("embed_tokens.base_layer" in k or k.endswith("embed_tokens.weight") for k in keys), keys

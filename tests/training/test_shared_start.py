"""A sweep evaluates a starting point once (`training.shared_start`): what its key sees and what it
leaves out. The sweep end to end, a second trial recording the first's step 0, is in
tests/training/test_referential_sweep.py."""

from __future__ import annotations

import os

import torch

from tests.training.conftest import toy_config
from training.shared_start import start_key


def test_the_key_leaves_out_how_a_run_trains_and_sees_what_it_starts_from(tmp_path) -> None:
    base = toy_config()
    key = start_key(base)
    frozen = base.replace(**{"topology.agents": [{"name": "writer", "role": "writer", "trainable": False}, {"name": "echo", "role": "echo"}]})
    for same in (base.replace(**{"optim.lr": 3e-4, "optim.steps": 9, "grpo.k": 8, "eval.every": 5, "checkpoint.every": 1, "name": "other"}), frozen):
        assert start_key(same) == key
    for other in (base.replace(seed=1), base.replace(**{"eval.size": 3}), base.replace(**{"eval.sampled": True}),
                  base.replace(**{"generation.max_new_tokens": 9}), base.replace(**{"topology.agents": [{"name": "writer", "role": "echo"},
                                                                                                          {"name": "echo", "role": "echo"}]})):
        assert start_key(other) != key

    # a warm start: its files are part of the key, so one trained again is evaluated again
    ckpt = tmp_path / "warm" / "checkpoints" / "step-000002"
    (ckpt / "writer").mkdir(parents=True)
    torch.save({"step": 2}, ckpt / "trainer_state.pt")
    weights = ckpt / "writer" / "adapter_model.safetensors"
    weights.write_bytes(b"one")
    warm = base.replace(**{"model.init_from.run": str(tmp_path / "warm"), "model.init_from.step": 2})
    first = start_key(warm)
    assert first != key and start_key(warm) == first
    weights.write_bytes(b"two")
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 1_000_000))
    assert start_key(warm) != first

"""Checkpoints: save (one HF/PEFT folder per policy, or torch distributed checkpoints for sharded
models, plus optimizer, RNG and step state), the resume check, and restore."""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from training import sharding
from training.config import ConfigError, RunConfig, resume_differences
from training.distributed import Dist
from training.events import EventSink
from training.placement import Placement
from training.policies import PolicySet, load_policy_weights, save_policies

STATE_FILE = "trainer_state.pt"

def save_checkpoint(
    out: Path, step: int, policies: PolicySet, generator: torch.Generator, cfg: RunConfig, sink: EventSink, *, dist: Dist | None = None,
    extra: Callable[[Path], None] | None = None,
    placement: Placement | None = None,
) -> str:
    """`out/checkpoints/step-NNNNNN/`: one HF/PEFT folder per policy plus optimizer, RNG and step
    state. Written to a temp folder and renamed, so a crash never leaves half a checkpoint.
    Under a data-parallel launch rank 0 writes it, with every rank's sampling generator."""
    dist = dist or Dist()
    generators = dist.gather(generator.get_state())
    root = out / "checkpoints"
    final = root / f"step-{step:06d}"
    tmp = root / f".step-{step:06d}.tmp"
    if dist.main:
        shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier()
    done = sharding.save_models(policies, tmp, cfg, dist, placement)  # sharded or placed policies, from their own ranks
    dist.barrier()
    if not dist.main:
        dist.barrier()
        return str(final)
    save_policies(policies, tmp, skip=done)
    torch.save(
        {
            "step": step,
            "optimizers": {name: p.optimizer.state_dict() for name, p in policies.policies.items() if p.optimizer and name not in done},
            "generator": generator.get_state(),
            "generators": generators,
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
            "numpy_rng": np.random.get_state(),
            "config": cfg.to_yaml(),
        },
        tmp / STATE_FILE,
    )
    if extra is not None:  # more state written into the folder before it is renamed (`AsyncRollouts.save`)
        extra(tmp)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    if cfg.checkpoint.keep:
        kept = sorted(p for p in root.glob("step-*") if p.is_dir())
        for old in kept[: -cfg.checkpoint.keep]:
            shutil.rmtree(old, ignore_errors=True)
    sink.checkpoint(step, str(final))
    dist.barrier()
    return str(final)

def check_resume(config: RunConfig) -> None:
    """Refuse to resume from a checkpoint whose run had another data order or other groups
    (`training.config.RESUME_EXACT`) unless `checkpoint.allow_config_changes` says so."""
    state_file = Path(str(config.checkpoint.resume_from)) / STATE_FILE
    if config.checkpoint.allow_config_changes or not state_file.is_file():
        return  # restore() says what is wrong with a folder that is no checkpoint
    saved = torch.load(state_file, weights_only=False, map_location="cpu").get("config")
    if not saved:
        return  # a checkpoint from before configs were stored in it
    changed = resume_differences(RunConfig.from_yaml(saved), config.replace(**{"checkpoint.resume_from": None}))
    if changed:
        raise ConfigError(
            "checkpoint.resume_from",
            "this config differs from the checkpoint's in fields a resumed run must keep to replay the same data "
            f"order and groups: {'; '.join(changed[:8])}{' ...' if len(changed) > 8 else ''}. Keep them, or set "
            "checkpoint.allow_config_changes: true to resume anyway",
        )

def restore(
    folder: Path, policies: PolicySet, generator: torch.Generator, *, dist: Dist | None = None, config: RunConfig | None = None,
    placement: Placement | None = None,
) -> int:
    """Load weights, optimizer and RNG state from a checkpoint; return its step. A rank of a
    data-parallel launch takes its own generator when the checkpoint has one for it (saved by a
    launch of the same size); otherwise rank 0 takes the saved one and the others start fresh
    streams from the seed, the step and their rank."""
    dist = dist or Dist()
    state_file = folder / STATE_FILE
    if not state_file.is_file():
        raise FileNotFoundError(f"{folder} is not a Troupe checkpoint (no {STATE_FILE})")
    done = sharding.restore_models(policies, folder, config, dist, placement) if config is not None else set()  # dcp/<policy>/
    load_policy_weights(policies, folder, skip=done)
    state = torch.load(state_file, weights_only=False)
    for name, opt_state in state["optimizers"].items():
        if name in done:
            continue
        opt = policies.policies[name].optimizer
        if opt is not None:
            opt.load_state_dict(opt_state)
    saved = state.get("generators") or [state["generator"]]
    if len(saved) == dist.world:
        generator.set_state(saved[dist.rank])
    elif dist.main:
        generator.set_state(state["generator"])
    else:
        generator.manual_seed(hash((int(state["step"]), dist.rank)) % 2**63)
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    np.random.set_state(state["numpy_rng"])
    return int(state["step"])

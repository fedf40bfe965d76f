"""A rank of the data-parallel update test (started by torch.multiprocessing in test_distributed)."""

import gc
import os
import weakref
from pathlib import Path

import torch
import torch.distributed as torch_dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
from torch.distributed.tensor import DTensor

from tests.training.conftest import toy_config
from training.checkpoints import restore, save_checkpoint
from training.distributed import Dist
from training.events import NullSink
from training.placement import Placement
from training.policies import build_policies
from training.sharding import builds_on_meta, local_share, shard_policies
from training.trainer import train
from training.update import Sample, update_policy


def samples(policy, start: int, n: int) -> list[Sample]:
    """n samples in groups of 2 with different prompts, completions and advantages."""
    out = []
    for i in range(start, start + n):
        prompt = tuple(range(3 + i // 2, 12 + i // 2))
        completion = tuple(range(20 + i, 24 + 2 * i % 5 + i))
        out.append(Sample("writer", prompt, completion, advantage=1.0 if i % 2 else -1.0))
    return out


def sgd(policy):
    """Plain SGD: Adam's first step is about lr * sign(grad), which turns float-rounding
    differences of near-zero gradients into whole steps; SGD compares the summed gradients."""
    policy.optimizer = torch.optim.SGD(policy.params, lr=0.1)
    return policy


def flat_params(policy) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in policy.params])


def fsdp_config(specialization: str, **overrides):
    """The toy config sharded over 2 ranks, micro-batches of 2 samples."""
    return toy_config(specialization, **{"resources.gpus": 2, "resources.parallel": "fsdp", "optim.micro_batch_size": 2, **overrides})


FSDP_SPLIT = (6, 1)
"""The samples of rank 0 and rank 1 in the FSDP update: 3 micro-batches against 1."""


def full_params(policy) -> torch.Tensor:
    """`flat_params` of a sharded policy (gathered: collective)."""
    return torch.cat([(p.full_tensor() if isinstance(p, DTensor) else p).detach().reshape(-1) for p in policy.params])


def rank_main(rank: int, world: int, port: int, out: str, specializations: list[str], one_rank_ckpt: str | None = None) -> None:
    """One update per specialization, in turn, in one process group (one spawn for them all);
    then, with `one_rank_ckpt`, the FSDP cases (`fsdp_cases`)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch_dist.init_process_group("gloo", rank=rank, world_size=world)
    for specialization in specializations:
        torch.manual_seed(0)
        config = toy_config(specialization)
        policy = sgd(build_policies(config, device=torch.device("cpu")).for_agent("writer"))
        # rank r gets samples [4r, 4r+4) of 8; rank 1 also has an odd count (3) to test the weights
        mine = samples(policy, 4 * rank, 4 if rank == 0 else 3)
        stats = update_policy(policy, mine, config, step=1, dist=Dist(rank=rank, world=world))
        torch.save({"params": flat_params(policy), "stats": stats}, f"{out}/{specialization}-rank{rank}.pt")
    if one_rank_ckpt is not None:
        fsdp_cases(rank, world, Path(out), Path(one_rank_ckpt))
    torch_dist.destroy_process_group()


def fsdp_cases(rank: int, world: int, out: Path, one_rank_ckpt: Path) -> None:
    dist = Dist(rank=rank, world=world)
    # 1. an update of each sharded specialization, rank 0 with 3 micro-batches and rank 1 with 1
    for specialization in ("prompt", "lora", "full"):
        torch.manual_seed(0)
        config = fsdp_config(specialization)
        policies = build_policies(config, device=torch.device("cpu"), meta=builds_on_meta(config, dist))  # rank 1: no weights read
        whole = whole_parameters(policies)
        on_meta = all(p.is_meta for pol in policies.policies.values() for p in pol.model.parameters())
        shard_policies(policies, config, dist)
        gc.collect()
        kept = sum(t.untyped_storage().nbytes() for t in (ref() for ref in whole) if t is not None)
        policy = sgd(policies.for_agent("writer"))
        start = 0 if rank == 0 else FSDP_SPLIT[0]
        stats = update_policy(policy, samples(policy, start, FSDP_SPLIT[rank]), config, step=1, dist=dist)
        base = [p for n, p in policy.model.named_parameters() if "lora_" not in n]  # lora: adapters stay whole
        share = (sum(p.to_local().numel() for p in base), sum(p.numel() for p in base))
        assert local_share(policy.model)[1] == sum(p.numel() for p in policy.model.parameters())
        torch.save({"params": full_params(policy), "stats": stats, "share": share, "kept": kept, "on_meta": on_meta}, out / f"fsdp-{specialization}-rank{rank}.pt")
    # 2. a checkpoint of one process resumed on two (1 -> 2), saved again for the test to resume on one (2 -> 1)
    config = fsdp_config("prompt")
    policies = build_policies(config, device=torch.device("cpu"), meta=builds_on_meta(config, dist))
    shard_policies(policies, config, dist)
    generator = torch.Generator().manual_seed(0)
    step = restore(one_rank_ckpt, policies, generator, dist=dist, config=config)
    policy = policies.for_agent("writer")
    resumed = {"step": step, "params": full_params(policy), "optim": optimizer_state(policy, full=True)}
    update_policy(policy, samples(policy, 4 * rank, 4), config, step=step + 1, dist=dist)
    save_checkpoint(out / "resaved", step + 1, policies, generator, config, NullSink(), dist=dist)
    resumed.update(after=full_params(policy), optim_after=optimizer_state(policy, full=True))
    torch.save(resumed, out / f"resumed-rank{rank}.pt")
    # 3. whole runs: a sharded one, and a `full` team placed one agent per rank
    runs = {
        "fsdp-run": fsdp_config("prompt", **{"optim.steps": 1, "optim.tasks_per_step": 2, "eval.every": 1}),
        "placed-run": toy_config("full", **{"resources.gpus": 2, "resources.parallel": "fsdp", "resources.placement": {"writer": 1, "echo": 1},
                                            "optim.steps": 2, "eval.every": 2}),
    }
    for name, run_config in runs.items():
        sink = Recorder() if rank == 0 else NullSink()
        result = train(run_config, out_dir=out / name, sink=sink, dist=dist)
        if rank == 0:
            torch.save({"result": result, "events": sink.events}, out / f"{name}.pt")
    placement = Placement.build(runs["placed-run"], dist)
    assert placement is not None
    held = build_policies(runs["placed-run"], device=torch.device("cpu"), only=placement.held())
    torch.save({name: pol.model is not None for name, pol in held.policies.items()}, out / f"placed-held-rank{rank}.pt")


def whole_parameters(policies) -> list[weakref.ref]:
    """Weak references to the whole (unsharded) parameters of every model and reference model,
    adapters left out (FSDP leaves them whole)."""
    models = [m for pol in policies.policies.values() for m in (pol.model, pol.ref_model) if m is not None]
    return [weakref.ref(p) for m in models for n, p in m.named_parameters() if "lora_" not in n]


def optimizer_state(policy, *, full: bool = False) -> dict[str, dict[str, torch.Tensor]]:
    """Parameter name -> AdamW's exp_avg and exp_avg_sq (whole tensors: `full` gathers a sharded model's)."""
    options = StateDictOptions(full_state_dict=True) if full else None
    state = get_optimizer_state_dict(policy.model, policy.optimizer, options=options)["state"]
    return {name: {k: v for k, v in s.items() if k != "step"} for name, s in state.items()}


class Recorder(NullSink):
    """Rank 0's events, picklable."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def metrics(self, m) -> None:
        self.events.append(("metrics", m.step, m.values, m.agents))

    def evaluation(self, result) -> None:
        self.events.append(("evaluation", result["step"], result))

    def checkpoint(self, step, path) -> None:
        self.events.append(("checkpoint", step, path))

    def rollouts(self, step, episodes) -> None:
        self.events.append(("rollouts", step, episodes))

"""A rank of the data-parallel update test (started by torch.multiprocessing in test_distributed)."""

import os

import torch
import torch.distributed as torch_dist

from tests.training.conftest import toy_config
from training.distributed import Dist
from training.policies import build_policies
from training.trainer import Sample, update_policy


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


def rank_main(rank: int, world: int, port: int, out: str, specializations: list[str]) -> None:
    """One update per specialization, in turn, in one process group (one spawn for them all)."""
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
    torch_dist.destroy_process_group()

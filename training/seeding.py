"""Seeding a run: the global generators (Python, NumPy, torch) from `seed`, and the run's sampling
generator, one stream per rank."""

from __future__ import annotations

import random

import numpy as np
import torch

from training.distributed import Dist


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def run_generator(seed: int, dist: Dist) -> torch.Generator:
    """The run's sampling generator on this rank: `seed` on rank 0, a stream of its own on each other rank."""
    return torch.Generator().manual_seed(seed + 1_000_003 * dist.rank)

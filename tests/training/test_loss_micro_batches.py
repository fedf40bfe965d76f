"""A step that accumulates micro-batches weighs each one's loss (`micro_batch_weight`) so that the
sum equals the whole batch's loss, for every `grpo.loss_type`: one table (`LOSS_AGGREGATION`)
says how each averages, for the loss and the weights alike."""

from __future__ import annotations

import pytest
import torch

from tests.training.test_grpo import random_batch
from training.config import LOSS_TYPES
from training.grpo import micro_batch_weight, policy_loss


@pytest.mark.parametrize("loss_type", [t for t in LOSS_TYPES if t != "bnpo"])
def test_the_weighted_micro_batches_add_up_to_the_whole_batch(loss_type: str) -> None:
    d = random_batch(b=5, t=6)
    d["mask"][1, 3:] = 0.0  # rows of different lengths, so a token share differs from a row share
    d["mask"][4, 1:] = 0.0

    def loss(rows: slice) -> torch.Tensor:
        return policy_loss(d["logp"][rows], d["old"][rows], d["adv"][rows], d["mask"][rows], loss_type=loss_type,
                           max_completion_length=6)

    whole = loss(slice(None))
    n_tokens = int(d["mask"].sum())
    parts = [slice(0, 2), slice(2, 3), slice(3, 5)]
    summed = sum(float(loss(rows)) * micro_batch_weight(loss_type, d["mask"][rows], n_samples=5, n_tokens=n_tokens)
                 for rows in parts)
    assert summed == pytest.approx(float(whole), rel=1e-5, abs=1e-7)


def test_bnpo_is_trls_the_mean_of_the_micro_batches_token_means_not_dapos_token_mean() -> None:
    """TRL's `bnpo` normalises each micro-batch by its own tokens and averages over the accumulation
    steps (and ranks); `dapo` divides by the whole batch's tokens. The names mean what TRL's mean."""
    d = random_batch(b=5, t=6)
    d["mask"][1, 3:] = 0.0
    d["mask"][4, 1:] = 0.0
    parts = [slice(0, 2), slice(2, 3), slice(3, 5)]

    def step(loss_type: str) -> float:
        return sum(float(policy_loss(d["logp"][r], d["old"][r], d["adv"][r], d["mask"][r], loss_type=loss_type))
                   * micro_batch_weight(loss_type, d["mask"][r], n_samples=5, n_tokens=int(d["mask"].sum()), n_micro=len(parts))
                   for r in parts)

    means = [float(policy_loss(d["logp"][r], d["old"][r], d["adv"][r], d["mask"][r], loss_type="dapo")) for r in parts]
    assert step("bnpo") == pytest.approx(sum(means) / len(means), rel=1e-6)
    assert step("bnpo") != pytest.approx(step("dapo"), rel=1e-3)


def test_an_unknown_loss_type_is_named():
    d = random_batch()
    with pytest.raises(ValueError, match="unknown loss_type 'ppo'"):
        micro_batch_weight("ppo", d["mask"], n_samples=1, n_tokens=1)

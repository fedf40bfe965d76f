"""A tiny random model learns the toy task on CPU: mean reward clearly rises."""

import pytest

from training.events import NullSink
from training.trainer import train


class Collect(NullSink):
    def __init__(self):
        self.steps = []

    def metrics(self, m):
        self.steps.append(m)


@pytest.mark.slow
def test_it_learns_to_write_the_rewarded_letter(make_config, tmp_path):
    config = make_config(
        "single",
        **{"optim.steps": 30, "optim.tasks_per_step": 4, "optim.lr": 3e-3, "grpo.k": 8, "generation.max_new_tokens": 8},
    )
    sink = Collect()
    result = train(config, out_dir=tmp_path, sink=sink)
    rewards = [m.values["reward/total"] for m in sink.steps]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert result.status == "succeeded" and result.step == 30
    assert last > first + 0.3, f"reward did not rise: {first:.3f} -> {last:.3f}"

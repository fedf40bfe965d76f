"""Learning-rate schedules and AdamW settings from the config, against transformers' schedulers."""

import pytest
import torch
from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup

from training.config import ConfigError, RunConfig
from training.policies import build_policies
from training.update import lr_at

REFERENCES = {"constant": get_constant_schedule_with_warmup, "linear": get_linear_schedule_with_warmup,
              "cosine": get_cosine_schedule_with_warmup}


def _transformers_lrs(schedule: str, *, lr: float, steps: int, warmup: int) -> list[float]:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    make = REFERENCES[schedule]
    sched = make(opt, warmup) if schedule == "constant" else make(opt, warmup, steps)
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
@pytest.mark.parametrize("warmup", [0, 3])
def test_it_matches_transformers_after_the_warm_up(schedule, warmup):
    steps, lr = 20, 1e-4
    ours = [lr_at(lr, s, steps=steps, warmup_steps=warmup, schedule=schedule) for s in range(1, steps + 1)]
    theirs = _transformers_lrs(schedule, lr=lr, steps=steps, warmup=warmup)
    assert ours[warmup:] == pytest.approx(theirs[warmup:], rel=1e-9, abs=1e-15)
    assert ours[:warmup] == pytest.approx([lr * s / warmup for s in range(1, warmup + 1)])  # never lr 0 at step 1
    if schedule != "constant":
        assert ours[-1] < ours[warmup] / 5


def test_adamw_takes_its_betas_and_eps_from_the_config(make_config):
    config = make_config("lora").replace(**{"optim.adam_beta1": 0.8, "optim.adam_beta2": 0.95, "optim.adam_eps": 1e-6})
    opt = build_policies(config, device=torch.device("cpu")).for_agent("writer").optimizer
    assert opt.param_groups[0]["betas"] == (0.8, 0.95) and opt.param_groups[0]["eps"] == 1e-6


@pytest.mark.parametrize(("field", "value"), [("lr_schedule", "step"), ("adam_beta2", 1.0), ("adam_eps", 0.0)])
def test_it_names_a_bad_optimizer_field(make_config, field, value):
    data = make_config().to_dict()
    data["optim"][field] = value
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict(data)
    assert err.value.field == f"optim.{field}"

"""GSPO, CISPO and two-sided clipping against naive Python-loop references, values and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from tests.training.test_grpo import random_batch
from training.grpo import policy_loss

# -- naive references ------------------------------------------------------------------------------


def ref_variant_loss(logp, old, adv, mask, *, lo, hi, level="token", delta=None, cispo_cap=None):
    """Token mean over the batch (dapo aggregation), one Python float per token."""
    total, count = 0.0, 0.0
    for i, row in enumerate(logp):
        n = sum(mask[i])
        seq_log_ratio = sum((row[t] - old[i][t]) * mask[i][t] for t in range(len(row))) / max(n, 1.0)
        for t, lp in enumerate(row):
            if not mask[i][t]:
                continue
            ratio = math.exp(seq_log_ratio) if level == "sequence" else math.exp(lp - old[i][t])
            if cispo_cap is not None:
                loss = -min(ratio, cispo_cap) * adv[i] * lp
            else:
                unclipped = (min(ratio, delta) if delta is not None else ratio) * adv[i]
                loss = -min(unclipped, min(max(ratio, 1 - lo), 1 + hi) * adv[i])
            total += loss
            count += 1
    return total / max(count, 1.0)


CASES = {
    "gspo": dict(ratio_level="sequence", eps_low=3e-4, eps_high=4e-4),
    "gspo_wide": dict(ratio_level="sequence", eps_low=0.2, eps_high=0.28),
    "two_sided": dict(delta=1.5, eps_low=0.2, eps_high=0.28),
    "cispo": dict(loss_type="cispo", cispo_cap=1.3, eps_low=0.2, eps_high=0.28),
}


def _ref_kwargs(case):
    return dict(lo=case["eps_low"], hi=case["eps_high"], level=case.get("ratio_level", "token"),
                delta=case.get("delta"), cispo_cap=case.get("cispo_cap") if case.get("loss_type") == "cispo" else None)


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_variant_loss_equals_the_naive_reference(name, seed):
    case = {"loss_type": "dapo", **CASES[name]}
    d = random_batch(seed)
    got = policy_loss(d["logp"], d["old"], d["adv"], d["mask"], **case)
    want = ref_variant_loss(d["logp"].tolist(), d["old"].tolist(), d["adv"].tolist(), d["mask"].tolist(), **_ref_kwargs(case))
    assert float(got) == pytest.approx(want, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("name", CASES)
def test_the_variant_gradient_equals_the_naive_references(name):
    """d loss / d logp by autograd, against central differences of the naive reference (CISPO's
    weight is detached: its reference holds the ratio fixed while logp moves)."""
    case = {"loss_type": "dapo", **CASES[name]}
    d = random_batch(3)
    logp = d["logp"].double().requires_grad_(True)
    policy_loss(logp, d["old"].double(), d["adv"].double(), d["mask"].double(), **case).backward()
    base, old, adv, mask = d["logp"].double().tolist(), d["old"].tolist(), d["adv"].tolist(), d["mask"].tolist()
    kwargs = _ref_kwargs(case)
    h = 1e-6
    for i, t in [(0, 0), (0, 6), (1, 2), (3, 4)]:
        def at(x, i=i, t=t):
            moved = [row[:] for row in base]
            moved[i][t] = x
            if kwargs["cispo_cap"] is not None:  # the detached weight: evaluated at the base point
                ratio = math.exp(base[i][t] - old[i][t])
                n = sum(sum(r) for r in mask)
                return -min(ratio, kwargs["cispo_cap"]) * adv[i] * x / n
            return ref_variant_loss(moved, old, adv, mask, **kwargs)

        numeric = (at(base[i][t] + h) - at(base[i][t] - h)) / (2 * h)
        assert float(logp.grad[i, t]) == pytest.approx(numeric, rel=1e-4, abs=1e-7), (i, t)


def test_gspo_gives_every_token_of_a_completion_the_same_ratio():
    d = random_batch(4)
    logp = d["logp"].clone().requires_grad_(True)
    policy_loss(logp, d["old"], torch.ones(5), d["mask"], ratio_level="sequence", eps_low=10.0, eps_high=10.0).backward()
    row = logp.grad[0]  # a fully unmasked row, no clipping: every token's gradient is -s_i / |y_i| / N
    assert torch.allclose(row, row[0].expand_as(row))


def test_two_sided_clipping_caps_a_negative_advantages_runaway_ratio():
    logp, old = torch.tensor([[0.0]]), torch.tensor([[-3.0]])  # ratio e^3 ~ 20
    mask, adv = torch.ones(1, 1), torch.tensor([-1.0])
    plain = policy_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    capped = policy_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28, delta=2.0)
    assert float(plain) == pytest.approx(math.exp(3.0), rel=1e-5) and float(capped) == pytest.approx(2.0)


@pytest.mark.parametrize("overrides", [
    {"grpo.ratio_level": "sequence", "grpo.eps_low": 3e-4, "grpo.eps_high": 4e-4},
    {"grpo.loss_type": "cispo", "grpo.num_iterations": 2},
    {"grpo.delta": 2.0, "optim.lr_schedule": "cosine", "optim.warmup_steps": 1},
])
def test_a_run_trains_with_each_variant_from_the_config(make_config, tmp_path, overrides):
    from training.events import NullSink
    from training.trainer import train

    result = train(make_config("lora", **overrides), out_dir=tmp_path, sink=NullSink())
    assert result.status == "succeeded" and result.step == 2


@pytest.mark.parametrize("length", [0, 10, 12, 13, 15, 16, 17, 40])
def test_the_soft_overlong_penalty_follows_dapos_piecewise_formula(length):
    from training.grpo import soft_overlong_penalty

    l_max, l_cache = 16, 4
    if length <= l_max - l_cache:
        want = 0.0
    elif length <= l_max:
        want = ((l_max - l_cache) - length) / l_cache
    else:
        want = -1.0
    assert soft_overlong_penalty(length, max_len=l_max, cache=l_cache) == pytest.approx(want)


def test_a_masked_truncated_completion_leaves_the_loss_and_its_token_count(make_config, monkeypatch):
    """With one completion masked, the update equals the update without it (dapo: token mean)."""
    from training import update
    from training.policies import build_policies
    from training.update import Sample, update_policy

    config = make_config("lora").replace(**{"grpo.mask_truncated": True})
    losses = []
    real = update.policy_loss
    monkeypatch.setattr(update, "policy_loss", lambda *a, **kw: losses.append(real(*a, **kw)) or losses[-1])

    def loss_of(samples):
        torch.manual_seed(0)
        policy = build_policies(config, device=torch.device("cpu")).for_agent("writer")
        losses.clear()
        stats = update_policy(policy, samples, config, step=1)
        return stats["loss"]

    kept = [Sample("writer", (1, 2, 3), (5, 6, 7), advantage=1.0), Sample("writer", (1, 2, 3), (8, 9), advantage=-1.0)]
    cut = Sample("writer", (1, 2, 3), (10, 11, 12, 13, 14, 15, 16, 17), advantage=2.0, masked=True)
    assert loss_of([*kept, cut]) == pytest.approx(loss_of(kept), rel=1e-5)


def test_the_overlong_penalty_and_truncation_mask_come_from_the_config(make_config):
    from training.config import ConfigError, RunConfig

    data = make_config().to_dict()
    data["grpo"]["overlong_cache"] = 8  # generation.max_new_tokens is 8
    with pytest.raises(ConfigError) as err:
        RunConfig.from_dict(data)
    assert err.value.field == "grpo.overlong_cache"


def test_a_run_trains_with_the_overlong_penalty_and_the_truncation_mask(make_config, tmp_path):
    from training.events import NullSink
    from training.trainer import train

    config = make_config("lora", **{"grpo.overlong_cache": 4, "grpo.mask_truncated": True})
    assert train(config, out_dir=tmp_path, sink=NullSink()).status == "succeeded"

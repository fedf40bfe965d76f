"""Truncated importance sampling for the sampler/trainer mismatch, against naive references:
the weights, the weighted loss and the mismatch metrics, and the update that uses them."""

from __future__ import annotations

import math

import pytest
import torch

from tests.training.test_grpo import LOSS_TYPES, random_batch, ref_token_loss
from training.grpo import policy_loss, sampler_mismatch, truncated_importance_weights


def ref_weights(old: list[list[float]], sampler: list[list[float]], mask: list[list[float]], cap: float) -> list[list[float]]:
    return [
        [min(math.exp(o - s), cap) if m else 0.0 for o, s, m in zip(o_row, s_row, m_row)]
        for o_row, s_row, m_row in zip(old, sampler, mask)
    ]


def sampler_batch(seed: int = 1) -> dict[str, torch.Tensor]:
    d = random_batch(seed)
    g = torch.Generator().manual_seed(seed + 100)
    d["sampler"] = d["old"] + torch.randn(d["old"].shape, generator=g) * 0.8  # (B, T) ratios from ~0.1 to ~10
    return d


@pytest.mark.parametrize("cap", [1.0, 2.0, 3.0])
def test_the_weights_match_the_reference(cap: float) -> None:
    d = sampler_batch()
    got = truncated_importance_weights(d["old"], d["sampler"], d["mask"], cap=cap)
    want = ref_weights(d["old"].tolist(), d["sampler"].tolist(), d["mask"].tolist(), cap)
    assert got.shape == d["old"].shape
    assert [v for row in got.tolist() for v in row] == pytest.approx([v for row in want for v in row], rel=1e-5)
    assert float(got.max()) <= cap + 1e-6
    assert bool((got[d["mask"] == 0] == 0).all())


def test_the_weights_are_one_when_the_sampler_is_the_trainer() -> None:
    d = sampler_batch()
    got = truncated_importance_weights(d["old"], d["old"].clone(), d["mask"], cap=2.0)
    assert torch.equal(got, d["mask"])


def test_a_huge_ratio_is_capped_not_infinite() -> None:
    old, sampler, mask = torch.tensor([[0.0, -0.1]]), torch.tensor([[-1e6, -0.1]]), torch.ones(1, 2)
    assert truncated_importance_weights(old, sampler, mask, cap=2.0).tolist() == [[2.0, 1.0]]


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_the_weighted_loss_matches_the_reference(loss_type: str) -> None:
    d = sampler_batch()
    w = truncated_importance_weights(d["old"], d["sampler"], d["mask"], cap=2.0)
    got = policy_loss(
        d["logp"], d["old"], d["adv"], d["mask"], eps_low=0.2, eps_high=0.28, loss_type=loss_type,
        ref_logp=d["ref"], beta=0.04, is_weights=w,
    )
    b, t = d["logp"].shape
    # naive: the surrogate term times the weight, plus the unweighted k3 KL term
    per = [
        [
            w[i, j].item() * ref_token_loss(d["logp"][i, j].item(), d["old"][i, j].item(), d["adv"][i].item(), 0.2, 0.28, None, 0.0)
            + 0.04 * (math.exp(d["ref"][i, j].item() - d["logp"][i, j].item()) - (d["ref"][i, j].item() - d["logp"][i, j].item()) - 1)
            for j in range(t)
        ]
        for i in range(b)
    ]
    mask = d["mask"].tolist()
    if loss_type == "grpo":
        want = sum(sum(p * m for p, m in zip(per[i], mask[i])) / max(sum(mask[i]), 1) for i in range(b)) / b
    elif loss_type in ("bnpo", "dapo"):
        want = sum(p * m for i in range(b) for p, m in zip(per[i], mask[i])) / sum(map(sum, mask))
    else:
        want = sum(p * m for i in range(b) for p, m in zip(per[i], mask[i])) / (b * t)
    assert float(got) == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_unit_weights_leave_the_loss_unchanged() -> None:
    d = sampler_batch()
    plain = policy_loss(d["logp"], d["old"], d["adv"], d["mask"])
    weighted = policy_loss(d["logp"], d["old"], d["adv"], d["mask"], is_weights=torch.ones_like(d["mask"]))
    assert float(weighted) == pytest.approx(float(plain), rel=1e-6)


def test_the_weights_carry_no_gradient() -> None:
    d = sampler_batch()
    old = d["old"].clone().requires_grad_(True)
    logp = d["logp"].clone().requires_grad_(True)
    w = truncated_importance_weights(old, d["sampler"], d["mask"], cap=2.0)
    policy_loss(logp, old, d["adv"], d["mask"], is_weights=w).backward()
    assert old.grad is None and logp.grad is not None


def test_the_mismatch_metrics_match_the_reference() -> None:
    d = sampler_batch()
    got = sampler_mismatch(d["old"], d["sampler"], d["mask"], cap=2.0)
    pairs = [
        (o, s)
        for o_row, s_row, m_row in zip(d["old"].tolist(), d["sampler"].tolist(), d["mask"].tolist())
        for o, s, m in zip(o_row, s_row, m_row)
        if m
    ]
    assert got["mismatch/logp_diff"] == pytest.approx(sum(abs(o - s) for o, s in pairs) / len(pairs), rel=1e-5)
    assert got["mismatch/capped"] == pytest.approx(sum(math.exp(o - s) > 2.0 for o, s in pairs) / len(pairs))
    assert 0 < got["mismatch/capped"] < 1
    assert got["mismatch/is_weight"] == pytest.approx(sum(min(math.exp(o - s), 2.0) for o, s in pairs) / len(pairs), rel=1e-5)


def test_the_update_reports_the_mismatch_and_weighs_by_it(make_config) -> None:
    """`update_policy` with vLLM-style sampler log-probs: the mismatch is reported; with the
    correction off the gradient is the uncorrected one, and with sampler = trainer it is too."""
    from training.policies import build_policies
    from training.update import Sample, update_policy

    cfg = make_config("single", **{"optim.max_grad_norm": 1e6})

    def run(shift: tuple[float, float, float], correction: bool) -> tuple[dict[str, float], torch.Tensor]:
        c = cfg.replace(**{"grpo.importance_sampling": correction})
        policies = build_policies(c, device=torch.device("cpu"))
        policy = policies.policies["shared"]
        policy.optimizer = torch.optim.SGD(policy.params, lr=1.0)  # the step is the gradient (Adam's would be its sign)
        samples = []
        for i, adv in enumerate([1.0, -1.0, 0.5]):
            prompt, completion = (1, 2, 3 + i), (5 + i, 6, 7)
            ids = torch.tensor([[*prompt, *completion]])
            with torch.no_grad():
                logits = policy.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # (Tc, V)
                trainer = torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None]).squeeze(1)  # (Tc,)
            samples.append(Sample("writer", prompt, completion, adv, 1.0, tuple((trainer - torch.tensor(shift)).tolist())))
        before = [p.detach().clone() for p in policy.params]
        stats = update_policy(policy, samples, c, step=1)
        delta = torch.cat([(p.detach() - b).flatten() for p, b in zip(policy.params, before)])
        return stats, delta

    def same_step(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-4) -> bool:
        return float((a - b).abs().max()) <= tol * float(b.abs().max())

    same, d_same = run((0.0, 0.0, 0.0), True)
    assert same["mismatch/logp_diff"] == pytest.approx(0.0, abs=1e-4) and same["mismatch/capped"] == 0.0
    off, d_off = run((0.0, 0.0, 0.0), False)
    assert same_step(d_same, d_off)  # weight 1 everywhere: the same step
    # the sampler found token 0 e times less likely (ratio e, capped at 2) and token 2 more likely (ratio 0.61)
    shifted, d_shifted = run((1.0, 0.0, -0.5), True)
    assert shifted["mismatch/logp_diff"] == pytest.approx(0.5, abs=1e-4)
    assert shifted["mismatch/capped"] == pytest.approx(1 / 3)
    assert not same_step(d_shifted, d_off, tol=1e-2)  # the correction changed the step
    uncorrected, d_uncorrected = run((1.0, 0.0, -0.5), False)
    assert uncorrected["mismatch/capped"] == pytest.approx(1 / 3)  # reported either way
    assert same_step(d_uncorrected, d_off)  # off: the sampler's numbers do not enter the loss


def test_groups_without_a_signal_count_in_the_normaliser_as_in_trl_when_asked(make_config) -> None:
    """`grpo.zero_signal: count` gives TRL's step exactly: zero-advantage samples forwarded (adding
    nothing but their tokens to the denominator) or only counted are the same update; `drop` (the
    default, DAPO's filtering) leaves them out of the counts too, so its step is larger."""
    from training.policies import build_policies
    from training.update import Sample, update_policy

    def step(mode: str, *, forward_silent: bool) -> torch.Tensor:
        cfg = make_config("single", **{"optim.max_grad_norm": 1e6, "grpo.zero_signal": mode})
        policy = build_policies(cfg, device=torch.device("cpu")).policies["shared"]
        policy.optimizer = torch.optim.SGD(policy.params, lr=1.0)  # the step is the gradient
        live = [Sample("writer", (1, 2, 3), (5 + i, 6, 7), adv) for i, adv in enumerate([1.0, -1.0])]
        silent = [Sample("writer", (1, 2, 4), (9, 8, 7, 6), 0.0, signal=forward_silent) for _ in range(2)]
        before = [p.detach().clone() for p in policy.params]
        update_policy(policy, live + (silent if mode == "count" or forward_silent else []), cfg, step=1)
        return torch.cat([(p.detach() - b).flatten() for p, b in zip(policy.params, before)])

    counted, forwarded, dropped = step("count", forward_silent=False), step("count", forward_silent=True), step("drop", forward_silent=False)
    torch.testing.assert_close(counted, forwarded, rtol=1e-5, atol=1e-8)
    assert float(dropped.norm()) > 1.5 * float(counted.norm())  # 7 of 14 tokens had a signal: about twice the step

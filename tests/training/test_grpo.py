"""The GRPO math against naive Python-loop references."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from training.grpo import (
    group_advantages,
    k3_kl,
    loss_stats,
    policy_loss,
    token_logprobs,
    zero_std_fraction,
)
from training.models import load_model

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")

# -- naive references ------------------------------------------------------------------------------


def ref_advantages(rewards: list[float], groups: list[object], scale: str, eps: float) -> list[float]:
    out = []
    batch_std = statistics.stdev(rewards) if len(rewards) > 1 else 0.0
    for i, r in enumerate(rewards):
        members = [rewards[j] for j in range(len(rewards)) if groups[j] == groups[i]]
        mean = statistics.mean(members)
        std = statistics.stdev(members) if len(members) > 1 else 0.0
        a = r - mean
        if scale == "group":
            a = a / (std + eps)
        elif scale == "batch":
            a = a / (batch_std + eps)
        out.append(a)
    return out


def ref_token_loss(lp: float, old: float, adv: float, lo: float, hi: float, ref: float | None, beta: float) -> float:
    ratio = math.exp(lp - old)
    clipped = min(max(ratio, 1 - lo), 1 + hi)
    loss = -min(ratio * adv, clipped * adv)
    if beta > 0 and ref is not None:
        loss += beta * (math.exp(ref - lp) - (ref - lp) - 1)
    return loss


def ref_loss(
    logp: list[list[float]],
    old: list[list[float]],
    adv: list[float],
    mask: list[list[float]],
    *,
    lo: float,
    hi: float,
    loss_type: str,
    ref: list[list[float]] | None = None,
    beta: float = 0.0,
    max_len: int | None = None,
) -> float:
    b, t = len(logp), len(logp[0])
    per = [
        [ref_token_loss(logp[i][j], old[i][j], adv[i], lo, hi, ref[i][j] if ref else None, beta) for j in range(t)]
        for i in range(b)
    ]
    if loss_type == "grpo":
        rows = []
        for i in range(b):
            n = sum(mask[i])
            rows.append(sum(per[i][j] for j in range(t) if mask[i][j]) / max(n, 1))
        return sum(rows) / b
    total = sum(per[i][j] for i in range(b) for j in range(t) if mask[i][j])
    if loss_type in ("bnpo", "dapo"):
        return total / max(sum(map(sum, mask)), 1)
    return total / (b * (max_len or t))


def random_batch(seed: int = 0, b: int = 5, t: int = 7) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, t, generator=g) * 3  # (B, T)
    old = logp + torch.randn(b, t, generator=g) * 0.4  # (B, T) ratios well outside [0.8, 1.28]
    ref = logp + torch.randn(b, t, generator=g) * 0.3  # (B, T)
    adv = torch.randn(b, generator=g)  # (B,)
    lengths = [t, 3, 0, 5, 1][:b]  # row 2 fully masked
    mask = torch.tensor([[1.0 if j < n else 0.0 for j in range(t)] for n in lengths])  # (B, T)
    return {"logp": logp, "old": old, "ref": ref, "adv": adv, "mask": mask}


# -- advantages ------------------------------------------------------------------------------------

REWARDS = [1.0, 0.0, 0.5, 2.0, 2.0, 2.0, 3.0, -1.0, 0.25, 0.1, 0.1, 0.1]
GROUPS: list[object] = [
    ("t1", 0, "a"), ("t1", 0, "a"), ("t1", 0, "a"),  # ordinary group
    ("t1", 0, "b"), ("t1", 0, "b"), ("t1", 0, "b"),  # zero-std group
    ("t2", 1, "a"),  # one member
    ("t2", 0, "a"), ("t2", 0, "a"),  # two members
    ("t3", 0, "a"), ("t3", 0, "a"), ("t3", 0, "a"),  # zero std, mean not exact in floating point
]


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_it_matches_the_reference_advantages(scale: str) -> None:
    got = group_advantages(torch.tensor(REWARDS, dtype=torch.float64), GROUPS, scale=scale, eps=1e-4)
    want = ref_advantages(REWARDS, GROUPS, scale, 1e-4)
    assert got.shape == (len(REWARDS),)
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64))


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_it_gives_zero_std_and_single_member_groups_exactly_zero(scale: str) -> None:
    got = group_advantages(torch.tensor(REWARDS), GROUPS, scale=scale)
    assert got[3:7].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert got[9:12].tolist() == [0.0, 0.0, 0.0]


def test_it_scales_group_advantages_to_unit_std_and_zero_mean() -> None:
    rewards = torch.tensor([0.0, 1.0, 5.0, 2.0, 4.0])
    adv = group_advantages(rewards, ["x", "x", "x", "y", "y"], eps=1e-8)
    for idx in ([0, 1, 2], [3, 4]):
        assert abs(float(adv[idx].mean())) < 1e-6
        assert abs(float(adv[idx].std()) - 1.0) < 1e-5


def test_it_uses_the_explicit_epsilon() -> None:
    adv = group_advantages(torch.tensor([0.0, 1.0]), ["g", "g"], eps=1.0)
    std = statistics.stdev([0.0, 1.0])
    torch.testing.assert_close(adv, torch.tensor([-0.5 / (std + 1.0), 0.5 / (std + 1.0)]))


def test_it_rejects_mismatched_inputs() -> None:
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(3), ["a", "b"])
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(2), ["a", "b"], scale="task")


def test_it_counts_zero_std_groups() -> None:
    # groups: a (varied), b (equal), one member, two members (varied), t3 (equal) -> 3 of 5
    assert zero_std_fraction(torch.tensor(REWARDS), GROUPS) == pytest.approx(3 / 5)
    assert zero_std_fraction(torch.tensor([]), []) == 0.0


# -- the loss --------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_it_matches_the_reference_loss(loss_type: str, beta: float) -> None:
    d = random_batch()
    got = policy_loss(
        d["logp"], d["old"], d["adv"], d["mask"], eps_low=0.2, eps_high=0.28, loss_type=loss_type, ref_logp=d["ref"], beta=beta
    )
    want = ref_loss(
        d["logp"].tolist(), d["old"].tolist(), d["adv"].tolist(), d["mask"].tolist(),
        lo=0.2, hi=0.28, loss_type=loss_type, ref=d["ref"].tolist(), beta=beta,
    )
    assert got.shape == ()
    assert float(got) == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_dr_grpo_divides_by_the_given_max_completion_length() -> None:
    d = random_batch()
    got = policy_loss(d["logp"], d["old"], d["adv"], d["mask"], loss_type="dr_grpo", max_completion_length=20)
    want = ref_loss(
        d["logp"].tolist(), d["old"].tolist(), d["adv"].tolist(), d["mask"].tolist(),
        lo=0.2, hi=0.2, loss_type="dr_grpo", max_len=20,
    )
    assert float(got) == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_a_fully_masked_row_contributes_nothing(loss_type: str) -> None:
    d = random_batch(b=2, t=4)
    logp = torch.cat([d["logp"], torch.full((1, 4), -50.0)])  # (3, T) garbage in the masked row
    old = torch.cat([d["old"], torch.zeros(1, 4)])
    adv = torch.cat([d["adv"], torch.tensor([100.0])])
    mask = torch.cat([d["mask"], torch.zeros(1, 4)])
    with_row = policy_loss(logp, old, adv, mask, loss_type=loss_type, max_completion_length=4)
    without = policy_loss(d["logp"], d["old"], d["adv"], d["mask"], loss_type=loss_type, max_completion_length=4)
    assert torch.isfinite(with_row)
    # grpo and dr_grpo average over rows, so the empty row only dilutes: B / (B + 1)
    factor = 2 / 3 if loss_type in ("grpo", "dr_grpo") else 1.0
    assert float(with_row) == pytest.approx(float(without) * factor, rel=1e-6)
    everything_masked = policy_loss(logp, old, adv, torch.zeros_like(mask), loss_type=loss_type)
    assert float(everything_masked) == 0.0


def test_it_clips_asymmetrically() -> None:
    mask = torch.ones(1, 1)
    old = torch.zeros(1, 1)

    def loss(ratio: float, adv: float) -> tuple[float, float]:
        logp = torch.tensor([[math.log(ratio)]], requires_grad=True)
        out = policy_loss(logp, old, torch.tensor([adv]), mask, eps_low=0.2, eps_high=0.28)
        out.backward()
        assert logp.grad is not None
        return float(out.detach()), float(logp.grad)

    assert loss(1.5, 1.0) == pytest.approx((-1.28, 0.0))  # above 1 + eps_high, A > 0: clipped, no grad
    assert loss(1.2, 1.0)[0] == pytest.approx(-1.2)  # inside the upper clip: not clipped
    assert loss(0.5, -1.0) == pytest.approx((0.8, 0.0))  # below 1 - eps_low, A < 0: clipped, no grad
    assert loss(0.9, -1.0)[0] == pytest.approx(0.9)  # inside the lower clip
    assert loss(0.5, 1.0)[1] != 0.0  # the pessimistic side is never clipped
    assert loss(1.5, -1.0)[1] != 0.0


def test_the_kl_term_is_k3_and_vanishes_at_the_reference() -> None:
    logp = torch.tensor([[-1.0, -2.0, -0.5]])  # (1, 3)
    ref = torch.tensor([[-1.5, -2.0, 0.0]])  # (1, 3)
    mask = torch.ones(1, 3)
    zero_adv = torch.zeros(1)
    loss = policy_loss(logp, logp, zero_adv, mask, ref_logp=ref, beta=0.5)
    k3 = [math.exp(r - lp) - (r - lp) - 1 for lp, r in zip(logp[0].tolist(), ref[0].tolist())]
    assert float(loss) == pytest.approx(0.5 * sum(k3) / 3)
    assert float(k3_kl(logp, logp).abs().max()) == 0.0
    assert float(policy_loss(logp, logp, zero_adv, mask, ref_logp=ref, beta=0.0)) == 0.0
    with pytest.raises(ValueError):
        policy_loss(logp, logp, zero_adv, mask, beta=0.1)


def test_gradients_flow_only_through_logp() -> None:
    d = {k: v.clone().requires_grad_(k != "mask") for k, v in random_batch().items()}
    loss = policy_loss(d["logp"], d["old"], d["adv"], d["mask"], ref_logp=d["ref"], beta=0.1, eps_low=0.2, eps_high=0.28)
    loss.backward()
    assert d["logp"].grad is not None and float(d["logp"].grad.abs().sum()) > 0
    assert d["old"].grad is None and d["ref"].grad is None and d["adv"].grad is None
    assert float(d["logp"].grad[2].abs().sum()) == 0.0  # the fully masked row


def test_it_rejects_an_unknown_loss_type() -> None:
    d = random_batch()
    with pytest.raises(ValueError, match="allowed"):
        policy_loss(d["logp"], d["old"], d["adv"], d["mask"], loss_type="ppo")


def test_loss_stats_match_the_reference() -> None:
    d = random_batch(seed=3)
    stats = loss_stats(d["logp"], d["old"], d["adv"], d["mask"], 0.2, 0.28, ref_logp=d["ref"])
    low = high = n = 0
    kl = 0.0
    for i in range(d["mask"].shape[0]):
        for j in range(d["mask"].shape[1]):
            if not d["mask"][i, j]:
                continue
            n += 1
            ratio = math.exp(float(d["logp"][i, j] - d["old"][i, j]))
            low += ratio < 0.8 and float(d["adv"][i]) < 0
            high += ratio > 1.28 and float(d["adv"][i]) > 0
            delta = float(d["ref"][i, j] - d["logp"][i, j])
            kl += math.exp(delta) - delta - 1
    assert 0 < low and 0 < high  # the batch exercises both sides
    assert stats["clip_low"] == pytest.approx(low / n)
    assert stats["clip_high"] == pytest.approx(high / n)
    assert stats["clip_region"] == pytest.approx((low + high) / n)
    assert stats["kl"] == pytest.approx(kl / n, rel=1e-5)
    assert "kl" not in loss_stats(d["logp"], d["old"], d["adv"], d["mask"], 0.2, 0.28)


# -- per-token log-probs ---------------------------------------------------------------------------

PROMPTS = [[256, 104, 105, 257], [256, 50, 43, 51, 61, 63, 10, 257, 256], [97]]
COMPLETIONS = [[52, 53, 257], [53], [98, 99, 100, 101, 257]]


def collate(pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prompts left-padded, completions right-padded (the trainer's layout)."""
    p = max(map(len, PROMPTS))
    c = max(map(len, COMPLETIONS))
    ids = torch.full((len(PROMPTS), p + c), pad)  # (B, P+Tc)
    attn = torch.zeros_like(ids)  # (B, P+Tc)
    comp = torch.zeros(len(PROMPTS), c, dtype=torch.long)  # (B, Tc)
    for i, (pr, co) in enumerate(zip(PROMPTS, COMPLETIONS)):
        ids[i, p - len(pr) : p + len(co)] = torch.tensor(pr + co)
        attn[i, p - len(pr) : p + len(co)] = 1
        comp[i, : len(co)] = 1
    return ids, attn, comp


def naive_logprobs(model: torch.nn.Module, temperature: float) -> tuple[list[list[float]], list[list[float]]]:
    """One unpadded row at a time, full log_softmax over the vocabulary."""
    logps, ents = [], []
    for pr, co in zip(PROMPTS, COMPLETIONS):
        ids = torch.tensor([pr + co])  # (1, L)
        logits = model(input_ids=ids).logits[0].float() / temperature  # (L, V)
        logsm = torch.log_softmax(logits, dim=-1)  # (L, V)
        rows = range(len(pr) - 1, len(pr) + len(co) - 1)
        logps.append([float(logsm[r, tok]) for r, tok in zip(rows, co)])
        ents.append([float(-(logsm[r].exp() * logsm[r]).sum()) for r in rows])
    return logps, ents


@pytest.fixture(scope="module")
def tiny() -> tuple[torch.nn.Module, int]:
    model, tok = load_model("tiny-random:llama")
    return model, tok.pad_token_id


@pytest.mark.parametrize("temperature,chunk", [(1.0, 1024), (0.7, 4), (1.3, 1)])
def test_token_logprobs_match_a_full_log_softmax(tiny: tuple[torch.nn.Module, int], temperature: float, chunk: int) -> None:
    model, pad = tiny
    ids, attn, comp = collate(pad)
    with torch.no_grad():
        logp, entropy = token_logprobs(model, ids, attn, comp, temperature=temperature, chunk=chunk)
        want_logp, want_ent = naive_logprobs(model, temperature)
    assert logp.shape == entropy.shape == comp.shape
    for i, co in enumerate(COMPLETIONS):
        torch.testing.assert_close(logp[i, : len(co)], torch.tensor(want_logp[i]), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(entropy[i, : len(co)], torch.tensor(want_ent[i]), atol=1e-5, rtol=1e-5)
        assert logp[i, len(co) :].abs().sum() == 0 and entropy[i, len(co) :].abs().sum() == 0


def test_token_logprobs_work_through_peft_and_carry_gradients(tiny: tuple[torch.nn.Module, int]) -> None:
    from peft import LoraConfig, get_peft_model

    base, pad = load_model("tiny-random:llama")[0], tiny[1]
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    ids, attn, comp = collate(pad)
    logp, _ = token_logprobs(model, ids, attn, comp)
    logp.sum().backward()
    lora_grads = [p.grad for n, p in model.named_parameters() if "lora_" in n]
    assert lora_grads and all(g is not None and float(g.abs().sum()) > 0 for g in lora_grads)
    with model.disable_adapter(), torch.no_grad():
        plain, _ = token_logprobs(model, ids, attn, comp)
        reference, _ = token_logprobs(tiny[0], ids, attn, comp)
    torch.testing.assert_close(plain, reference)
    assert not torch.allclose(plain, logp.detach())

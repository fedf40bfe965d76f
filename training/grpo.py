"""The GRPO math: group advantages, the clipped policy loss, its metrics, per-token log-probs.

Small pure functions, tested against naive Python-loop references (tests/training/test_grpo.py).
Shapes: B sequences, T completion tokens, V vocabulary, N samples, G groups.

    advantage   A_i = (r_i - mean(r_group)) / (std(r_group) + eps)
    ratio       rho_t = exp(logp_t - old_logp_t)
    token loss  l_t = -min(rho_t * A, clip(rho_t, 1 - eps_low, 1 + eps_high) * A) + beta * KL_t
    KL (k3)     KL_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1
    TIS weight  w_t = min(exp(old_logp_t - sampler_logp_t), C)   (tokens sampled by vLLM)

References: GRPO (Shao et al. 2024, DeepSeekMath), DAPO (Yu et al. 2025: clip-higher, token-level
mean), Dr. GRPO (Liu et al. 2025: no length or std normalisation), k3 KL estimator (Schulman 2020),
truncated importance sampling (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You
Off-Policy RL Training"; TRL's `vllm_importance_sampling_correction`).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any

import torch
from torch import Tensor

from training.config import LOSS_AGGREGATION
from training.prompt_cache import CompletionCache, PromptCache, cache_through_checkpoints, shares_prompts

# -- advantages ----------------------------------------------------------------------------------


def _group_members(group_ids: Sequence[Hashable]) -> list[list[int]]:
    """Indices of each group's members, groups in order of first appearance."""
    members: dict[Hashable, list[int]] = {}
    for i, key in enumerate(group_ids):
        members.setdefault(key, []).append(i)
    return list(members.values())


def group_advantages(
    rewards: Tensor,
    group_ids: Sequence[Hashable],
    scale: str = "group",
    eps: float = 1e-4,
    batch_ids: Sequence[Hashable] | None = None,
) -> Tensor:
    """Group-relative advantages: A = r - mean(group), divided by a std per `scale`.

    `rewards` is (N,); `group_ids[i]` is sample i's group key (Troupe: (task, turn, agent)).
    `scale`: "group" divides by (std(group) + eps) (GRPO), "batch" by (std(batch) + eps) (as TRL's
    scale_rewards="batch"), "none" does not divide (Dr. GRPO). A sample's batch is every sample
    with its `batch_ids` entry (Troupe passes the agent, so an agent whose rewards are ten times
    larger does not shrink another agent's advantages); None: all N samples are one batch. std is
    the unbiased sample std (0 for a batch of one). A group whose rewards are all equal, one-member
    groups included, gets exactly 0 (its mean is not computed in floating point, so no 1e-17
    residue is amplified by 1/eps).
    """
    if rewards.dim() != 1 or rewards.numel() != len(group_ids):
        raise ValueError(f"rewards must be (N,) with one group id each; got {tuple(rewards.shape)} and {len(group_ids)} ids")
    if batch_ids is not None and len(batch_ids) != len(group_ids):
        raise ValueError(f"batch_ids must give one batch per sample; got {len(batch_ids)} for {len(group_ids)} samples")
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"unknown scale {scale!r}; allowed: group, batch, none")
    rewards = rewards.detach().float() if not rewards.is_floating_point() else rewards.detach()  # (N,)
    centered = torch.zeros_like(rewards)  # (N,)
    group_std = torch.zeros_like(rewards)  # (N,) std of each sample's group
    for idx in _group_members(group_ids):
        r = rewards[idx]  # (n,)
        if bool((r == r[0]).all()):
            continue  # zero-std group (or a single member): advantage 0
        centered[idx] = r - r.mean()  # (n,)
        group_std[idx] = r.std()  # (n,) unbiased
    if scale == "group":
        return centered / (group_std + eps)  # (N,)
    if scale == "batch":
        batch_std = torch.zeros_like(rewards)  # (N,) std of each sample's batch
        for idx in _group_members(batch_ids if batch_ids is not None else [0] * len(group_ids)):
            batch_std[idx] = rewards[idx].std() if len(idx) > 1 else 0.0  # (n,)
        return centered / (batch_std + eps)  # (N,)
    return centered  # (N,)


def zero_std_fraction(rewards: Tensor, group_ids: Sequence[Hashable]) -> float:
    """Fraction of groups whose rewards are all equal (one-member groups count): they carry no signal."""
    groups = _group_members(group_ids)
    if not groups:
        return 0.0
    flat = rewards.detach()  # (N,)
    zero = sum(1 for idx in groups if bool((flat[idx] == flat[idx[0]]).all()))
    return zero / len(groups)


# -- the policy loss -----------------------------------------------------------------------------


def soft_overlong_penalty(length: int, *, max_len: int, cache: int) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), added to a completion's reward:

        0                                 if L <= L_max - L_cache
        ((L_max - L_cache) - L) / L_cache  if L_max - L_cache < L <= L_max
        -1                                if L > L_max

    so completions that run into the length cap lose reward gradually instead of all at once."""
    start = max_len - cache
    if length <= start:
        return 0.0
    if length <= max_len:
        return (start - length) / cache
    return -1.0


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    loss_type: str = "dapo",
    ref_logp: Tensor | None = None,
    beta: float = 0.0,
    max_completion_length: int | None = None,
    is_weights: Tensor | None = None,
    ratio_level: str = "token",
    delta: float | None = None,
    cispo_cap: float = 5.0,
) -> Tensor:
    """Clipped surrogate loss l_t = -w_t * min(rho*A, clip(rho, 1-eps_low, 1+eps_high)*A) + beta*KL_t.

    logp, old_logp, ref_logp, mask, is_weights: (B, T); advantages: (B,). Gradients flow only
    through `logp` (old_logp, ref_logp, advantages and is_weights are detached). `is_weights` are
    the truncated importance weights w_t of tokens another engine sampled
    (`truncated_importance_weights`); None means w_t = 1 (the trainer's own weights sampled).
    They weight the policy-gradient term only, not the KL penalty. Aggregation by `loss_type`:
      grpo     mean over each sequence's tokens, then over sequences (the GRPO paper)
      bnpo     sum over tokens / number of tokens in this call's batch; a trainer accumulating
               micro-batches averages the calls (TRL's bnpo, `micro_batch_weight`)
      dapo     the same per call; DAPO divides by the tokens of the whole accumulated batch, so a
               trainer accumulating micro-batches must weight each call by its token share
      dr_grpo  sum over tokens / (B * max_completion_length)  (max_completion_length defaults to T)
      cispo    the CISPO term (`cispo_term`), token mean like dapo
    `ratio_level`: `token` (rho_t per token) or `sequence` (GSPO, `sequence_log_ratio`); `delta`
    caps the unclipped ratio (two-sided clipping, `clipped_surrogate`).
    Deviations from the papers: token counts are clamped to >= 1 so a fully masked row adds 0;
    the KL term is added per token before aggregation (as in GRPO), not to the reward.
    """
    adv = advantages.detach()[:, None]  # (B, 1)
    if ratio_level == "sequence":
        ratio = torch.exp(sequence_log_ratio(logp, old_logp, mask.to(logp.dtype)))  # (B, 1)
    else:
        ratio = torch.exp(logp - old_logp.detach())  # (B, T)
    if loss_type == "cispo":
        per_token = cispo_term(ratio, logp, adv, cap=cispo_cap)  # (B, T)
    else:
        per_token = clipped_surrogate(ratio, adv, eps_low=eps_low, eps_high=eps_high, delta=delta).expand_as(logp)  # (B, T)
    if is_weights is not None:
        per_token = per_token * is_weights.detach()  # (B, T)
    if beta > 0.0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs ref_logp (the reference policy's log-probs)")
        per_token = per_token + beta * k3_kl(logp, ref_logp.detach())  # (B, T)
    mask = mask.to(per_token.dtype)  # (B, T)
    aggregation = _aggregation(loss_type)
    if aggregation == "sequence":
        return sequence_mean_loss(per_token, mask)
    if aggregation in ("token", "micro"):  # `micro`: this call's token mean; the step averages the calls
        return token_mean_loss(per_token, mask)
    return constant_length_loss(per_token, mask, max_completion_length or mask.shape[1])


def _aggregation(loss_type: str) -> str:
    if loss_type not in LOSS_AGGREGATION:
        raise ValueError(f"unknown loss_type {loss_type!r}; allowed: {', '.join(LOSS_AGGREGATION)}")
    return LOSS_AGGREGATION[loss_type]


def micro_batch_weight(loss_type: str, mask: Tensor, *, n_samples: int, n_tokens: int, n_micro: int = 1) -> float:
    """The weight of one micro-batch's `policy_loss` when a step accumulates several, so that the
    weighted sum is the step's loss: its share of the batch's tokens for a token mean (`dapo`, the
    loss of the whole batch), its share of the sequences for a sequence mean or a constant, and
    1 / `n_micro` for `bnpo` (TRL's: the mean of the micro-batches' token means). mask: (B, T) of
    this micro-batch; `n_samples`, `n_tokens` and `n_micro`: the whole step's sequences, loss
    tokens and micro-batches, every rank's."""
    aggregation = _aggregation(loss_type)
    if aggregation == "micro":
        return 1.0 / max(n_micro, 1)
    if aggregation == "token":
        return float(mask.sum()) / max(n_tokens, 1)
    return mask.shape[0] / max(n_samples, 1)


def sequence_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """GSPO's sequence-level log importance ratio (Zheng et al. 2025, "Group Sequence Policy
    Optimization"): log s_i = (1/|y_i|) sum_t (logp_t - old_logp_t) over the completion's tokens.
    Every token's log-prob keeps its gradient. (B, T) -> (B, 1); an all-masked row gives 0."""
    return ((logp - old_logp.detach()) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)  # (B, 1)


def clipped_surrogate(ratio: Tensor, adv: Tensor, *, eps_low: float, eps_high: float, delta: float | None = None) -> Tensor:
    """PPO's clipped term, -min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A), per token (or
    per sequence under GSPO). `delta` (two-sided clipping, INTELLECT-2, Prime Intellect 2025)
    caps rho at delta in the unclipped term, so a token with a negative advantage and a ratio
    far above 1 cannot blow up the update. ratio (B, T) or (B, 1); adv (B, 1)."""
    unclipped = (torch.clamp(ratio, max=delta) if delta is not None else ratio) * adv
    return -torch.min(unclipped, torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv)


def cispo_term(ratio: Tensor, logp: Tensor, adv: Tensor, *, cap: float) -> Tensor:
    """CISPO (MiniMax-M1, 2025): -sg(min(rho, cap)) * A * logp_t. The importance weight is
    truncated and detached instead of clipping the update away, so every token keeps a
    gradient, weighted by at most `cap`. ratio (B, T) or (B, 1); logp (B, T); adv (B, 1)."""
    return -torch.clamp(ratio, max=cap).detach() * adv * logp  # (B, T)


def truncated_importance_weights(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, *, cap: float) -> Tensor:
    """Truncated importance sampling (TIS) weights w_t = min(pi_old(y_t) / pi_sampler(y_t), cap). (B, T)

    The tokens were drawn from the sampler's distribution (vLLM: other kernels, maybe another
    dtype) while the loss is an expectation under the trainer's `old_logp`; reweighting each
    token's policy-gradient term by the ratio corrects the difference, and capping the ratio at
    `cap` (Yao et al. 2025's C) bounds the variance. Only the upper side is capped, as in TIS and
    TRL's `token_truncate`. Positions outside `mask` get weight 0. Inputs are detached.
    """
    log_ratio = (old_logp.detach() - sampler_logp.detach()).clamp(max=20.0)  # (B, T) no inf from exp
    return torch.exp(log_ratio).clamp(max=cap) * mask.to(old_logp.dtype)  # (B, T)


@torch.no_grad()
def sampler_mismatch(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, *, cap: float) -> dict[str, float]:
    """How far the sampler's log-probs are from the trainer's, over the masked tokens:
    `mismatch/logp_diff` mean |old_logp - sampler_logp|, `mismatch/capped` the share of tokens
    whose ratio pi_old / pi_sampler is above `cap` (their weight was truncated), `mismatch/is_weight`
    the mean truncated weight min(pi_old / pi_sampler, cap) (1 when the sampler is the trainer)."""
    keep = mask.to(torch.bool)  # (B, T)
    n = keep.sum().clamp(min=1).float()  # ()
    diff = old_logp - sampler_logp  # (B, T)
    weight = torch.exp(diff.clamp(max=20.0)).clamp(max=cap)  # (B, T)
    return {
        "mismatch/logp_diff": float((diff.abs() * keep).sum() / n),
        "mismatch/capped": float(((diff > math.log(cap)) & keep).sum() / n),
        "mismatch/is_weight": float((weight * keep).sum() / n),
    }


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(policy || reference): exp(d) - d - 1 with d = ref - logp. (B, T)"""
    d = ref_logp - logp  # (B, T)
    return torch.exp(d) - d - 1.0  # (B, T)


def sequence_mean_loss(per_token: Tensor, mask: Tensor) -> Tensor:
    """`grpo`: mean over each sequence's masked tokens, then mean over sequences."""
    per_seq = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # (B,)
    return per_seq.mean()  # ()


def token_mean_loss(per_token: Tensor, mask: Tensor) -> Tensor:
    """`bnpo` / `dapo`: sum over all masked tokens / number of masked tokens."""
    return (per_token * mask).sum() / mask.sum().clamp(min=1.0)  # ()


def constant_length_loss(per_token: Tensor, mask: Tensor, max_completion_length: int) -> Tensor:
    """`dr_grpo`: sum over masked tokens / (B * max_completion_length), a length-independent constant."""
    return (per_token * mask).sum() / (mask.shape[0] * max_completion_length)  # ()


@torch.no_grad()
def loss_stats(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float,
    eps_high: float,
    ref_logp: Tensor | None = None,
) -> dict[str, float]:
    """Dashboard metrics over the masked tokens: clip fractions and the mean k3 KL.

    clip_low: ratio < 1 - eps_low with A < 0 (the clip binds); clip_high: ratio > 1 + eps_high
    with A > 0; clip_region: either. `kl` only when `ref_logp` is given.
    """
    mask = mask.to(torch.bool)  # (B, T)
    n = mask.sum().clamp(min=1).float()  # ()
    ratio = torch.exp(logp - old_logp)  # (B, T)
    adv = advantages[:, None]  # (B, 1)
    low = (ratio < 1.0 - eps_low) & (adv < 0) & mask  # (B, T)
    high = (ratio > 1.0 + eps_high) & (adv > 0) & mask  # (B, T)
    stats = {
        "clip_low": float(low.sum() / n),
        "clip_high": float(high.sum() / n),
        "clip_region": float((low | high).sum() / n),
    }
    if ref_logp is not None:
        stats["kl"] = float((k3_kl(logp, ref_logp) * mask).sum() / n)
    return stats


# -- per-token log-probs -------------------------------------------------------------------------


def token_logprobs(
    model: Any,
    input_ids: Tensor,
    attention_mask: Tensor,
    completion_mask: Tensor,
    *,
    temperature: float = 1.0,
    chunk: int = 1024,
) -> tuple[Tensor, Tensor]:
    """Log-probs and entropies of the completion tokens, each (B, Tc).

    `input_ids`/`attention_mask` are (B, L) prompt+completion (prompts left-padded, completions
    right-padded); the completion is the last Tc = completion_mask.shape[1] positions. Logits are
    divided by `temperature` (the sampling distribution; 0, greedy, scores the untempered one).
    Entropy is a metric: computed without grad. Only the last Tc+1 logits are computed
    (`logits_to_keep`), and log-softmax is never materialised for the whole batch: for `chunk`
    token rows at a time, log p = logit[target] - logsumexp(logits), in float32. Positions outside
    `completion_mask` are 0. Position ids follow the attention mask, as in `generate`.
    Works for any HF causal LM, PEFT-wrapped too; gradients flow when grad is enabled.
    Rows with the same prompt (a GRPO group's candidates) forward that prompt once: see
    `_shared_prompt_logits`.
    """
    tc = completion_mask.shape[1]
    temperature = temperature if temperature > 0 else 1.0
    position_ids = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)  # (B, L)
    logits = _shared_prompt_logits(model, input_ids, attention_mask, position_ids, tc)  # (B, Tc, V) or None
    if logits is None:
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            logits_to_keep=tc + 1,
            use_cache=False,
        )
        logits = out.logits[:, -(tc + 1) : -1, :]  # (B, Tc, V) position t predicts token t+1
    targets = input_ids[:, -tc:]  # (B, Tc)
    b, _, v = logits.shape
    flat_logits = logits.reshape(b * tc, v)  # (B*Tc, V)
    flat_targets = targets.reshape(b * tc)  # (B*Tc,)
    logps, entropies = [], []
    for start in range(0, b * tc, chunk):
        rows = flat_logits[start : start + chunk].float() / temperature  # (C, V)
        lse = torch.logsumexp(rows, dim=-1)  # (C,)
        picked = rows.gather(1, flat_targets[start : start + chunk, None]).squeeze(1)  # (C,)
        logps.append(picked - lse)  # (C,)
        with torch.no_grad():
            probs = torch.softmax(rows, dim=-1)  # (C, V)
            entropies.append(lse.detach() - (probs * rows).sum(dim=-1))  # (C,) H = lse - E_p[logit]
    keep = completion_mask.bool()  # (B, Tc)
    logp = torch.cat(logps).reshape(b, tc)  # (B, Tc)
    entropy = torch.cat(entropies).reshape(b, tc)  # (B, Tc)
    return torch.where(keep, logp, 0.0), torch.where(keep, entropy, 0.0)  # (B, Tc), (B, Tc)


def _shared_prompt_logits(model: Any, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, tc: int) -> Tensor | None:
    """The (B, Tc, V) completion logits of `token_logprobs`, forwarding each distinct prompt once.

    The K candidates of a group share their prompt, often the larger part of each row. The U
    distinct prompts (U < B) run once, with grad, into a `PromptCache`; the completions run on top
    of it through a `CompletionCache`, which gathers each row's prompt states (an indexing op, so
    each prompt's gradient sums its rows' contributions). Same values and gradients as the full
    forward up to float rounding (with dropout on, the rows of a group share one dropout mask on
    their prompt). Both caches are safe to replay, so this holds with activation checkpointing on
    (`training.prompt_cache`). Returns None, and the caller runs the plain forward, when no prompt
    repeats or when the model's cache holds more than keys and values.
    """
    p_width = input_ids.shape[1] - tc
    if p_width < 1:
        return None
    prompts = torch.cat([input_ids[:, :p_width], attention_mask[:, :p_width].long()], dim=1)  # (B, 2P)
    unique, row_of = torch.unique(prompts, dim=0, return_inverse=True)  # (U, 2P), (B,)
    if unique.shape[0] == prompts.shape[0]:
        return None
    cache = PromptCache(config=model.config)
    if not shares_prompts(model, cache):
        return None
    u_ids, u_mask = unique[:, :p_width], unique[:, p_width:]  # (U, P), (U, P)
    u_pos = (u_mask.cumsum(dim=1) - 1).clamp(min=0)  # (U, P)
    with cache_through_checkpoints(model) as checkpointing:
        use_cache = not checkpointing
        head = model(
            input_ids=u_ids, attention_mask=u_mask, position_ids=u_pos, past_key_values=cache, logits_to_keep=1, use_cache=use_cache
        )
        tail = model(
            input_ids=input_ids[:, p_width:],
            attention_mask=attention_mask,
            position_ids=position_ids[:, p_width:],
            past_key_values=CompletionCache(cache, row_of),
            logits_to_keep=tc,
            use_cache=use_cache,
        )
    first = head.logits[row_of]  # (B, 1, V) the last prompt position predicts completion token 0
    return torch.cat([first, tail.logits[:, :-1, :]], dim=1)  # (B, Tc, V)

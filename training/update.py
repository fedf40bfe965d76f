"""The update: one policy's GRPO step on its own agents' samples (`update_policy`), with the
micro-batching, the collation and the learning-rate schedule it needs. The loss itself is
`training.grpo.policy_loss` (pure functions, tested against a naive reference)."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import torch

from training import sharding
from training.config import RunConfig
from training.distributed import Dist
from training.grpo import (
    loss_stats,
    micro_batch_weight,
    policy_loss,
    sampler_mismatch,
    token_logprobs,
    truncated_importance_weights,
)
from training.policies import Policy


@dataclass
class Sample:
    """One candidate completion as the update sees it."""

    agent: str
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    advantage: float
    temperature: float = 1.0
    """The temperature the completion was sampled at; log-probs are scored at the same one."""
    logprobs: tuple[float, ...] | None = None
    """The sampler's log-probs of `completion_ids` when another sampler than the trainer's weights drew
    them (vLLM, or `generation.async`'s sampler): the importance weights' denominator."""
    masked: bool = False
    """Left out of the loss but kept in the batch (`grpo.mask_truncated`: it hit the length cap)."""
    signal: bool = True
    """False: its group's rewards were all equal (zero advantage, no gradient); it is counted in the
    loss's normaliser but not forwarded (`grpo.zero_signal: count`)."""
    mask: tuple[int, ...] | None = None
    """Per completion token: 1 the model wrote it, 0 a tool result spliced in (no loss on it, but
    the model saw it); None: every token is the model's."""

def update_policy(policy: Policy, samples: list[Sample], cfg: RunConfig, step: int, *, dist: Dist | None = None) -> dict[str, float]:
    """GRPO update of one policy: `num_iterations` passes, micro-batched, clipped, one optimizer step each.

    Under a data-parallel launch every rank calls this with its own samples (maybe none): the
    loss is normalised by the global counts and the gradients are summed before the step."""
    assert policy.optimizer is not None
    dist = dist or Dist()
    lr = step_lr(cfg, step)
    for group in policy.optimizer.param_groups:
        group["lr"] = lr
    n_samples, total_tokens = dist.sum([len(samples), sum(len(s.completion_ids) if s.mask is None else sum(s.mask)
                                                          for s in samples if not s.masked)])  # the loss's normaliser
    samples = [s for s in samples if s.signal]  # the ones forwarded
    micro = _micro_batches(samples, cfg.optim.micro_batch_size, cfg.optim.micro_batch_tokens)
    n_forwarded, n_micro = dist.sum([len(samples), len(micro)])
    if not n_forwarded:
        return {"lr": lr, "samples": 0.0}
    # dr_grpo's constant: the most tokens the policy's agents can write in a turn (Dr. GRPO; TRL's
    # max_completion_length), not the longest completion of this step
    max_len = max(completion_budget(cfg, a) for a in policy.agents)
    g = cfg.grpo
    pad = policy.tokenizer.pad_token_id or 0
    device = next(policy.model.parameters()).device
    batches = [{k: v.to(device) for k, v in _collate(mb, pad).items()} for mb in micro]
    temps = [mb[0].temperature for mb in micro]
    real = len(batches)  # FSDP: every rank runs as many passes; the extra ones add zero gradients
    for _ in range(sharding.padding_batches(policy.model, real, dist)):
        batches.append({k: v.to(device) for k, v in _collate([Sample("", (pad,), (pad,), 0.0, masked=True)], pad).items()})
        temps.append(1.0)

    with policy.active() as model:
        model.train()  # train mode, so layers checkpoint; `grpo.disable_dropout` zeroed dropout at build (policies._prepare)
        old: list[torch.Tensor | None] = [None] * len(batches)
        ref: list[torch.Tensor | None] = [None] * len(batches)
        is_w: list[torch.Tensor | None] = [None] * len(batches)  # truncated importance weights, from the first pass
        mismatch: list[dict[str, float]] = [{} for _ in batches]
        with torch.no_grad():
            for i, b in enumerate(batches):
                if g.num_iterations > 1:
                    old[i] = token_logprobs(model, b["input_ids"], b["attention_mask"], b["completion_mask"], temperature=temps[i])[0]
                if g.beta > 0:
                    with policy.reference() as ref_model:
                        ref[i] = token_logprobs(ref_model, b["input_ids"], b["attention_mask"], b["completion_mask"], temperature=temps[i])[
                            0
                        ]

        sums: dict[str, float] = defaultdict(float)
        grad_norm = 0.0
        for _ in range(g.num_iterations):
            policy.optimizer.zero_grad(set_to_none=True)
            for i, b in enumerate(batches):
                logp, entropy = token_logprobs(
                    model, b["input_ids"], b["attention_mask"], b["completion_mask"], temperature=temps[i]
                )  # (B, T)
                if i >= real:
                    (logp.sum() * 0.0).backward()
                    continue
                old_i = old[i]
                old_logp = old_i if old_i is not None else logp.detach()  # (B, T)
                mask = b["loss_mask"]  # (B, T)
                if "sampler_logp" in b and not mismatch[i]:  # another sampler drew them: weigh by pi_old / pi_sampler, once per batch
                    mismatch[i] = sampler_mismatch(old_logp, b["sampler_logp"], mask, cap=g.importance_sampling_cap)
                    if g.importance_sampling:
                        is_w[i] = truncated_importance_weights(old_logp, b["sampler_logp"], mask, cap=g.importance_sampling_cap)
                loss = policy_loss(
                    logp,
                    old_logp,
                    b["advantages"],
                    mask,
                    eps_low=g.eps_low,
                    eps_high=g.eps_high,
                    loss_type=g.loss_type,
                    ref_logp=ref[i],
                    beta=g.beta,
                    max_completion_length=max_len,
                    is_weights=is_w[i],
                    ratio_level=g.ratio_level,
                    delta=g.delta,
                    cispo_cap=g.cispo_cap,
                )
                weight = micro_batch_weight(g.loss_type, mask, n_samples=int(n_samples), n_tokens=int(total_tokens), n_micro=int(n_micro))
                (loss * weight).backward()
                n_tok = float(mask.sum())
                sums["loss"] += float(loss.detach()) * weight
                sums["entropy"] += float((entropy.detach() * mask).sum())
                for name, value in loss_stats(
                    logp.detach(), old_logp, b["advantages"], mask, g.eps_low, g.eps_high, ref_logp=ref[i]
                ).items():
                    sums[name] += value * n_tok
                for name, value in mismatch[i].items():
                    sums[name] += value * n_tok
                sums["_tokens"] += n_tok
            dist.sum_gradients(policy.params)
            grad_norm = sharding.clip_grad_norm(policy.params, cfg.optim.max_grad_norm)
            policy.optimizer.step()
        model.eval()

    if dist.enabled:
        merged: dict[str, float] = defaultdict(float)
        for part in dist.gather(dict(sums)):
            for k, v in part.items():
                merged[k] += v
        sums = merged
    tok = max(sums.pop("_tokens", 0.0), 1.0)
    out = {k: v / (tok if k != "loss" else g.num_iterations) for k, v in sums.items()}
    out.update(grad_norm=grad_norm, lr=lr, samples=float(n_forwarded))
    return out

def _micro_batches(samples: list[Sample], size: int, budget: int) -> list[list[Sample]]:
    """Split the update's samples into micro-batches of one sampling temperature each.

    A group's candidates (same prompt) stay next to each other, so a micro-batch holds whole
    groups where it can and `token_logprobs` forwards each prompt once; groups are ordered by
    length, so rows of similar length share a batch (less padding). A micro-batch takes at most
    `size` rows and at most `budget` padded tokens (rows x (longest prompt + longest completion)).
    """
    by_prompt: dict[tuple[float, tuple[int, ...]], list[Sample]] = defaultdict(list)
    for s in samples:
        by_prompt[(s.temperature, tuple(s.prompt_ids))].append(s)
    groups = sorted(by_prompt.values(), key=lambda g: (g[0].temperature, max(len(s.prompt_ids) + len(s.completion_ids) for s in g)))
    micro: list[list[Sample]] = []
    width = (0, 0)  # the current micro-batch's longest prompt and completion
    for group in groups:
        for s in sorted(group, key=lambda s: len(s.completion_ids)):
            last = micro[-1] if micro else None
            grown = (max(width[0], len(s.prompt_ids)), max(width[1], len(s.completion_ids)))
            if last is not None and last[0].temperature == s.temperature and len(last) < size and (len(last) + 1) * sum(grown) <= budget:
                last.append(s)
                width = grown
            else:
                micro.append([s])
                width = (len(s.prompt_ids), len(s.completion_ids))
    return micro

def _collate(samples: list[Sample], pad: int) -> dict[str, torch.Tensor]:
    """Prompts left-padded to P, completions right-padded to Tc: rows are [pad* prompt | completion pad*]."""
    p_width = max(len(s.prompt_ids) for s in samples)
    c_width = max(len(s.completion_ids) for s in samples)
    ids = torch.full((len(samples), p_width + c_width), pad, dtype=torch.long)  # (B, P+Tc)
    attn = torch.zeros_like(ids)  # (B, P+Tc)
    comp = torch.zeros((len(samples), c_width), dtype=torch.long)  # (B, Tc)
    sampler_logp = torch.zeros((len(samples), c_width), dtype=torch.float32)  # (B, Tc)
    loss = torch.ones((len(samples), 1), dtype=torch.float32)  # (B, 1) 0 for a masked sample
    tokens = torch.ones((len(samples), c_width), dtype=torch.float32)  # (B, Tc) 0 for a tool result's tokens
    for i, s in enumerate(samples):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        ids[i, p_width - p : p_width] = torch.tensor(s.prompt_ids)
        ids[i, p_width : p_width + c] = torch.tensor(s.completion_ids)
        attn[i, p_width - p : p_width + c] = 1
        comp[i, :c] = 1
        if s.mask is not None:
            tokens[i, :c] = torch.tensor(s.mask, dtype=torch.float32)
        if s.masked:
            loss[i] = 0.0
        if s.logprobs is not None:
            sampler_logp[i, :c] = torch.tensor(s.logprobs, dtype=torch.float32)
    batch = {
        "input_ids": ids,
        "attention_mask": attn,
        "completion_mask": comp,
        "loss_mask": comp.float() * tokens * loss,  # (B, Tc)
        "advantages": torch.tensor([s.advantage for s in samples], dtype=torch.float32),  # (B,)
    }
    if all(s.logprobs is not None for s in samples):  # vLLM or the async sampler drew them
        batch["sampler_logp"] = sampler_logp  # (B, Tc)
    return batch

def step_lr(cfg: RunConfig, step: int) -> float:
    o = cfg.optim
    return lr_at(o.lr, step, steps=o.steps, warmup_steps=o.warmup_steps, schedule=o.lr_schedule)

def lr_at(lr: float, step: int, *, steps: int, warmup_steps: int, schedule: str) -> float:
    """The learning rate of 1-based step `step`.

    warm-up (s <= W)   lr * s / W
    after it           lr * f(p),  p = (s - 1 - W) / (steps - W) in [0, 1)
        constant  f = 1;  linear  f = 1 - p;  cosine  f = (1 + cos(pi * p)) / 2
    After the warm-up this is transformers' get_{constant,linear,cosine}_schedule_with_warmup at
    optimizer step s - 1. The warm-up differs on purpose: transformers starts at lr 0, which
    would make step 1 a step that changes nothing."""
    if warmup_steps and step <= warmup_steps:
        return lr * step / warmup_steps
    progress = (step - 1 - warmup_steps) / max(1, steps - warmup_steps)
    if schedule == "linear":
        return lr * max(0.0, 1.0 - progress)
    if schedule == "cosine":
        return lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return lr

def completion_budget(cfg: RunConfig, agent: str) -> int:
    """The most tokens the agent can write in one turn: max_new_tokens per generation, times the
    generations of a turn (1, or 1 + `generation.max_tool_calls` for an agent with tools). Dr.
    GRPO's constant L for a policy is the largest of its agents' (`update_policy`)."""
    cap = cfg.agent(agent).max_new_tokens or cfg.generation.max_new_tokens
    return cap * (1 + cfg.generation.max_tool_calls if cfg.agent(agent).tools else 1)

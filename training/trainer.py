"""The AT-GRPO training loop. Reads top to bottom, one step at a time:

    rollout (tree sampling) -> score -> advantages per (task, turn, agent) -> update each policy
    with its own agents' samples -> report (metrics, rollouts) -> evaluate / checkpoint

Deviations worth knowing:
- Groups whose rewards are all equal carry no signal; their samples are skipped in the update
  (DAPO's dynamic-sampling filter), which saves the forward/backward on CPU. Their count is
  reported as `zero_std_frac`.
- With `num_iterations == 1` the old log-probs equal the new ones (ratio 1), so no extra forward
  pass is spent on them (as TRL does); the reference pass runs only when `beta > 0`.
- Under a data-parallel launch (`resources.gpus > 1`, see `training.distributed`) each process
  rolls out its share of the step's tasks; the update, the metrics and the stop request are
  global, and only rank 0 evaluates and saves.
"""

from __future__ import annotations

import math
import random
import shutil
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents.envs import load_environment
from agents.verifiers import load_reward_fn
from training import sharding
from training.async_rollout import LAGS, AsyncRollouts, Collect, StepRollouts
from training.config import ConfigError, RunConfig, config_warnings, resume_differences
from training.data import Task, batch_indices, load_tasks
from training.distributed import Dist, check_gpus, from_env, in_launch, launch
from training.events import EventSink, StepMetrics, TrainResult
from training.grpo import (
    group_advantages,
    loss_stats,
    micro_batch_weight,
    policy_loss,
    sampler_mismatch,
    soft_overlong_penalty,
    token_logprobs,
    truncated_importance_weights,
    zero_std_fraction,
)
from training.models import needs_conversion, resolve_model_dir
from training.placement import Placement, generating
from training.policies import Policy, PolicySet, build_policies, load_policy_weights, save_policies
from training.progress import RunProgress
from training.rollout import Episode, Sampler, checkpoint_sampler, rollout_independent, rollout_tree
from training.trackers import reporting
from training.vllm_backend import VLLMGenerator, resolve_backend
from training.warmstart import init_from

STATE_FILE = "trainer_state.pt"


@dataclass
class Sample:
    """One candidate completion as the update sees it."""

    agent: str
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    advantage: float
    temperature: float = 1.0
    """The temperature the completion was sampled at; log-probs are scored at the same one."""
    sampler_logprobs: tuple[float, ...] | None = None
    """The sampler's log-probs of `completion_ids` when vLLM sampled them (for the importance weights)."""
    masked: bool = False
    """Left out of the loss but kept in the batch (`grpo.mask_truncated`: it hit the length cap)."""
    token_mask: tuple[int, ...] | None = None
    """Per completion token: 1 the model wrote it, 0 a tool result spliced in (no loss on it, but
    the model saw it); None: every token is the model's."""


def train(config: RunConfig, *, out_dir: str | Path, sink: EventSink, dist: Dist | None = None) -> TrainResult:
    """Run a whole training run. Raises on failure; returns `cancelled` when the sink asks to stop.

    A run asking for several GPUs in data-parallel mode starts its processes through torchrun
    from here (`training.distributed.launch`), a run on several hosts through Ray
    (`training.ray_launch.launch`), and `sink` receives rank 0's events."""
    config.validate()
    if config.algorithm != "grpo":
        raise ValueError(f"training.trainer.train runs GRPO; an `algorithm: {config.algorithm}` run goes through training.runner.train")
    out = Path(out_dir)
    if dist is None and config.resources.hosts > 1 and not in_launch():
        from training import ray_launch  # imports Ray: only a run on several hosts

        return ray_launch.launch(config, out, sink)
    if dist is None and config.resources.gpus > 1 and config.resources.parallel in ("data", "fsdp") and not in_launch():
        return launch(config, out, sink)  # type: ignore[no-any-return]
    dist = dist or from_env()
    if config.resources.gpus > 1 and not dist.enabled:  # one process on several GPUs (`agents`); a launch checked before
        check_gpus(config)
    out.mkdir(parents=True, exist_ok=True)
    if dist.main:
        (out / "config.yaml").write_text(config.to_yaml(), encoding="utf-8")
    seed_everything(config.seed)
    torch.set_num_threads(max(1, torch.get_num_threads()))

    env = load_environment(config.topology.environment, **config.topology.env_args)
    train_tasks, eval_tasks = load_tasks(config, env)
    sink.log(f"{len(train_tasks)} training tasks, {len(eval_tasks)} held-out tasks ({env.name})")
    for warning in config_warnings(config):
        sink.log(warning, level="warning")
    progress = RunProgress(sink, config, has_eval=bool(config.eval.every and eval_tasks))
    t_load = time.perf_counter()
    if dist.main:  # rank 0 converts or downloads the models once; the other ranks then read them
        _prefetch_models(config, progress)
    if dist.enabled:
        dist.barrier()
    progress.loading(f"{config.model.source} ({config.topology.specialization} policies)")
    placement = Placement.build(config, dist)  # `resources.placement`: this rank holds its agent's model only
    meta = sharding.builds_on_meta(config, dist, placement)  # fsdp: ranks but the first receive their shards
    policies = build_policies(config, device=dist.device(), only=placement.held() if placement else None, meta=meta)
    sharding.shard_policies(policies, config, dist, placement)  # `resources.parallel: fsdp`
    sink.log(f"loaded {config.topology.specialization} policies {sorted(policies.policies)} in {time.perf_counter() - t_load:.1f}s")
    warm = init_from(config, policies)
    if warm is not None:
        sink.log(f"started from {warm.checkpoint} (step {warm.step}): {', '.join(f'{a} <- {b}' for a, b in warm.loaded.items())}")
    generator = torch.Generator().manual_seed(config.seed + 1_000_003 * dist.rank)
    rewards = [(path.rpartition(":")[2], load_reward_fn(path), weight) for path, weight in config.data.reward_functions()]
    sampler = Sampler(env, policies, config, generator, rewards, dist=dist, placement=placement)
    for agent in config.topology.agents:
        if agent.tools:
            how = ("renders them" if sampler.tool_support(agent.name) else
                   "has no tool support: they are described in its system prompt and each result comes back as a user message")
            sink.log(f"agent {agent.name} may call {', '.join(agent.tools)} (at most {config.generation.max_tool_calls} per turn); "
                     f"the chat template of {config.agent_model(agent)} {how}", level="info" if "renders" in how else "warning")

    start_step = 0
    if config.checkpoint.resume_from:
        check_resume(config)
        start_step = restore(Path(config.checkpoint.resume_from), policies, generator, dist=dist, config=config, placement=placement)
        sink.log(f"resumed from {config.checkpoint.resume_from} at step {start_step}")

    backend = resolve_backend(config)
    mode = config.generation.async_
    if backend == "vllm":
        sampler.vllm = VLLMGenerator(config, policies)
    sink.log(f"generation backend: {backend}")
    rollouts = start_async_rollouts(sampler, train_tasks, total_steps=config.optim.steps)
    if rollouts is not None:
        resumed = bool(config.checkpoint.resume_from) and rollouts.load(Path(str(config.checkpoint.resume_from)), start_step)
        sink.log(f"generation.async: {mode}: a sampler {rollouts.kind} generates each next step's rollouts during the update "
                 f"({rollouts.threads} torch thread{'s' if rollouts.threads != 1 else ''} each){'; the next rollouts come from the checkpoint' if resumed else ''}"
                 f"{f'; a thread, not a process: {rollouts.note}' if rollouts.note else ''}")
        if sampler.vllm is not None and not sampler.vllm.cuda:
            sink.log("generation.async with vLLM on CPU: the engine, driven from the sampler thread, shares the cores with the update "
                     "and was measured slower per step than a synchronous vLLM run (docs/benchmarks.md, \"vLLM and generation.async\"); "
                     "on CPU the HF backend's sampler process is the fast async path", level="warning")
    try:
        with reporting(config, out, sink, main=dist.main) as run_sink:  # + the trackers of `report_to`, on rank 0
            return _loop(config, out, run_sink, sampler, train_tasks, eval_tasks, start_step, progress, rollouts)
    finally:
        if rollouts is not None:
            rollouts.close()
        if sampler.vllm is not None:
            sampler.vllm.close()
        sampler.pool.shutdown()


def _loop(
    config: RunConfig,
    out: Path,
    sink: EventSink,
    sampler: Sampler,
    train_tasks: list[Task],
    eval_tasks: list[Task],
    start_step: int,
    progress: RunProgress,
    rollouts: AsyncRollouts | None = None,
) -> TrainResult:
    policies, generator, dist = sampler.policies, sampler.generator, sampler.dist
    total = config.optim.steps
    sink.run_started(total_steps=total, start_step=start_step)
    result = TrainResult(status="succeeded", step=start_step, start_step=start_step)

    def run_eval(at: int) -> None:
        if rollouts is not None:  # the sampler idle: the run's generator is free, as in a synchronous run
            rollouts.settle()
        with generating(sampler):  # under a placement the other ranks answer rank 0's generations
            if dist.main:
                result.evaluations.extend(
                    evaluate(
                        sampler, eval_tasks, step=at, sink=sink, on_progress=lambda share, done, n: progress.evaluating(at, done, n, share)
                    )
                )
        dist.barrier()

    def run_checkpoint(at: int) -> str:
        progress.checkpointing(at)
        if rollouts is not None:  # the batch in flight done: the generator's state follows it, and the checkpoint keeps it
            rollouts.settle()
        path = save_checkpoint(out, at, policies, generator, config, sink, dist=dist, extra=rollouts.save if rollouts else None,
                               placement=sampler.placement)
        progress.checkpointed()
        return path

    if start_step == 0 and config.eval.every and eval_tasks:
        run_eval(0)

    step = start_step
    last_ckpt: str | None = None
    while step < total:
        if dist.any(sink.should_stop()):
            result.status = "cancelled"
            sink.log(f"stop requested: saving a checkpoint at step {step}")
            progress.stopping(step)
            break
        step += 1
        progress.training(step)
        metrics = train_step(sampler, train_tasks, step, sink, rollouts)
        progress.trained()
        result.final_metrics = metrics.values
        if config.eval.every and eval_tasks and step % config.eval.every == 0 and step < total:
            run_eval(step)
        if config.checkpoint.every and step % config.checkpoint.every == 0 and step < total:
            last_ckpt = run_checkpoint(step)

    if result.status == "succeeded" and config.eval.every and eval_tasks:
        run_eval(step)
    if step > start_step or last_ckpt is None:
        last_ckpt = run_checkpoint(step)
    result.step, result.checkpoint = step, last_ckpt
    return result


def _prefetch_models(config: RunConfig, progress: RunProgress) -> None:
    """Resolve (convert, or find in the cache) every model the run loads."""
    for source in sorted({config.model.source, *(config.agent_model(a) for a in config.topology.agents)}):
        if needs_conversion(source):
            progress.converting(source)
        if not source.startswith("tiny-random:"):
            resolve_model_dir(source)


# == one training step =============================================================================


def train_step(sampler: Sampler, tasks: list[Task], step: int, sink: EventSink, rollouts: AsyncRollouts | None = None) -> StepMetrics:
    cfg = sampler.config
    t0 = time.perf_counter()
    dist = sampler.dist

    # -- 1. rollout: here, or taken from the async sampler that made them during the last update ---
    got = collect_rollouts(sampler, tasks, step) if rollouts is None else rollouts.take(step)
    episodes, dynamic, t_rollout = got.episodes, got.dynamic, got.seconds
    t_wait = time.perf_counter() - t0

    # -- 2. advantages per group key -------------------------------------------------------------
    if cfg.grpo.overlong_cache:
        _shape_overlong(episodes, cfg)
    cands, rewards, keys = _candidates(episodes)
    for (_, c), a in zip(cands, step_advantages(episodes, cfg, dist)):
        c.advantage = a
    updated = groups_to_update(cands, beta=cfg.grpo.beta)

    # -- 3. update each trainable policy with its own agents' samples -------------------------------
    t1 = time.perf_counter()
    per_agent: dict[str, dict[str, float]] = defaultdict(dict)
    placed: dict[str, list[Sample]] = {}
    if sampler.vllm is not None and rollouts is None:
        sampler.vllm.sleep()  # give the GPU memory to the update (an async sampler is generating during it)
    for policy in sampler.policies.trainable():
        samples = [
            Sample(turn.agent, turn.prompt_ids, c.token_ids, c.advantage, sampler.train_temperature(turn.agent), c.sampler_logprobs,
                   masked=cfg.grpo.mask_truncated and c.truncated, token_mask=c.mask)
            for turn, c in cands
            if turn.agent in policy.agents and cfg.agent(turn.agent).trainable and turn.group in updated and c.token_ids
        ]
        if sampler.placement is not None:
            placed[policy.name] = samples  # updated below, each on its own rank group
            continue
        stats = update_policy(policy, samples, cfg, step, dist=dist)
        if sampler.vllm is not None:
            sampler.vllm.weights_changed(policy)
        for agent in policy.agents:
            per_agent[agent].update(stats)
    if sampler.placement is not None:
        for name, stats in sampler.placement.update(sampler, placed, step, update_policy).items():
            per_agent[name].update(stats)
    t_update = time.perf_counter() - t1

    # -- 4. report -------------------------------------------------------------------------------
    gen_tokens, gen_secs = got.tokens, got.gen_seconds
    if dist.enabled:  # the whole step's episodes, in rank order, on every rank
        episodes = [ep for part in dist.gather(episodes) for ep in part]
        cands, rewards, keys = _candidates(episodes)
        gen_tokens, gen_secs = int(dist.sum([gen_tokens])[0]), dist.max(gen_secs)  # the ranks generate side by side
    values = _rollout_metrics(episodes, cands, rewards, keys, per_agent)
    values.update(dynamic)
    values.update(
        step_time=time.perf_counter() - t0,
        rollout_time=t_rollout,
        update_time=t_update,
        tokens_per_s=gen_tokens / gen_secs if gen_secs else 0.0,
        generated_tokens=float(gen_tokens),
    )
    if rollouts is not None:  # how old the rollouts were, and what the step waited for them
        stale = float(rollouts.staleness(got))
        values.update({"async/staleness": stale, "async/wait_time": t_wait, "async/push_time": rollouts.push_seconds})
        for agent in per_agent:
            per_agent[agent]["async/staleness"] = stale
    metrics = StepMetrics(step=step, total_steps=cfg.optim.steps, values=values, agents=dict(per_agent))
    sink.metrics(metrics)
    sink.rollouts(step, [ep.to_dict(step) for ep in episodes])
    return metrics


def start_async_rollouts(sampler: Sampler, tasks: list[Task], *, total_steps: int, process: bool | None = None,
                         collect: Collect | None = None) -> AsyncRollouts | None:
    """The sampler of `generation.async` (training.async_rollout), working one step ahead of the
    update on `tasks`; None when the run's rollouts are synchronous (`off`). A process of its own
    where one can hold the sampler (`sampler_process`), else a thread; `process` overrides the
    choice and `collect` replaces `collect_rollouts` (bench/engine_vs_trl.py measures both kinds,
    each step's rollouts from an empty sandbox cache)."""
    mode = sampler.config.generation.async_
    if mode == "off":
        return None
    process = sampler_process(sampler) if process is None else process
    return AsyncRollouts(sampler, tasks, collect or collect_rollouts, lag=LAGS[mode], total_steps=total_steps, process=process)


def sampler_process(sampler: Sampler) -> bool:
    """Whether an async run's sampler gets its own process: a run of one process on CPU, with no
    placement, no sharded model and no vLLM engine. A launch's ranks generate together (a sharded
    model is gathered, a placement's ranks answer each other), a GPU's memory is the thread's to
    share, and the engine lives in this process (its sampler thread drives it: vLLM's kernels
    release the interpreter lock as torch's do)."""
    cfg = sampler.config
    return (not sampler.dist.enabled and sampler.placement is None and cfg.resources.parallel != "fsdp" and sampler.vllm is None
            and all(p.model is None or p.model.device.type == "cpu" for p in sampler.policies.policies.values()))


def collect_rollouts(sampler: Sampler, tasks: list[Task], step: int) -> StepRollouts:
    """Step `step`'s episodes (each process of a data-parallel launch takes its share of the
    tasks), with dynamic sampling's extra batches; in the async sampler when `generation.async`."""
    cfg, dist = sampler.config, sampler.dist
    t0 = time.perf_counter()
    tokens0, secs0 = sampler.stats.tokens, sampler.stats.seconds
    batch = step_tasks(tasks, cfg, step)[dist.rank :: dist.world]
    with generating(sampler):  # sharded models gathered whole; a placement's ranks answer each other
        episodes = _rollout(sampler, batch)
        dynamic: dict[str, float] = {}
        if cfg.grpo.dynamic_sampling:
            episodes, dynamic = _dynamic_sampling(sampler, tasks, step, batch, episodes)
    return StepRollouts(step, episodes, dynamic, time.perf_counter() - t0, sampler.stats.tokens - tokens0,
                        sampler.stats.seconds - secs0, version=step - 1)


def _rollout(sampler: Sampler, batch: list[Task]) -> list[Episode]:
    cfg = sampler.config
    check_distinct_episodes(batch)
    if cfg.grpo.sampling == "tree":
        return rollout_tree(sampler, batch)
    return rollout_independent(sampler, batch, k=cfg.grpo.k)


def signal_tasks(episodes: list[Episode]) -> list[str]:
    """The task ids, in order, of the episodes with at least one GRPO group whose candidates'
    rewards differ (under independent sampling a task's K episodes share its groups)."""
    rewards: dict[Any, list[float]] = defaultdict(list)
    for ep in episodes:
        for turn in ep.turns:
            rewards[turn.group] += [c.reward for c in turn.candidates]
    live = {g for g, rs in rewards.items() if max(rs) - min(rs) > 1e-9}
    return list(dict.fromkeys(ep.task_id for ep in episodes if any(t.group in live for t in ep.turns)))


def _dynamic_sampling(
    sampler: Sampler, tasks: list[Task], step: int, batch: list[Task], episodes: list[Episode]
) -> tuple[list[Episode], dict[str, float]]:
    """DAPO's dynamic sampling (Yu et al. 2025, sec. 3.2): keep the step's tasks that give a signal
    and roll out more batches of other tasks (at most `grpo.dynamic_sampling`) until there are as
    many such tasks as the step had. Extra batch r of step s draws `batch_indices` with the seed
    offset by r: the same tasks on a resume. With none found, the step keeps its episodes (their
    groups carry no gradient; see `groups_to_update`)."""
    cfg, dist = sampler.config, sampler.dist
    want = len(dict.fromkeys(tid for tid, _ in batch))
    kept = signal_tasks(episodes)
    pool = list(episodes)
    rounds = 0
    while len(kept) < want and rounds < cfg.grpo.dynamic_sampling:
        rounds += 1
        more = _rollout(sampler, extra_tasks(tasks, cfg, step, rounds)[dist.rank :: dist.world])
        pool += more
        kept += [tid for tid in signal_tasks(more) if tid not in kept]
    stats = {"dynamic/extra_batches": float(rounds), "dynamic/signal_tasks": float(min(len(kept), want)) / max(want, 1)}
    if not kept:
        return episodes, stats
    chosen = set(kept[:want])
    return [ep for ep in pool if ep.task_id in chosen], stats


def step_tasks(tasks: list[Task], cfg: RunConfig, step: int) -> list[Task]:
    """The step's (episode id, row) pairs, before a data-parallel launch splits them (`episode_ids`
    names them `3@7`, `3@7#2`)."""
    return episode_ids(tasks, batch_indices(len(tasks), cfg.optim.tasks_per_step, step, cfg.seed), f"{step}")


def extra_tasks(tasks: list[Task], cfg: RunConfig, step: int, round_: int) -> list[Task]:
    """Dynamic sampling's extra batch `round_` (1-based) of a step: the draw of `batch_indices` with
    the seed offset by 7919 * round_, named `3@7+1`, `3@7+1#2` (`episode_ids`)."""
    indices = batch_indices(len(tasks), cfg.optim.tasks_per_step, step, cfg.seed + 7_919 * round_)
    return episode_ids(tasks, indices, f"{step}+{round_}")


def episode_ids(tasks: list[Task], indices: list[int], draw: str) -> list[Task]:
    """(episode id, row) for each drawn index: the task's id, `@`, the draw (`7`, or `7+1` for an
    extra batch of step 7) and, from a task's second occurrence in the same draw on (a batch that
    crosses an epoch boundary, or a train set smaller than the batch), `#n`. Every episode of a
    step thus has an id of its own, so its candidates never share a GRPO group (task, turn, agent)
    with another episode's, whose state differs. The id after the last `@` names the draw, so two
    different (task, draw, n) never give the same id."""
    seen: dict[str, int] = defaultdict(int)
    out = []
    for i in indices:
        tid, row = tasks[i]
        seen[tid] += 1
        out.append((f"{tid}@{draw}" + (f"#{seen[tid]}" if seen[tid] > 1 else ""), row))
    return out


def check_distinct_episodes(batch: list[Task]) -> None:
    """Refuse a batch in which two episodes share an id: their candidates would fall into one GRPO
    group although their states differ (a bug in how the batch was drawn, never the user's)."""
    ids = [tid for tid, _ in batch]
    if len(set(ids)) != len(ids):
        twice = sorted({tid for tid in ids if ids.count(tid) > 1})
        raise RuntimeError(f"episodes {twice} appear twice in one rollout batch: each episode needs its own GRPO groups")


def _candidates(episodes: list[Episode]) -> tuple[list[tuple[Any, Any]], torch.Tensor, list[Any]]:
    """Every (turn, candidate) of the episodes, their rewards (N,) and their GRPO group keys."""
    cands = [(turn, c) for ep in episodes for turn in ep.turns for c in turn.candidates]
    rewards = torch.tensor([c.reward for _, c in cands], dtype=torch.float32)  # (N,)
    return cands, rewards, [turn.group for turn, _ in cands]


def step_advantages(episodes: list[Episode], cfg: RunConfig, dist: Dist) -> list[float]:
    """Each candidate's advantage (in `_candidates` order), from the step's rewards on every rank.

    The baseline counts each sample once: under tree sampling a sample is a candidate; under
    independent sampling it is one agent's part of one trajectory (all its turns there share that
    trajectory's return), so an agent that acted three times in a trajectory does not weigh three
    times in its (task, agent) group's mean and std. Every turn then takes its trajectory's
    advantage. `scale_rewards: batch` divides by the std of the agent's samples in the whole
    step (`group_advantages`' batch_ids): per agent, because agents' rewards need not share a
    scale; over every rank's samples, gathered first, as TRL gathers before it normalises. A
    rank's groups are its own (it rolls out whole tasks), so `group` and `none` give the same
    values either way."""
    per_trajectory = cfg.grpo.sampling == "independent"
    units: list[tuple[float, Any, str]] = []  # (reward, group, agent) of each sample the baseline counts
    unit_of: list[int] = []  # each candidate's sample
    for ep in episodes:
        mine: dict[str, int] = {}
        for turn in ep.turns:
            for c in turn.candidates:
                if not per_trajectory or turn.agent not in mine:
                    mine[turn.agent] = len(units)
                    units.append((c.reward, turn.group, turn.agent))
                unit_of.append(mine[turn.agent])
    parts = dist.gather(units)
    offset = sum(len(part) for part in parts[: dist.rank])
    everyone = [u for part in parts for u in part]
    adv = group_advantages(
        torch.tensor([r for r, _, _ in everyone], dtype=torch.float32),  # (U,)
        [g for _, g, _ in everyone],
        scale=cfg.grpo.scale_rewards,
        eps=cfg.grpo.adv_eps,
        batch_ids=[a for _, _, a in everyone],
    )[offset : offset + len(units)].tolist()  # (U_rank,)
    return [adv[u] for u in unit_of]


def _shape_overlong(episodes: list[Episode], cfg: RunConfig) -> None:
    """Add DAPO's soft overlong penalty (`soft_overlong_penalty`) to every candidate's reward.

    max_new_tokens caps each generation, so the penalty judges the candidate's longest segment
    against it: a turn that calls a tool and writes 84 + 53 tokens under a cap of 100 is not
    punished (its longest segment has 84). Under independent sampling an agent's penalties in a
    trajectory add up, as its local rewards do, and each of its turns there gets the sum (they
    share one return)."""
    per_trajectory = cfg.grpo.sampling == "independent"
    for ep in episodes:
        total: dict[str, float] = defaultdict(float)
        for turn in ep.turns:
            cap = cfg.agent(turn.agent).max_new_tokens or cfg.generation.max_new_tokens
            for c in turn.candidates:
                penalty = soft_overlong_penalty(c.longest_segment, max_len=cap, cache=cfg.grpo.overlong_cache)
                if per_trajectory:
                    total[turn.agent] += penalty
                else:
                    c.reward += penalty
        if per_trajectory:
            for turn in ep.turns:
                for c in turn.candidates:
                    c.reward += total[turn.agent]


def completion_budget(cfg: RunConfig, agent: str) -> int:
    """The most tokens the agent can write in one turn: max_new_tokens per generation, times the
    generations of a turn (1, or 1 + `generation.max_tool_calls` for an agent with tools). Dr.
    GRPO's constant L for a policy is the largest of its agents' (`update_policy`)."""
    cap = cfg.agent(agent).max_new_tokens or cfg.generation.max_new_tokens
    return cap * (1 + cfg.generation.max_tool_calls if cfg.agent(agent).tools else 1)


def groups_to_update(cands: list[tuple[Any, Any]], *, beta: float) -> set[Any]:
    """The GRPO groups whose candidates enter the update.

    A group whose candidates all got the same reward has zero advantages. With beta == 0 it adds
    nothing to the gradient and is left out (less compute; the loss's sample and token counts
    then cover the groups with a signal, as after DAPO's dynamic-sampling filter, where TRL
    would count them in the denominators). With beta > 0 its candidates still carry the KL
    penalty to the reference, so every group stays in, as in TRL."""
    by_group: dict[Any, list[float]] = defaultdict(list)
    for turn, c in cands:
        by_group[turn.group].append(c.reward)
    if beta > 0:
        return set(by_group)
    return {g for g, rs in by_group.items() if len(rs) > 1 and max(rs) - min(rs) > 1e-9}


def _rollout_metrics(
    episodes: list[Episode], cands: list[tuple[Any, Any]], rewards: torch.Tensor, keys: list[Any], per_agent: dict[str, dict[str, float]]
) -> dict[str, float]:
    values = {
        "reward/total": float(rewards.mean()),
        "reward/team": float(np.mean([c.team for _, c in cands])),
        "reward/local": float(np.mean([c.local for _, c in cands])),
        "reward/std": float(rewards.std()) if len(rewards) > 1 else 0.0,
        "success": float(np.mean([ep.success for ep in episodes])),
        "zero_std_frac": zero_std_fraction(rewards, keys),
        "completion_len": float(np.mean([c.model_tokens for _, c in cands])),
        "truncated": float(np.mean([c.truncated for _, c in cands])),
        "ended": float(np.mean([not c.truncated for _, c in cands])),
        "turns": float(np.mean([len(ep.turns) for ep in episodes])),
    }
    for name in dict.fromkeys(name for _, c in cands for name in c.reward_parts):  # each reward function, before its weight,
        values[f"reward/fn/{name}"] = float(np.mean([c.reward_parts[name] for _, c in cands if name in c.reward_parts]))  # where it applied
    if any(c.calls for _, c in cands):  # agents with tools: calls per candidate, and the share that failed
        values["segment_len"] = float(np.mean([c.longest_segment for _, c in cands]))  # what max_new_tokens caps
        calls = [call for _, c in cands for call in c.calls]
        values["tool_calls"] = len(calls) / len(cands)
        values["tool_errors"] = float(np.mean([bool(call["error"]) for call in calls]))
    by_agent: dict[str, list[tuple[Any, Any]]] = defaultdict(list)
    for turn, c in cands:
        by_agent[turn.agent].append((turn, c))
    for agent, items in by_agent.items():
        r = torch.tensor([c.reward for _, c in items])
        per_agent[agent].update(
            {
                "reward/total": float(r.mean()),
                "reward/team": float(np.mean([c.team for _, c in items])),
                "reward/local": float(np.mean([c.local for _, c in items])),
                "reward/std": float(r.std()) if len(r) > 1 else 0.0,
                "success": agent_success(episodes, agent),
                "completion_len": float(np.mean([c.model_tokens for _, c in items])),
                "truncated": float(np.mean([c.truncated for _, c in items])),
                "ended": float(np.mean([not c.truncated for _, c in items])),
                "zero_std_frac": zero_std_fraction(r, [t.group for t, _ in items]),
                "adv/mean": float(np.mean([c.advantage for _, c in items])),
                "adv/std": float(np.std([c.advantage for _, c in items])),
            }
        )
    return values


def agent_success(episodes: list[Episode], agent: str) -> float:
    """An agent's success: the share of the episodes it acted in that the environment judged
    solved at their end (`State.success`, the team's outcome). Its own local reward does not
    count: a format reward or a partial credit would make a wrong answer look like a success.
    0.0 when the agent never acted."""
    mine = [ep.success for ep in episodes if any(t.agent == agent for t in ep.turns)]
    return float(np.mean(mine)) if mine else 0.0


# == the update ====================================================================================


def update_policy(policy: Policy, samples: list[Sample], cfg: RunConfig, step: int, *, dist: Dist | None = None) -> dict[str, float]:
    """GRPO update of one policy: `num_iterations` passes, micro-batched, clipped, one optimizer step each.

    Under a data-parallel launch every rank calls this with its own samples (maybe none): the
    loss is normalised by the global counts and the gradients are summed before the step."""
    assert policy.optimizer is not None
    dist = dist or Dist()
    lr = _lr_at(cfg, step)
    for group in policy.optimizer.param_groups:
        group["lr"] = lr
    n_samples, total_tokens = dist.sum([len(samples), sum(len(s.completion_ids) if s.token_mask is None else sum(s.token_mask)
                                                          for s in samples if not s.masked)])
    if not n_samples:
        return {"lr": lr, "samples": 0.0}
    # dr_grpo's constant: the most tokens the policy's agents can write in a turn (Dr. GRPO; TRL's
    # max_completion_length), not the longest completion of this step
    max_len = max(completion_budget(cfg, a) for a in policy.agents)
    g = cfg.grpo
    pad = policy.tokenizer.pad_token_id or 0
    device = next(policy.model.parameters()).device
    micro = _micro_batches(samples, cfg.optim.micro_batch_size, cfg.optim.micro_batch_tokens)
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
                if "sampler_logp" in b and not mismatch[i]:  # vLLM sampled: weigh by pi_old / pi_vLLM, once per batch
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
                weight = micro_batch_weight(g.loss_type, mask, n_samples=int(n_samples), n_tokens=int(total_tokens))
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
    out.update(grad_norm=grad_norm, lr=lr, samples=float(n_samples))
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
        if s.token_mask is not None:
            tokens[i, :c] = torch.tensor(s.token_mask, dtype=torch.float32)
        if s.masked:
            loss[i] = 0.0
        if s.sampler_logprobs is not None:
            sampler_logp[i, :c] = torch.tensor(s.sampler_logprobs, dtype=torch.float32)
    batch = {
        "input_ids": ids,
        "attention_mask": attn,
        "completion_mask": comp,
        "loss_mask": comp.float() * tokens * loss,  # (B, Tc)
        "advantages": torch.tensor([s.advantage for s in samples], dtype=torch.float32),  # (B,)
    }
    if all(s.sampler_logprobs is not None for s in samples):  # vLLM sampled them
        batch["sampler_logp"] = sampler_logp  # (B, Tc)
    return batch


def _lr_at(cfg: RunConfig, step: int) -> float:
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


# == evaluation =====================================================================================

EVAL_BATCH = 64
"""Most held-out tasks generated together (an evaluation of 100 tasks runs as 2 batches of 50):
fewer would slow it down (the tiny model's 100 tasks in batches of 25 took twice the CPU time)."""


def evaluate(
    sampler: Sampler,
    tasks: list[Task],
    *,
    step: int,
    sink: EventSink | None = None,
    on_progress: Callable[[float, int, int], None] | None = None,
) -> list[dict[str, Any]]:
    """Held-out success for the team and per agent: greedy (eval_temperature), and sampled at the
    training temperature when `eval.sampled`. Uses its own RNG so training draws are unchanged.

    The tasks go in batches of at most `EVAL_BATCH`; a long evaluation says how far it got:
    `on_progress(share, done, n)` first, after each batch's turn and at the end (`done` of the `n`
    episodes finished, `share` of the work done)."""
    cfg = sampler.config
    tasks = tasks[: cfg.eval.size]
    temps = [cfg.generation.eval_temperature]
    if cfg.eval.sampled:
        temps.append(cfg.generation.temperature)
    saved = sampler.generator.get_state()
    results = []
    n = len(tasks) * len(temps)
    batch = math.ceil(len(tasks) / math.ceil(len(tasks) / EVAL_BATCH)) if tasks else 1
    turns = cfg.topology.max_turns

    def report(done: int, share: float) -> None:
        if on_progress is not None:
            on_progress(min(1.0, share / max(n, 1)), done, n)

    report(0, 0.0)
    for i, temp in enumerate(temps):
        sampler.generator.manual_seed(cfg.seed + 99_991 * (step + 1))
        episodes: list[Episode] = []
        for start in range(0, len(tasks), batch):
            chunk, before = tasks[start : start + batch], i * len(tasks) + len(episodes)
            episodes += rollout_independent(
                sampler, chunk, k=1, temperature=temp, on_turn=partial(_turn_done, report, before, len(chunk), turns)
            )
            report(before + len(chunk), before + len(chunk))
        agents: dict[str, dict[str, float]] = {}
        for name in dict.fromkeys(cfg.topology.order()):
            mine = [t.candidates[0] for ep in episodes for t in ep.turns if t.agent == name]
            agents[name] = {
                "success": agent_success(episodes, name),
                "reward": float(np.mean([c.local for c in mine])) if mine else 0.0,
            }
        result = {
            "step": step,
            "split": "eval",
            "temperature": temp,
            "n": len(episodes),
            "team": {"success": float(np.mean([ep.success for ep in episodes])) if episodes else 0.0},
            "agents": agents,
            "examples": [ep.to_dict(step) for ep in episodes[:3]],
        }
        results.append(result)
        if sink is not None:
            sink.evaluation(result)
    sampler.generator.set_state(saved)
    return results


def _turn_done(report: Callable[[int, float], None], before: int, size: int, turns: int, turn: int) -> None:
    """A batch of `size` evaluation episodes after the `before` finished ones has done `turn` of
    its `turns` turns (the batch's end is reported with its episodes)."""
    if turn < turns:
        report(before, before + size * turn / turns)


def evaluate_checkpoint(config: RunConfig, checkpoint: str | Path | None, *, sink: EventSink | None = None) -> list[dict[str, Any]]:
    """Evaluate base models (checkpoint None) or a saved checkpoint on the run's held-out tasks."""
    env = load_environment(config.topology.environment, **config.topology.env_args)
    _, eval_tasks = load_tasks(config, env)
    step = 0
    if checkpoint is not None and (state_file := Path(checkpoint) / STATE_FILE).exists():
        step = int(torch.load(state_file, weights_only=False)["step"])
    with checkpoint_sampler(config, env, checkpoint) as sampler:
        return evaluate(sampler, eval_tasks, step=step, sink=sink)


# == checkpoints =====================================================================================


def save_checkpoint(
    out: Path, step: int, policies: PolicySet, generator: torch.Generator, cfg: RunConfig, sink: EventSink, *, dist: Dist | None = None,
    extra: Callable[[Path], None] | None = None,
    placement: Placement | None = None,
) -> str:
    """`out/checkpoints/step-NNNNNN/`: one HF/PEFT folder per policy plus optimizer, RNG and step
    state. Written to a temp folder and renamed, so a crash never leaves half a checkpoint.
    Under a data-parallel launch rank 0 writes it, with every rank's sampling generator."""
    dist = dist or Dist()
    generators = dist.gather(generator.get_state())
    root = out / "checkpoints"
    final = root / f"step-{step:06d}"
    tmp = root / f".step-{step:06d}.tmp"
    if dist.main:
        shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier()
    done = sharding.save_models(policies, tmp, cfg, dist, placement)  # sharded or placed policies, from their own ranks
    dist.barrier()
    if not dist.main:
        dist.barrier()
        return str(final)
    save_policies(policies, tmp, skip=done)
    torch.save(
        {
            "step": step,
            "optimizers": {name: p.optimizer.state_dict() for name, p in policies.policies.items() if p.optimizer and name not in done},
            "generator": generator.get_state(),
            "generators": generators,
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
            "numpy_rng": np.random.get_state(),
            "config": cfg.to_yaml(),
        },
        tmp / STATE_FILE,
    )
    if extra is not None:  # more state written into the folder before it is renamed (`AsyncRollouts.save`)
        extra(tmp)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    if cfg.checkpoint.keep:
        kept = sorted(p for p in root.glob("step-*") if p.is_dir())
        for old in kept[: -cfg.checkpoint.keep]:
            shutil.rmtree(old, ignore_errors=True)
    sink.checkpoint(step, str(final))
    dist.barrier()
    return str(final)


def check_resume(config: RunConfig) -> None:
    """Refuse to resume from a checkpoint whose run had another data order or other groups
    (`training.config.RESUME_EXACT`) unless `checkpoint.allow_config_changes` says so."""
    state_file = Path(str(config.checkpoint.resume_from)) / STATE_FILE
    if config.checkpoint.allow_config_changes or not state_file.is_file():
        return  # restore() says what is wrong with a folder that is no checkpoint
    saved = torch.load(state_file, weights_only=False, map_location="cpu").get("config")
    if not saved:
        return  # a checkpoint from before configs were stored in it
    changed = resume_differences(RunConfig.from_yaml(saved), config.replace(**{"checkpoint.resume_from": None}))
    if changed:
        raise ConfigError(
            "checkpoint.resume_from",
            "this config differs from the checkpoint's in fields a resumed run must keep to replay the same data "
            f"order and groups: {'; '.join(changed[:8])}{' ...' if len(changed) > 8 else ''}. Keep them, or set "
            "checkpoint.allow_config_changes: true to resume anyway",
        )


def restore(
    folder: Path, policies: PolicySet, generator: torch.Generator, *, dist: Dist | None = None, config: RunConfig | None = None,
    placement: Placement | None = None,
) -> int:
    """Load weights, optimizer and RNG state from a checkpoint; return its step. A rank of a
    data-parallel launch takes its own generator when the checkpoint has one for it (saved by a
    launch of the same size); otherwise rank 0 takes the saved one and the others start fresh
    streams from the seed, the step and their rank."""
    dist = dist or Dist()
    state_file = folder / STATE_FILE
    if not state_file.is_file():
        raise FileNotFoundError(f"{folder} is not a Troupe checkpoint (no {STATE_FILE})")
    done = sharding.restore_models(policies, folder, config, dist, placement) if config is not None else set()  # dcp/<policy>/
    load_policy_weights(policies, folder, skip=done)
    state = torch.load(state_file, weights_only=False)
    for name, opt_state in state["optimizers"].items():
        if name in done:
            continue
        opt = policies.policies[name].optimizer
        if opt is not None:
            opt.load_state_dict(opt_state)
    saved = state.get("generators") or [state["generator"]]
    if len(saved) == dist.world:
        generator.set_state(saved[dist.rank])
    elif dist.main:
        generator.set_state(state["generator"])
    else:
        generator.manual_seed(hash((int(state["step"]), dist.rank)) % 2**63)
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    np.random.set_state(state["numpy_rng"])
    return int(state["step"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)

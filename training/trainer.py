"""The AT-GRPO loop, on one rank. Reads top to bottom:

    setup:  seed -> environment and tasks -> policies (placed, sharded, warm-started) -> sampler
            -> resume -> generation backend -> async sampler -> the plan, logged once
    loop:   each step: rollout (tree sampling) -> score -> advantages per (task, turn, agent)
            -> update each policy with its own agents' samples -> report -> evaluate / checkpoint

What runs where is not decided here: the runner (`training.runner`) resolves the run's plan
(`training.plan`), starts the processes, and every rank calls `train`. Each concern is a part with
its own module, taking its config section: `collect` (the step's tasks and rollouts, dynamic
sampling, the async sampler), `shaping` (overlong penalty, advantages, groups that enter the
update), `update` (one policy's GRPO step), `metrics`, `evaluation`, `checkpoints`, `seeding`.

Callers that need more than the product's run (benchmarks, research harnesses) drive this same
loop through `Hooks` (before and after each step, each evaluation), or `setup` + `loop` when they
need the parts afterwards; none re-assembles it.

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

import contextlib
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agents.envs import load_environment
from agents.verifiers import load_reward_fn
from training import sharding
from training.async_rollout import AsyncRollouts, Collect, SamplerStopped
from training.checkpoints import check_resume, restore, save_checkpoint
from training.collect import collect_rollouts, start_async_rollouts
from training.config import RunConfig, config_warnings
from training.data import Task, load_tasks
from training.distributed import Dist
from training.evaluation import evaluate
from training.events import EventSink, StepMetrics, TrainResult
from training.llamacpp_backend import LlamaCppGenerator
from training.metrics import rollout_metrics
from training.models import needs_conversion, resolve_model_dir
from training.placement import Placement, generating
from training.plan import Plan
from training.policies import build_policies
from training.progress import RunProgress
from training.rollout import Sampler
from training.seeding import run_generator, seed_everything
from training.shaping import candidates, groups_to_update, shape_overlong, step_advantages
from training.trackers import reporting
from training.update import Sample, update_policy
from training.vllm_backend import VLLMGenerator
from training.warmstart import init_from


@dataclass
class Hooks:
    """What a caller adds to the loop, on rank 0 (the other ranks of a launch run the loop bare).

    `before_step(step)` runs before step `step` starts (a benchmark clears a cache there),
    `after_step(metrics)` after it has been reported. `evaluate(parts, step, final)` replaces the
    held-out evaluation at `step` (`final`: the run's last), returning the evaluations it made
    (`training.evaluation.evaluate`'s dicts, or none to skip one); it is called with the async
    sampler idle, exactly where the run's own evaluation would run."""

    before_step: Callable[[int], None] | None = None
    after_step: Callable[[StepMetrics], None] | None = None
    evaluate: Callable[[Parts, int, bool], list[dict[str, Any]]] | None = None


@dataclass
class Parts:
    """A run's parts on this rank, as `setup` built them."""

    config: RunConfig
    out: Path
    sink: EventSink
    """The run's sink, with the trackers of `report_to` on rank 0."""
    plan: Plan
    sampler: Sampler
    train_tasks: list[Task]
    eval_tasks: list[Task]
    progress: RunProgress
    start_step: int = 0
    rollouts: AsyncRollouts | None = None
    collect: Collect = collect_rollouts
    """How a step's rollouts are made, here or in the async sampler (`setup`'s `collect`)."""


def train(config: RunConfig, *, out_dir: str | Path, sink: EventSink, plan: Plan | None = None, dist: Dist | None = None,
          hooks: Hooks | None = None) -> TrainResult:
    """Run this rank's part of a GRPO run (the whole run in one process). Raises on failure;
    returns `cancelled` when the sink asks to stop. Launching processes is the runner's
    (`training.runner.train`); a rank of a launch passes its `dist`."""
    with setup(config, out_dir=out_dir, sink=sink, plan=plan, dist=dist) as parts:
        return loop(parts, hooks or Hooks())


@contextlib.contextmanager
def setup(config: RunConfig, *, out_dir: str | Path, sink: EventSink, plan: Plan | None = None,
          dist: Dist | None = None, collect: Collect = collect_rollouts) -> Iterator[Parts]:
    """Build a GRPO run's parts on this rank; on the way out, stop its sampler and its engine.
    `collect` replaces `training.collect.collect_rollouts` (a module-level function, which a
    sampler process imports by name): the benchmarks roll out each step from an empty sandbox cache."""
    config.validate()
    if config.algorithm != "grpo":
        raise ValueError(f"training.trainer runs GRPO; an `algorithm: {config.algorithm}` run goes through training.runner.train")
    plan = plan or Plan.resolve(config)
    dist = dist or Dist()
    out = Path(out_dir)
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
    generator = run_generator(config.seed, dist)
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

    if plan.backend == "vllm":
        sampler.engine = VLLMGenerator(config, policies)
    elif plan.backend == "llamacpp":
        sampler.engine = LlamaCppGenerator(config, policies)
    rollouts = start_async_rollouts(sampler, train_tasks, plan=plan, total_steps=config.optim.steps, collect=collect)
    try:
        if rollouts is not None:
            if rollouts.note:  # the host cannot hold the sampler process's shared weights
                plan = plan.sampler_thread(rollouts.note)
            resumed = bool(config.checkpoint.resume_from) and rollouts.load(Path(str(config.checkpoint.resume_from)), start_step)
            if config.generation.async_ != "off":
                sink.log(f"generation.async: {config.generation.async_}: the sampler generates each next step's rollouts during the "
                         f"update ({rollouts.threads} torch thread{'s' if rollouts.threads != 1 else ''} each)"
                         f"{'; the next rollouts come from the checkpoint' if resumed else ''}")
            if plan.sampler_dtype:
                sink.log(f"generation.dtype: {plan.sampler_dtype}: the rollouts come from a {plan.sampler_dtype} copy of the trained "
                         "weights, refreshed before each step's rollouts; the update corrects its numbers with truncated importance "
                         "sampling (mismatch/logp_diff); held-out evaluation runs on the trainer's weights")
            if plan.backend == "vllm" and sampler.engine is not None and not sampler.engine.cuda:
                sink.log("generation.async with vLLM on CPU: the engine, driven from the sampler thread, shares the cores with the update "
                         "and was measured slower per step than a synchronous vLLM run (docs/benchmarks.md, \"vLLM and generation.async\"); "
                         "on CPU the HF backend's sampler process is the fast async path", level="warning")
        plan.report(sink)
        with reporting(config, out, sink, main=dist.main) as run_sink:  # + the trackers of `report_to`, on rank 0
            yield Parts(config, out, run_sink, plan, sampler, train_tasks, eval_tasks, progress, start_step, rollouts, collect)
    finally:
        if rollouts is not None:
            rollouts.close()
        if sampler.engine is not None:
            sampler.engine.close()
        sampler.pool.shutdown()
        close_env = getattr(env, "close", None)  # an environment's own processes (agents.envs.task: its Python graders)
        if callable(close_env):
            close_env()


def loop(parts: Parts, hooks: Hooks) -> TrainResult:
    """Train from `parts.start_step` to `optim.steps`, evaluating and checkpointing on the way."""
    config, sink, sampler, rollouts, progress = parts.config, parts.sink, parts.sampler, parts.rollouts, parts.progress
    dist = sampler.dist
    total = config.optim.steps
    sink.run_started(total_steps=total, start_step=parts.start_step)
    result = TrainResult(status="succeeded", step=parts.start_step, start_step=parts.start_step)
    evaluates = bool(config.eval.every and parts.eval_tasks)

    def run_eval(at: int, final: bool) -> None:
        if rollouts is not None:  # the sampler idle: the run's generator is free, as in a synchronous run
            rollouts.settle()
        with generating(sampler):  # under a placement the other ranks answer rank 0's generations
            if dist.main:
                result.evaluations.extend(hooks.evaluate(parts, at, final) if hooks.evaluate is not None else held_out(parts, at))
        dist.barrier()

    def run_checkpoint(at: int) -> str:
        progress.checkpointing(at)
        if rollouts is not None:  # the batch in flight done: the generator's state follows it, and the checkpoint keeps it
            rollouts.settle()
        path = save_checkpoint(parts.out, at, sampler.policies, sampler.generator, config, sink, dist=dist,
                               extra=rollouts.save if rollouts else None, placement=sampler.placement)
        progress.checkpointed()
        return path

    if parts.start_step == 0 and evaluates:
        run_eval(0, final=False)

    step = parts.start_step
    last_ckpt: str | None = None
    if rollouts is not None and dist.world == 1:  # a stop lands while it waits for a stuck sampler (issue 45, class 5)
        rollouts.should_stop = sink.should_stop
    try:
        while step < total:
            if dist.any(sink.should_stop()):
                result.status = "cancelled"
                sink.log(f"stop requested: saving a checkpoint at step {step}")
                progress.stopping(step)
                break
            step += 1
            if hooks.before_step is not None and dist.main:
                hooks.before_step(step)
            progress.training(step)
            try:
                metrics = train_step(sampler, parts.train_tasks, step, sink, rollouts, collect=parts.collect)
            except SamplerStopped:
                step -= 1  # not trained
                raise
            progress.trained()
            if hooks.after_step is not None and dist.main:
                hooks.after_step(metrics)
            result.final_metrics = metrics.values
            if evaluates and step % config.eval.every == 0 and step < total:
                run_eval(step, final=False)
            if config.checkpoint.every and step % config.checkpoint.every == 0 and step < total:
                last_ckpt = run_checkpoint(step)
    except SamplerStopped as exc:  # the sampler abandoned (its process killed): the run stops as a stopped run does
        result.status = "cancelled"
        sink.log(f"{exc}: saving a checkpoint at step {step}")
        progress.stopping(step)

    if result.status == "succeeded" and evaluates:
        run_eval(step, final=True)
    if step > parts.start_step or last_ckpt is None:
        last_ckpt = run_checkpoint(step)
    result.step, result.checkpoint = step, last_ckpt
    return result


def held_out(parts: Parts, at: int) -> list[dict[str, Any]]:
    """The run's own held-out evaluation at step `at`, reported to its sink (what `Hooks.evaluate`
    replaces, and may call)."""
    return evaluate(parts.sampler, parts.eval_tasks, step=at, sink=parts.sink,
                    on_progress=lambda share, done, n: parts.progress.evaluating(at, done, n, share))


# == one training step =============================================================================


MAX_NOTES = 5
"""Distinct grader failures logged per step (the rest are counted)."""


def train_step(sampler: Sampler, tasks: list[Task], step: int, sink: EventSink, rollouts: AsyncRollouts | None = None, *,
               collect: Collect = collect_rollouts) -> StepMetrics:
    """One step: rollout -> advantages -> update each trainable policy -> report."""
    cfg = sampler.config
    t0 = time.perf_counter()
    dist = sampler.dist

    # -- 1. rollout: here, or taken from the async sampler that made them during the last update ---
    got = collect(sampler, tasks, step) if rollouts is None else rollouts.take(step)
    episodes, dynamic, t_rollout = got.episodes, got.dynamic, got.seconds
    t_wait = time.perf_counter() - t0

    # -- 2. advantages per group key -------------------------------------------------------------
    if cfg.grpo.overlong_cache:
        shape_overlong(episodes, cfg)
    cands, rewards, keys = candidates(episodes)
    for (_, c), a in zip(cands, step_advantages(episodes, cfg, dist)):
        c.advantage = a
    updated = groups_to_update(cands, beta=cfg.grpo.beta)

    # -- 3. update each trainable policy with its own agents' samples -------------------------------
    t1 = time.perf_counter()
    per_agent: dict[str, dict[str, float]] = defaultdict(dict)
    placed: dict[str, list[Sample]] = {}
    if sampler.engine is not None and rollouts is None:
        sampler.engine.sleep()  # give the GPU memory to the update (an async sampler is generating during it)
    counted = cfg.grpo.zero_signal == "count"  # groups without a signal stay in the loss's counts, as in TRL
    for policy in sampler.policies.trainable():
        samples = [
            Sample(turn.agent, turn.prompt_ids, c.generation.token_ids, c.advantage, sampler.train_temperature(turn.agent),
                   c.generation.logprobs, masked=cfg.grpo.mask_truncated and c.generation.truncated, signal=turn.group in updated,
                   mask=c.generation.mask)
            for turn, c in cands
            if turn.agent in policy.agents and cfg.agent(turn.agent).trainable and (counted or turn.group in updated)
            and c.generation.token_ids
        ]
        if sampler.placement is not None:
            placed[policy.name] = samples  # updated below, each on its own rank group
            continue
        stats = update_policy(policy, samples, cfg, step, dist=dist)
        if sampler.engine is not None:
            sampler.engine.weights_changed(policy)
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
        cands, rewards, keys = candidates(episodes)
        gen_tokens, gen_secs = int(dist.sum([gen_tokens])[0]), dist.max(gen_secs)  # the ranks generate side by side
    values = rollout_metrics(episodes, cands, rewards, keys, per_agent)
    values.update(dynamic)
    values.update(
        step_time=time.perf_counter() - t0,
        rollout_time=t_rollout,
        update_time=t_update,
        tokens_per_s=gen_tokens / gen_secs if gen_secs else 0.0,
        generated_tokens=float(gen_tokens),
    )
    if rollouts is not None and cfg.generation.async_ != "off":  # how old the rollouts were, and what the step waited for them
        stale = float(rollouts.staleness(got))
        values.update({"async/staleness": stale, "async/wait_time": t_wait, "async/push_time": rollouts.push_seconds})
        for agent in per_agent:
            per_agent[agent]["async/staleness"] = stale
    metrics = StepMetrics(step=step, total_steps=cfg.optim.steps, values=values, agents=dict(per_agent))
    notes = list(dict.fromkeys(note for _, c in cands for note in c.notes))  # a task's grader that failed on a candidate
    for note in notes[:MAX_NOTES]:
        sink.log(f"step {step}: {note} (that candidate got no reward from it)", level="warning")
    if len(notes) > MAX_NOTES:
        sink.log(f"step {step}: {len(notes) - MAX_NOTES} more grader failures like these", level="warning")
    sink.metrics(metrics)
    sink.rollouts(step, [ep.to_dict(step) for ep in episodes])
    return metrics


def _prefetch_models(config: RunConfig, progress: RunProgress) -> None:
    """Resolve (convert, or find in the cache) every model the run loads."""
    for source in sorted({config.model.source, *(config.agent_model(a) for a in config.topology.agents)}):
        if needs_conversion(source):
            progress.converting(source)
        if not source.startswith("tiny-random:"):
            resolve_model_dir(source)

"""TRL's GRPOTrainer set up on exactly Troupe's single-agent math_tool task (for the benchmarks).

Same prompts (Troupe's chat-templated tool prompt, in Troupe's batch order), same reward
(math_tool's `env.step`: alpha * team + local), same optimisation settings as the Troupe config.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from training.config import RunConfig
from training.data import Task, batch_indices
from training.rollout import Sampler


def troupe_order_rows(sampler: Sampler, tasks: list[Task], config: RunConfig) -> tuple[list[dict[str, Any]], list[list[int]]]:
    """One dataset row per task in the order Troupe's steps draw them, and Troupe's prompt ids for each."""
    env = sampler.env
    agent = config.topology.order()[0]
    role = config.agent(agent).role
    instructions = config.agent(agent).instructions or env.default_instructions[role]
    rows, ids = [], []
    for step in range(1, config.optim.steps + 1):
        for i in batch_indices(len(tasks), config.optim.tasks_per_step, step, config.seed):
            tid, row = tasks[i]
            state = env.reset(row, task_id=tid, roles=(role,))
            ids.append(list(sampler.prompt(agent, state)[1]))
            prompt = [{"role": "system", "content": instructions}, {"role": "user", "content": env.observe(state, role)}]
            rows.append({"prompt": prompt, **{k: row[k] for k in ("question", "answer", "level")}})
    return rows, ids


class MathToolReward:
    """A TRL reward function that scores each completion with math_tool's `env.step`, in a
    4-thread pool as Troupe's sampler does. Records tokens, mean reward and length per call."""

    __name__ = "math_tool_reward"

    def __init__(self, sampler: Sampler, config: RunConfig):
        self.env, self.alpha = sampler.env, config.grpo.alpha
        agent = config.topology.order()[0]
        self.agent, self.role = agent, config.agent(agent).role
        self.pool = ThreadPoolExecutor(max_workers=4)
        self.calls: list[dict[str, float]] = []

    def __call__(self, prompts: list[Any], completions: list[Any], completion_ids: list[list[int]], question: list[str], answer: list[str], level: list[int], **_: Any) -> list[float]:
        def one(i: int) -> float:
            state = self.env.reset({"question": question[i], "answer": answer[i], "level": level[i]}, task_id=f"trl-{i}", roles=(self.role,))
            r = self.env.step(state, agent=self.agent, role=self.role, action=completions[i][0]["content"])
            return self.alpha * r.team_reward + r.local_reward

        rewards = list(self.pool.map(one, range(len(completions))))
        self.calls.append(
            {
                "tokens": float(sum(len(c) for c in completion_ids)),
                "reward": statistics.fmean(rewards),
                "completion_len": statistics.fmean(len(c) for c in completion_ids),
            }
        )
        return rewards


def _troupe_dtype(config: RunConfig) -> torch.dtype:
    from training.models import trained_dtype

    return trained_dtype(config.model.dtype)


def build_trainer(
    config: RunConfig, sampler: Sampler, tasks: list[Task], *, out_dir: Path, lora: bool, callbacks: list[Any], use_vllm: bool = False
) -> tuple[Any, MathToolReward, Callable[[], float]]:
    """A GRPOTrainer mirroring `config`. Returns it, its reward function, and a function that
    returns (and resets) the seconds spent in TRL's generation since the last call. `use_vllm`:
    TRL's colocated vLLM (GPU), with Troupe's share of GPU memory and sleep mode."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from training.models import load_model

    rows, troupe_ids = troupe_order_rows(sampler, tasks, config)
    reward = MathToolReward(sampler, config)
    model, tokenizer = load_model(config.model.source, dtype=config.model.dtype)
    micro = config.optim.micro_batch_size
    completions = config.optim.tasks_per_step * config.grpo.k
    if completions % micro:
        raise ValueError(f"tasks_per_step * k = {completions} must be a multiple of micro_batch_size {micro} for TRL")
    args = GRPOConfig(
        output_dir=str(out_dir),
        use_vllm=use_vllm,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=config.generation.vllm_gpu_memory_utilization,
        vllm_enable_sleep_mode=use_vllm,
        max_steps=config.optim.steps,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=completions // micro,  # one generation of tasks*k completions per step
        num_generations=config.grpo.k,
        max_completion_length=config.generation.max_new_tokens,
        temperature=config.generation.temperature,
        top_p=config.generation.top_p,
        learning_rate=config.optim.lr,
        lr_scheduler_type="constant",
        warmup_steps=config.optim.warmup_steps,
        weight_decay=config.optim.weight_decay,
        adam_beta1=0.9,
        adam_beta2=0.99,  # Troupe's AdamW betas
        max_grad_norm=config.optim.max_grad_norm,
        loss_type=config.grpo.loss_type,
        scale_rewards=config.grpo.scale_rewards,
        epsilon=config.grpo.eps_low,
        epsilon_high=config.grpo.eps_high,
        beta=config.grpo.beta,
        num_iterations=config.grpo.num_iterations,
        shuffle_dataset=False,  # Troupe's order, so step i trains on the same tasks
        gradient_checkpointing=config.model.gradient_checkpointing,
        bf16=_troupe_dtype(config) == torch.bfloat16,  # Troupe's dtype: fp32 on CPU, bf16 on GPU
        fp16=_troupe_dtype(config) == torch.float16,
        use_cpu=not torch.cuda.is_available(),
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=config.seed,
        dataloader_num_workers=0,
    )
    peft_config = None
    if lora:
        lc = config.lora
        peft_config = LoraConfig(r=lc.r, lora_alpha=lc.alpha, lora_dropout=lc.dropout, target_modules=list(lc.target_modules), task_type="CAUSAL_LM")
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=callbacks,
    )
    trainer.remove_callback(PrinterCallback)  # no per-step log dicts on stdout
    trl_ids = trainer._tokenize_prompts([r["prompt"] for r in rows[: config.optim.tasks_per_step]])[0]
    if [list(x) for x in trl_ids] != troupe_ids[: config.optim.tasks_per_step]:
        raise SystemExit("TRL's prompt tokens differ from Troupe's; the comparison would not be fair")

    gen_secs = [0.0]
    original = trainer._generate_single_turn

    def timed(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return original(*a, **k)
        finally:
            gen_secs[0] += time.perf_counter() - t0

    trainer._generate_single_turn = timed

    def take_gen_secs() -> float:
        value, gen_secs[0] = gen_secs[0], 0.0
        return value

    return trainer, reward, take_gen_secs

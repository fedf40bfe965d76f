"""Rollouts: agents act in an environment; every sampled action is scored.

AT-GRPO tree sampling (`rollout_tree`): for each task, at each turn, the acting agent samples
K candidate actions from the same state; the environment scores every candidate; the K form one
GRPO group keyed by (task, turn, agent); the episode continues from the best-scoring candidate.
All tasks' candidates for one agent are generated in one batch, the prompt prefill shared.

Plain GRPO (`rollout_independent`): K independent trajectories per task; each agent's samples
in a trajectory share that trajectory's reward; groups are keyed by (task, agent), and the
baseline counts each trajectory once per agent (`training.trainer.step_advantages`).

Candidate reward = alpha * team reward + local reward (+ an optional TRL-style reward function).
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from agents.base import Environment, State, StepResult
from agents.tools import CALL_END, Tool, load_tool
from training import tool_turns
from training.config import RunConfig
from training.distributed import Dist
from training.generation import Generation, GenerationStats, generate
from training.policies import Policy, PolicySet, build_policies, load_policy_weights

RewardFn = Callable[..., list[float]]


class SamplerClosed(Exception):
    """An async sampler's rollout was abandoned because the run is ending (`Sampler.closing`)."""

GroupKey = tuple[Any, ...]


@dataclass
class Candidate:
    """One completion scored in its state: the `generation` (tokens, text, the sampler's log-probs,
    tool calls and segments, as the backend returned it) and what the environment and the reward
    functions made of it."""

    generation: Generation
    team: float
    local: float
    reward: float
    tool_output: str | None = None
    advantage: float = 0.0
    reward_parts: dict[str, float] = field(default_factory=dict)
    """What each reward function (`Sampler.rewards`) gave it, before its weight; a function that
    returned None or NaN for it (TRL: "does not apply") has no entry (and added 0 to its reward).
    An environment may add its own breakdown (`StepResult.info["reward_parts"]`: a task's graders),
    already counted in its team and local rewards."""
    notes: tuple[str, ...] = ()
    """Why part of its reward could not be computed (`StepResult.info["problems"]`: a grader that
    failed on it); the trainer logs them to the run."""
    next_state: State | None = field(default=None, repr=False)


@dataclass
class Turn:
    index: int
    agent: str
    role: str
    prompt: str
    prompt_ids: tuple[int, ...]
    candidates: list[Candidate]
    chosen: int
    group: GroupKey
    """The GRPO group this turn's candidates belong to."""
    policy: str = ""
    """What generated the candidates, as read at generation time ("adapter tool on ...", "shared
    model ..."): a candidate served by the wrong adapter shows here."""


@dataclass
class Episode:
    task_id: str
    row: dict[str, Any]
    turns: list[Turn]
    state: State

    @property
    def success(self) -> bool:
        return bool(self.state.success)

    @property
    def team_reward(self) -> float:
        chosen = [t.candidates[t.chosen] for t in self.turns]
        return chosen[-1].team if chosen else 0.0

    def to_dict(self, step: int) -> dict[str, Any]:
        """The JSON payload sinks receive (see training.events)."""
        return {
            "task_id": self.task_id,
            "step": step,
            "success": self.success,
            "team_reward": self.team_reward,
            "question": str(self.row.get("question") or self.row.get("prompt") or ""),
            "turns": [
                {
                    "index": t.index,
                    "agent": t.agent,
                    "role": t.role,
                    "prompt": t.prompt,
                    "policy": t.policy,
                    "chosen": t.chosen,
                    "candidates": [
                        {
                            "text": c.generation.text,
                            "reward": c.reward,
                            "team": c.team,
                            "local": c.local,
                            "advantage": c.advantage,
                            "tool_output": c.tool_output,
                            "tokens": c.generation.model_tokens,
                            "truncated": c.generation.truncated,
                            **({"calls": list(c.generation.calls), "segments": list(c.generation.segments)} if c.generation.calls else {}),
                        }
                        for c in t.candidates
                    ],
                }
                for t in self.turns
            ],
        }


class Engine(Protocol):
    """What the sampler drives instead of the HF backend (`Sampler.engine`): vLLM
    (`training.vllm_backend.VLLMGenerator`) or llama.cpp (`training.llamacpp_backend.LlamaCppGenerator`)."""

    @property
    def label(self) -> str:
        """Its name in `Turn.policy` ("... (vLLM)") and the run's log."""

    @property
    def cuda(self) -> bool:
        """Whether it generates on a GPU."""

    @property
    def evaluates(self) -> bool:
        """Whether held-out evaluation generates here too (its numbers in the trainer's dtype)."""

    @property
    def max_model_len(self) -> int | None:
        """The most tokens (prompt and completion) it holds per sequence, where it sets a limit of its own."""

    def generate(self, policy: Policy, prompts: list[list[int]], *, n: int, max_new_tokens: int, temperature: float,
                 top_p: float = 1.0, seed: int | None = None, stats: GenerationStats | None = None,
                 stop: re.Pattern[str] | None = None, stop_check_every: int = 4) -> list[list[Generation]]: ...

    def weights_changed(self, policy: Policy | None = None) -> None: ...

    def sleep(self) -> None: ...

    def close(self) -> None: ...


@dataclass
class Sampler:
    """What a rollout needs besides the tasks: the world, the policies and the knobs."""

    env: Environment
    policies: PolicySet
    config: RunConfig
    generator: torch.Generator
    rewards: Sequence[tuple[str, RewardFn, float]] = ()
    """(name, TRL-style reward function, weight): each candidate's local reward gains their weighted sum."""
    stats: GenerationStats = field(default_factory=GenerationStats)
    engine: Engine | None = None
    """The engine that generates instead of the HF backend (vLLM or llama.cpp), else None."""
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(max_workers=4))
    dist: Dist = field(default_factory=Dist)
    """This process's place in a data-parallel launch (`training.distributed`); one process by default."""
    served: dict[str, str] = field(default_factory=dict)
    """Agent -> what generated its last sample (`Turn.policy`)."""
    logprobs: bool = False
    """Keep the HF backend's log-prob of each sampled token (`generate(logprobs=True)`): the
    sampler of `generation.async` samples with weights that lag the trainer's."""
    closing: threading.Event | None = None
    """Set, the next generation raises `SamplerClosed` (an async sampler asked to stop)."""
    placement: Any = None
    """A `training.placement.Placement` when the agents' models live on rank groups: generation
    then goes to the rank that holds the agent's model."""

    def roles(self) -> tuple[str, ...]:
        order = self.config.topology.order()
        return tuple(dict.fromkeys(self.config.agent(n).role for n in order))

    def messages(self, agent: str, state: State) -> list[dict[str, Any]]:
        """An agent's chat: its role instructions, then what it observes (with its tools described
        in the system prompt when its chat template cannot render them, see `training.tool_turns`)."""
        acfg = self.config.agent(agent)
        instructions = acfg.instructions or getattr(self.env, "default_instructions", {}).get(acfg.role, "")
        messages = []
        if instructions:
            messages.append({"role": "system", "content": instructions})
        messages.append({"role": "user", "content": self.env.observe(state, acfg.role)})
        tools = self.tools(agent)
        if tools:
            messages = tool_turns.messages_with_tools(messages, tools, supported=self.tool_support(agent))
        return messages

    def prompt(self, agent: str, state: State) -> tuple[str, tuple[int, ...]]:
        """Chat-formatted prompt for an agent (`messages`), as text and token ids."""
        tok = self.policies.for_agent(agent).tokenizer
        text = tool_turns.render(tok, self.messages(agent, state), self.tools(agent), supported=self.tool_support(agent),
                                 generation_prompt=True)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        return text, tuple(ids)

    def tools(self, agent: str) -> list[Tool]:
        return [load_tool(name) for name in self.config.agent(agent).tools]

    def tool_support(self, agent: str) -> bool:
        return tool_turns.tool_support(self.policies.for_agent(agent).tokenizer)

    def act(self, agent: str, states: Sequence[State], prompt_ids: Sequence[tuple[int, ...]], n: int,
            temperature: float) -> list[list[Generation]]:
        """`n` candidate actions for each state (its prompt given as `prompt_ids`): plain samples,
        or, for an agent with tools, turns in which it calls them (`training.tool_turns`)."""
        tools = self.tools(agent)
        if not tools or self.config.generation.max_tool_calls == 0:
            return self.sample(agent, prompt_ids, n, temperature)
        policy = self.policies.for_agent(agent)
        vocab = policy.tokenizer.get_vocab()
        ends = [int(vocab[t]) for t in ("<|im_end|>", "<|eot_id|>", "<|end|>") if t in vocab]
        end_ids = {*ends, *([policy.tokenizer.eos_token_id] if policy.tokenizer.eos_token_id is not None else [])}
        return tool_turns.tool_turn(
            lambda ids, k: self.sample(agent, ids, k, temperature, tool_calls=True), policy.tokenizer,
            [(ids, self.messages(agent, s)) for ids, s in zip(prompt_ids, states)], n, tools,
            max_calls=self.config.generation.max_tool_calls, supported=self.tool_support(agent), end_ids=sorted(end_ids),
            run=lambda calls: list(self.pool.map(lambda call: call(), calls)),
            room=self.context_length(agent) - (self.config.agent(agent).max_new_tokens or self.config.generation.max_new_tokens),
        )

    def context_length(self, agent: str) -> int:
        """The most tokens (prompt and completion) the agent's model takes: its tokenizer's
        `model_max_length` (from the model's config), or vLLM's `max_model_len` where set lower."""
        limit = getattr(self.policies.for_agent(agent).tokenizer, "model_max_length", None)
        limits = [int(limit)] if isinstance(limit, int) and 0 < limit < 10**9 else []  # 1e30: "unbounded"
        if self.engine is not None and self.engine.max_model_len:
            limits.append(self.engine.max_model_len)
        return min(limits, default=10**9)

    def stop_pattern(self, role: str, *, tool_calls: bool = False) -> re.Pattern[str] | None:
        """The environment's optional end-of-action pattern for a role (`stop_patterns`); none when
        `generation.stop_patterns` is off. With `tool_calls`, a closed tool call ends a segment too
        (its result comes next)."""
        pattern = getattr(self.env, "stop_patterns", {}).get(role) if self.config.generation.stop_patterns else None
        if tool_calls:
            pattern = f"(?:{pattern})|{re.escape(CALL_END)}" if pattern else re.escape(CALL_END)
        return re.compile(pattern, re.DOTALL) if pattern else None

    def sample(self, agent: str, prompt_ids: Sequence[tuple[int, ...]], n: int, temperature: float, *,
               tool_calls: bool = False, generator: torch.Generator | None = None) -> list[list[Generation]]:
        """`n` completions per prompt from the agent's policy. `generator`: sample with it, here
        (a placement's rank answering another's request), instead of this sampler's own."""
        if self.placement is not None and generator is None:
            return self.placement.generate(self, agent, prompt_ids, n, temperature, tool_calls)  # type: ignore[no-any-return]
        acfg = self.config.agent(agent)
        policy = self.policies.for_agent(agent)
        gen = self.config.generation
        if self.closing is not None and self.closing.is_set():
            raise SamplerClosed("the sampler was closed")
        if self.engine is not None:
            seed = int(torch.randint(0, 2**31 - 1, (1,), generator=self.generator))
            self.served[agent] = self._served_by(agent, policy.adapter) + f" ({self.engine.label})"
            return self.engine.generate(
                policy, [list(p) for p in prompt_ids], n=n, max_new_tokens=acfg.max_new_tokens or gen.max_new_tokens,
                temperature=temperature, top_p=gen.top_p, seed=seed, stats=self.stats, stop=self.stop_pattern(acfg.role, tool_calls=tool_calls),
            )
        with policy.active() as model:
            active = getattr(model, "active_adapter", None) if policy.adapter is not None else None  # what PEFT will run
            self.served[agent] = self._served_by(agent, active if isinstance(active, str) else policy.adapter)
            return generate(
                model,
                policy.tokenizer,
                [list(p) for p in prompt_ids],
                n=n,
                max_new_tokens=acfg.max_new_tokens or gen.max_new_tokens,
                temperature=temperature,
                top_p=gen.top_p,
                generator=generator or self.generator,
                stats=self.stats,
                stop=self.stop_pattern(acfg.role, tool_calls=tool_calls),
                logprobs=self.logprobs,
            )

    def _served_by(self, agent: str, adapter: str | None) -> str:
        if adapter is not None:
            return f"adapter {adapter} on {self.config.model.source}"
        policy = self.policies.for_agent(agent)
        return f"{'shared' if policy.name == 'shared' else policy.name} model {self.config.agent_model(self.config.agent(agent))}"

    def train_temperature(self, agent: str) -> float:
        t = self.config.agent(agent).temperature
        return self.config.generation.temperature if t is None else t

    def score(self, state: State, agent: str, prompt: str, generations: list[Generation]) -> list[Candidate]:
        """Apply each generation to the same state (pure steps, run in parallel) and score it."""
        role = self.config.agent(agent).role
        step_many = getattr(self.env, "step_many", None)  # an environment that grades a group at once (agents.envs.task)
        results: list[StepResult] = (
            list(step_many(state, agent=agent, role=role, actions=[g.text for g in generations])) if step_many is not None
            else list(self.pool.map(lambda g: self.env.step(state, agent=agent, role=role, action=g.text), generations))
        )
        if len(results) != len(generations):
            raise ValueError(f"the environment's step_many returned {len(results)} results for {len(generations)} actions")
        parts: list[dict[str, float]] = [dict(r.info.get("reward_parts") or {}) for r in results]  # the environment's own breakdown
        columns = {k: [v] * len(generations) for k, v in state.row.items()}
        for name, fn, _ in self.rewards:
            values = list(fn(prompts=[prompt] * len(generations), completions=[g.text for g in generations], **columns))
            if len(values) != len(generations):
                raise ValueError(f"reward function {name} returned {len(values)} rewards for {len(generations)} completions")
            for part, value in zip(parts, values):  # None (TRL: "does not apply here") and NaN: no part, 0 in the sum
                if value is not None and math.isfinite(float(value)):
                    part[name] = float(value)
        extra = [sum(w * part.get(name, 0.0) for name, _, w in self.rewards) for part in parts]
        alpha = self.config.grpo.alpha
        return [
            Candidate(
                g,
                team=r.team_reward,
                local=r.local_reward + x,
                reward=alpha * r.team_reward + r.local_reward + x,
                tool_output=r.tool_output,
                reward_parts=part,
                notes=tuple(str(p) for p in r.info.get("problems") or ()),
                next_state=r.state,
            )
            for g, r, x, part in zip(generations, results, extra, parts)
        ]


@contextmanager
def checkpoint_sampler(config: RunConfig, env: Environment, checkpoint: str | Path | None, *, seed: int | None = None) -> Iterator[Sampler]:
    """A sampler acting with the weights saved in `checkpoint` (None: the base models), drawing
    from a generator of its own seeded with `seed` (the config's seed unless given); its pool is
    shut down on the way out. Evaluations of a checkpoint, ablations, the playground's lanes and
    the benchmarks act with saved weights through it."""
    policies = build_policies(config)
    if checkpoint is not None:
        load_policy_weights(policies, Path(checkpoint))
    sampler = Sampler(env, policies, config, torch.Generator().manual_seed(config.seed if seed is None else seed))
    try:
        yield sampler
    finally:
        sampler.pool.shutdown()


def start_episodes(sampler: Sampler, tasks: Sequence[tuple[str, dict[str, Any]]]) -> list[Episode]:
    roles = sampler.roles()
    return [Episode(tid, row, [], sampler.env.reset(row, task_id=tid, roles=roles)) for tid, row in tasks]


def rollout_tree(sampler: Sampler, tasks: Sequence[tuple[str, dict[str, Any]]]) -> list[Episode]:
    """AT-GRPO tree sampling over a batch of (task_id, row) pairs."""
    cfg = sampler.config
    order = cfg.topology.order()
    episodes = start_episodes(sampler, tasks)
    for turn in range(cfg.topology.max_turns):
        agent = order[turn % len(order)]
        active = [ep for ep in episodes if not ep.state.done]
        if not active:
            break
        prompts = [sampler.prompt(agent, ep.state) for ep in active]
        groups = sampler.act(agent, [ep.state for ep in active], [ids for _, ids in prompts], cfg.grpo.k, sampler.train_temperature(agent))
        for ep, (text, ids), gens in zip(active, prompts, groups):
            cands = sampler.score(ep.state, agent, text, gens)
            best = max(range(len(cands)), key=lambda i: cands[i].reward)  # ties: first sampled
            ep.turns.append(Turn(turn, agent, cfg.agent(agent).role, text, ids, cands, best, (ep.task_id, turn, agent),
                                 sampler.served.get(agent, "")))
            next_state = cands[best].next_state
            assert next_state is not None
            ep.state = next_state
    return episodes


def rollout_independent(
    sampler: Sampler, tasks: Sequence[tuple[str, dict[str, Any]]], *, k: int, temperature: float | None = None,
    on_turn: Callable[[int, int], None] | None = None,
) -> list[Episode]:
    """K independent trajectories per task (plain GRPO; K=1 at eval temperature for evaluation).

    Each turn samples one action per trajectory. Trajectories of one task share their first
    prompt, so turn 0 is generated as n=k samples of each distinct prompt. `on_turn(turns, finished)`
    is called after each turn with the trajectories finished so far (an evaluation's progress).
    """
    cfg = sampler.config
    order = cfg.topology.order()
    episodes = start_episodes(sampler, [task for task in tasks for _ in range(k)])
    for turn in range(cfg.topology.max_turns):
        agent = order[turn % len(order)]
        active = [ep for ep in episodes if not ep.state.done]
        if not active:
            break
        temp = sampler.train_temperature(agent) if temperature is None else temperature
        prompts = [sampler.prompt(agent, ep.state) for ep in active]
        if turn == 0 and k > 1:
            firsts = prompts[::k]
            gens = [g for group in sampler.act(agent, [ep.state for ep in active[::k]], [ids for _, ids in firsts], k, temp) for g in group]
        else:
            gens = [group[0] for group in sampler.act(agent, [ep.state for ep in active], [ids for _, ids in prompts], 1, temp)]
        for ep, (text, ids), g in zip(active, prompts, gens):
            (cand,) = sampler.score(ep.state, agent, text, [g])
            ep.turns.append(Turn(turn, agent, cfg.agent(agent).role, text, ids, [cand], 0, (ep.task_id, agent), sampler.served.get(agent, "")))
            assert cand.next_state is not None
            ep.state = cand.next_state
        if on_turn is not None:
            on_turn(turn + 1, sum(ep.state.done for ep in episodes))
    # plain GRPO credit: each agent's samples in a trajectory share alpha * final team + its locals
    alpha = cfg.grpo.alpha
    for ep in episodes:
        final_team = ep.turns[-1].candidates[0].team if ep.turns else 0.0
        for agent in {t.agent for t in ep.turns}:
            mine = [t.candidates[0] for t in ep.turns if t.agent == agent]
            ret = alpha * final_team + sum(c.local for c in mine)
            for c in mine:
                c.reward = ret
    return episodes

"""The playground: a team plays one task someone typed, turn by turn, in one or more lanes side by
side (a checkpoint's trained agents, the base models), so the lanes can be compared on the same
task. Each turn samples one action (tool calls included) from the acting agent at the given
temperature and lets the environment score it and move on; nothing is trained.

A lane is a plain dict, as the web stores it in its job row and the CLI prints it:
`{"label", "trained", "turns": [...], "done", "success"}`. `play` fills the lanes in place and
calls `on_turn` after every turn, so a caller can save or print the transcript as it grows.
Called by the web's playground job (`webapp.jobs.services.playground_execute`) and by
`python -m training playground`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from training.config import RunConfig

Lane = dict[str, Any]


def lane(label: str, *, trained: bool) -> Lane:
    """An empty lane: the checkpoint's agents (`trained`) or the base models."""
    return {"label": label, "trained": trained, "turns": [], "done": False, "success": None}


def play(
    config: RunConfig, row: dict[str, Any], *, lanes: list[Lane], checkpoint: str | Path | None = None,
    temperature: float = 0.0, max_new_tokens: int | None = None, on_turn: Callable[[list[Lane]], None] | None = None,
) -> list[Lane]:
    """Play the task `row` (a dataset row of the config's environment) in every lane for up to
    `topology.max_turns` turns: a lane whose `trained` is true loads the weights of `checkpoint`,
    the others the weights a run of `config` starts from (its warm start, `model.init_from`, else
    the base models). Every lane's turn is appended to its `turns` as it is played,
    then `on_turn(lanes)`; at the end every lane is `done` with the episode's `success`. A row
    without a field the environment requires is a ValueError naming it."""
    from agents.envs import load_environment
    from training.evaluation import starting_sampler
    from training.rollout import start_episodes

    if max_new_tokens:
        config = config.replace(**{"generation.max_new_tokens": int(max_new_tokens)})
    env = load_environment(config.topology.environment, **config.topology.env_args)
    missing = [f for f in env.required_fields if f not in row]
    if missing:
        raise ValueError(f"{env.name} tasks need the field(s) {', '.join(missing)}")
    samplers, episodes = [], []
    with contextlib.ExitStack() as stack:
        for each in lanes:
            sampler = stack.enter_context(starting_sampler(config, env, checkpoint if each["trained"] else None))
            samplers.append(sampler)
            (episode,) = start_episodes(sampler, [("playground", row)])
            episodes.append(episode)
        order = config.topology.order()
        for turn in range(config.topology.max_turns):
            agent = order[turn % len(order)]
            for each, sampler, episode in zip(lanes, samplers, episodes):
                if episode.state.done:
                    continue
                text, ids = sampler.prompt(agent, episode.state)
                ((generation,),) = sampler.act(agent, [episode.state], [ids], 1, temperature)  # tool calls included
                (candidate,) = sampler.score(episode.state, agent, text, [generation])
                assert candidate.next_state is not None
                episode.state = candidate.next_state
                each["turns"].append({
                    "index": turn, "agent": agent, "role": config.agent(agent).role, "prompt": text,
                    "text": candidate.generation.text, "tool_output": candidate.tool_output, "local": candidate.local,
                    "team": candidate.team, "tokens": candidate.generation.model_tokens, "truncated": candidate.generation.truncated,
                    "calls": list(candidate.generation.calls), "segments": list(candidate.generation.segments),
                    "policy": sampler.served.get(agent, "") if each["trained"] else base_label(config, agent),
                })
                each["done"], each["success"] = episode.state.done, episode.state.success
                if on_turn is not None:
                    on_turn(lanes)
    for each, episode in zip(lanes, episodes):
        each["done"], each["success"] = True, episode.state.success
    return lanes


def untrained_label(config: RunConfig) -> str:
    """An untrained lane's name: `base models`, or `warm start` when the run starts from one."""
    return "warm start" if config.model.init_from.run else "base models"


def base_label(config: RunConfig, agent: str) -> str:
    """What plays `agent` in an untrained lane: the run's warm start (`model.init_from`) when it
    has one, else its base model. (A `lora` lane's fresh adapters start with B = 0, so they add
    nothing to the base; naming them would read like a trained one.)"""
    init = config.model.init_from
    if init.run:
        return f"warm start {init.run}" + (f" (step {init.step})" if init.step else "")
    return f"base model {config.agent_model(config.agent(agent))}"

